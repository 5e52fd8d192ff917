// --device reaches passes through current_device() and an unset `device` option.
// RUN: attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-device --device H200 | filecheck %s
// RUN: attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p 'test-device{device="a100"}' --device h200 | filecheck %s --check-prefix=EXPLICIT
// RUN: attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-device | filecheck %s --check-prefix=NONE

func.func @f() {
  func.return
}

// CHECK: builtin.module attributes {test.current_device = "h200", test.device_option = "h200"}
// EXPLICIT: builtin.module attributes {test.current_device = "h200", test.device_option = "a100"}
// NONE: builtin.module attributes {test.current_device = "none", test.device_option = "none"}
