// The module is verified after every pass; an error names the pass that broke it
// and points at the op (or, for ops the pass created, its enclosing op).
// RUN: not attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-break-ir 2>&1 | filecheck %s
// RUN: not attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p 'test-break-ir{mode="insert"}' 2>&1 | filecheck %s --check-prefix=NEW
// RUN: not attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-reject 2>&1 | filecheck %s --check-prefix=REJECT
// RUN: not attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-crash 2>&1 | filecheck %s --check-prefix=CRASH

func.func @f(%a: i32) -> i32 {
  %c = arith.addi %a, %a : i32
  func.return %c : i32
}

// CHECK: verify_each_pass.mlir:10:3: error: 'func.return' op Expected arguments to have the same types as the function output types: expected [i64], got [i32]
// CHECK-NEXT: func.return %c : i32
// CHECK-NEXT: ^~~~~~~~~~~
// CHECK-NEXT: note: the IR is invalid after pass 'test-break-ir'

// NEW: verify_each_pass.mlir:8:1: error: 'arith.addi' op operand 'rhs' at position 1 does not verify
// NEW: note: 'arith.addi' has no source location (created by a pass?); reported at its enclosing 'func.func'
// NEW-NEXT: note: the IR is invalid after pass 'test-break-ir'

// REJECT: verify_each_pass.mlir:9:8: error: 'arith.addi' op rejected by test-reject
// REJECT: note: in pass 'test-reject'

// CRASH: verify_each_pass.mlir: error: pass 'test-crash' crashed: RuntimeError: boom
// CRASH-NEXT: note: this is a bug in AttnFuse or a plugin; set ATTNFUSE_TRACEBACK=1 for the Python traceback
// CRASH-NOT: Traceback
