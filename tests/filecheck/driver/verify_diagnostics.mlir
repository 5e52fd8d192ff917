// --verify-diagnostics checks every diagnostic against the expected-* annotations (MLIR's
// semantics): both must match one for one, else the run fails. Valid chunks still print.
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
  // expected-error @+1 {{'arith.addi' op operand 'rhs' at position 1 does not verify}}
  %c = "arith.addi"(%a, %b) : (i32, i64) -> i32
  func.return %c : i32
}
// ERR: verify_diagnostics.mlir:17:8: error: 'arith.addi' op operand 'rhs' at position 1 does not verify: attribute i32 expected from variable 'T', but got i64
// ERR-NEXT: %c = "arith.addi"(%a, %b) : (i32, i64) -> i32
// ERR-NEXT: ^~~~~~~~~~~~

// -----

func.func @ret(%a: i32) -> i64 {
  func.return %a : i32  // expected-error {{'func.return' op Expected arguments to have the same types}}
}
// ERR: verify_diagnostics.mlir:27:3: error: 'func.return' op Expected arguments

// -----

// @below and @above skip the lines that hold annotations; a note without a location of
// its own is at its error's line.
func.func @f() {
  func.return
}
// expected-error @below {{redefinition of symbol named 'f'}}
// expected-note-re @below {{see existing symbol definition here ({{.*}}verify_diagnostics.mlir:35:1)}}
func.func @f() {
  func.return
}
// ERR: verify_diagnostics.mlir:40:1: error: 'func.func' op redefinition of symbol named 'f'

// -----

func.func @use_before_def(%a: i32) -> i32 {
  %b = arith.addi %c, %a : i32
  // expected-error @above {{'arith.addi' op operand #0 (%c) does not dominate this use}}
  // expected-note-re @-2 {{operand defined here ({{.*}}verify_diagnostics.mlir:51:8)}}
  %c = arith.addi %a, %a : i32
  func.return %b : i32
}

// -----

// Parse errors are diagnostics too.
func.func @syntax(%a: i32) -> i32 {
  %c = arith.addi %a %a : i32  // expected-error {{Expected ','}}
  func.return %c : i32
}
