// RUN: ATTNFUSE_ROUNDTRIP

func.func @f(%a: i32, %x: f32) -> f32 {
  %c = arith.addi %a, %a : i32
  %y = arith.mulf %x, %x : f32
  func.return %y : f32
}

// CHECK:      func.func @f(%a: i32, %x: f32) -> f32 {
// CHECK-NEXT:   %c = arith.addi %a, %a : i32
// CHECK-NEXT:   %y = arith.mulf %x, %x : f32
// CHECK-NEXT:   func.return %y : f32
