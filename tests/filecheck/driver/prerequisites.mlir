// Declared prerequisites (`requires`) are checked before anything runs.
// RUN: attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-tag-funcs,test-requires-tag | filecheck %s --check-prefix=OK
// RUN: not attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-requires-tag 2>&1 | filecheck %s --check-prefix=MISSING
// RUN: not attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-requires-tag,test-tag-funcs 2>&1 | filecheck %s --check-prefix=LATE
// RUN: not attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-tag-funcs,test-untag,test-requires-tag 2>&1 | filecheck %s --check-prefix=INVALIDATED
// RUN: not attnfuse-opt %s --pass-plugin %S/Inputs/plugin_passes.py -p test-cycle-a 2>&1 | filecheck %s --check-prefix=CYCLE

func.func @f() {
  func.return
}

// OK: func.func @f() attributes {tagged, checked}
// MISSING: attnfuse-opt: error: pass 'test-requires-tag' requires 'test-tag-funcs' to run earlier in the pipeline, but it is not in the pipeline; try -p 'test-tag-funcs,test-requires-tag'
// LATE: attnfuse-opt: error: pass 'test-requires-tag' requires 'test-tag-funcs' to run earlier in the pipeline, but it is scheduled after it; try -p 'test-tag-funcs,test-requires-tag'
// INVALIDATED: attnfuse-opt: error: pass 'test-requires-tag' requires 'test-tag-funcs' to run earlier in the pipeline, but its effect is invalidated by 'test-untag'
// CYCLE: attnfuse-opt: error: pass prerequisites form a cycle: test-cycle-{{[ab]}} -> test-cycle-{{[ab]}} -> test-cycle-{{[ab]}}
