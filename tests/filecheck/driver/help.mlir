// `--help` lists AttnFuse's passes with their one-line summaries and our flags;
// with --pass-plugin it lists the plugin's passes too.
// RUN: attnfuse-opt --help | filecheck %s
// RUN: attnfuse-opt --pass-plugin %S/Inputs/plugin_passes.py --help | filecheck %s --check-prefix=PLUGIN
// RUN: attnfuse-opt --pass-plugin %S/Inputs/plugin_passes.py --list-passes | filecheck %s --check-prefix=LIST

// CHECK: usage: attnfuse-opt
// CHECK-DAG: --print-ir-after-all
// CHECK-DAG: --device NAME
// CHECK-DAG: --pass-plugin FILE_OR_MODULE
// CHECK: AttnFuse passes:
// CHECK-NEXT: attn-canonicalize
// CHECK-NEXT: rope-fusion {{ +}}Place RoPE
// CHECK-NEXT: online-softmax {{ +}}Rewrite softmax
// CHECK-NEXT: mask-tiling {{ +}}{{[A-Z]}}
// CHECK: lower-to-tile {{ +}}{{[A-Z]}}
// CHECK: Default pipeline for -t triton: attn-canonicalize,rope-fusion{strategy=auto},online-softmax,mask-tiling,{{.*}}lower-to-tile

// PLUGIN: Plugin and user passes:
// PLUGIN: test-requires-tag {{ +}}Check that test-tag-funcs ran (declares it as a prerequisite).
// PLUGIN: test-tag-funcs {{ +}}Tag every func.func with a unit attribute.

// LIST: AttnFuse passes:
// LIST: Plugin and user passes:
// LIST: test-tag-funcs
// LIST: xDSL passes:
// LIST: canonicalize {{ +}}Applies all canonicalization patterns.
