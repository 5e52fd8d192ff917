// --verify-diagnostics fails (exit 1) on a wrong annotation and says why, located: a
// diagnostic nobody expected, an annotation no diagnostic matched, a malformed annotation.
// RUN: not attnfuse-opt %s --split-input-file --verify-diagnostics 2>&1 | filecheck %s

func.func @wrong_text(%a: i32, %b: i64) -> i32 {
  // expected-error @+1 {{this is not the message}}
  %c = "arith.addi"(%a, %b) : (i32, i64) -> i32
  func.return %c : i32
}
// CHECK: verify_diagnostics_mismatch.mlir:7:8: error: unexpected error: 'arith.addi' op operand 'rhs'
// CHECK: verify_diagnostics_mismatch.mlir:6:6: error: expected error "this is not the message" was not produced

// -----

func.func @wrong_line(%a: i32) -> i64 {
  // expected-error @above {{Expected arguments to have the same types}}
  func.return %a : i32
}
// CHECK: verify_diagnostics_mismatch.mlir:17:3: error: unexpected error: 'func.return' op Expected arguments
// CHECK: verify_diagnostics_mismatch.mlir:16:6: error: expected error "Expected arguments to have the same types" was not produced

// -----

func.func @wrong_severity(%a: i32) -> i64 {
  func.return %a : i32  // expected-warning {{Expected arguments}}
}
// CHECK: verify_diagnostics_mismatch.mlir:25:3: error: unexpected error: 'func.return'
// CHECK: verify_diagnostics_mismatch.mlir:25:28: error: expected warning "Expected arguments" was not produced

// -----

func.func @nothing_wrong(%a: i32) -> i32 {
  func.return %a : i32  // expected-error {{an error that never comes}}
}
// CHECK: verify_diagnostics_mismatch.mlir:33:28: error: expected error "an error that never comes" was not produced

// -----

func.func @malformed(%a: i32) -> i32 {
  func.return %a : i32  // expected-error @+x {{bad designator}}
}
// CHECK: verify_diagnostics_mismatch.mlir:40:28: error: malformed annotation: expected [@+N|@-N|@above|@below|@unknown] {{[{][{]}}message{{[}][}]}}

// -----

// A later chunk is still checked after the failures above.
func.func @late(%a: i32) -> i64 {
  func.return %a : i32
}
// CHECK: verify_diagnostics_mismatch.mlir:48:3: error: unexpected error: 'func.return' op
