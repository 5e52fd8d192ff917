// --device fills the unset `target` option of passes (canonical name), --seq-len `seq_len`.
// RUN: attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-target --device H100_SXM --seq-len 512 | filecheck %s
// RUN: attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p 'test-target{target="a100"}' --device h200 | filecheck %s --check-prefix=EXPLICIT
// RUN: attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-target | filecheck %s --check-prefix=NONE
// RUN: not attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-target --device no-such-gpu 2>&1 | filecheck %s --check-prefix=UNKNOWN

func.func @f() {
  func.return
}

// CHECK: builtin.module attributes {test.target = "h100-sxm", test.seq_len = "512"}
// EXPLICIT: builtin.module attributes {test.target = "a100", test.seq_len = "0"}
// NONE: builtin.module attributes {test.target = "none", test.seq_len = "0"}
// UNKNOWN: attnfuse-opt: error: unknown target 'no-such-gpu'; known targets: a100, b200, h100-sxm, h200, l4, l40s, mi300x, rtx3090, rtx4090
