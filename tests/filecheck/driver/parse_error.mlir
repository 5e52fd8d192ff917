// A parse error is reported as file:line:col: error: <reason>, with the source line
// and a caret, on stderr, with exit code 1 and no traceback.
// RUN: not attnfuse-opt %s 2>&1 | filecheck %s --match-full-lines --strict-whitespace
// RUN: not attnfuse-opt < %s 2>&1 | filecheck %s --check-prefix=STDIN

func.func @f(%a: i32) -> i32 {
  %c = arith.addi %a %a : i32
  func.return %c : i32
}

// CHECK:{{.*}}parse_error.mlir:7:22: error: Expected ','
// CHECK-NEXT:  %c = arith.addi %a %a : i32
// CHECK-NEXT:                     ^~
// CHECK-NOT:{{.*}}Traceback{{.*}}
// STDIN: <stdin>:7:22: error: Expected ','
