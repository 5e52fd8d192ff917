// --verify-diagnostics prints each chunk's error to stdout and exits 0; the
// locations are lines of the whole file even with --split-input-file.
// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics | filecheck %s
// RUN: not attnfuse-opt %s --split-input-file 2>&1 | filecheck %s --check-prefix=ERR

func.func @ok(%a: i32) -> i32 {
  %c = arith.addi %a, %a : i32
  func.return %c : i32
}
// CHECK: func.func @ok
// CHECK: // -----

// -----

func.func @mixed(%a: i32, %b: i64) -> i32 {
  %c = "arith.addi"(%a, %b) : (i32, i64) -> i32
  func.return %c : i32
}
// CHECK: verify_diagnostics.mlir:16:8: error: 'arith.addi' op operand 'rhs' at position 1 does not verify: attribute i32 expected from variable 'T', but got i64
// CHECK-NEXT: %c = "arith.addi"(%a, %b) : (i32, i64) -> i32
// CHECK-NEXT: ^~~~~~~~~~~~
// CHECK: // -----

// -----

func.func @ret(%a: i32) -> i64 {
  func.return %a : i32
}
// CHECK: verify_diagnostics.mlir:27:3: error: 'func.return' op Expected arguments to have the same types as the function output types: expected [i64], got [i32]

// ERR: verify_diagnostics.mlir:16:8: error: 'arith.addi' op
// ERR: verify_diagnostics.mlir:27:3: error: 'func.return' op
