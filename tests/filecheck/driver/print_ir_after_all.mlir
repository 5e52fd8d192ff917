// --print-ir-after-all dumps the module to stderr after every pass, like mlir-opt.
// RUN: attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p 'test-tag-funcs,test-requires-tag' --print-ir-after-all 2>&1 >/dev/null | filecheck %s

func.func @f(%a: i32) -> i32 {
  func.return %a : i32
}

// CHECK:      // -----// IR Dump After test-tag-funcs //----- //
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   func.func @f(%a: i32) -> i32 attributes {tagged} {
// CHECK:      // -----// IR Dump After test-requires-tag //----- //
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   func.func @f(%a: i32) -> i32 attributes {tagged, checked} {
