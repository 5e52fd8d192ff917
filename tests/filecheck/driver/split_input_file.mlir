// Each `// -----` chunk is parsed, transformed and printed on its own.
// RUN: attnfuse-opt %s --split-input-file -p cse | filecheck %s

func.func @one(%a: i32) -> i32 {
  %b = arith.addi %a, %a : i32
  %c = arith.addi %a, %a : i32
  %d = arith.muli %b, %c : i32
  func.return %d : i32
}

// -----

func.func @two() -> i64 {
  %z = arith.constant 7 : i64
  func.return %z : i64
}

// CHECK:      func.func @one(%a: i32) -> i32 {
// CHECK-NEXT:   %b = arith.addi %a, %a : i32
// CHECK-NEXT:   %d = arith.muli %b, %b : i32
// CHECK:      // -----
// CHECK:      func.func @two() -> i64 {
// CHECK-NEXT:   %z = arith.constant 7 : i64
