// Unknown ops and undefined values are reported where they are written, not at
// the end of the input (xDSL's default).
// RUN: not attnfuse-opt %s --split-input-file 2>&1 | filecheck %s

func.func @f(%a: i32) -> i32 {
  %c = arith.addi %a, %nope : i32
  func.return %c : i32
}
// CHECK: undefined_value.mlir:6:23: error: use of undefined value %nope
// CHECK-NEXT: %c = arith.addi %a, %nope : i32
// CHECK-NEXT: {{^ +}}^~~~~{{$}}

// -----

func.func @g(%a: i32) -> i32 {
  %c = foo.bar %a : i32
  func.return %a : i32
}
// CHECK: undefined_value.mlir:16:8: error: Operation foo.bar is not registered (use --allow-unregistered-dialect to accept it)
