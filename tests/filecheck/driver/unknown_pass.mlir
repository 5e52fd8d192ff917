// Pipeline errors name the problem and exit 1.
// RUN: not attnfuse-opt %s -p canonicalise 2>&1 | filecheck %s
// RUN: not attnfuse-opt %s -p 'cse{' 2>&1 | filecheck %s --check-prefix=SYNTAX
// RUN: not attnfuse-opt %s -p 'cse{frob=1}' 2>&1 | filecheck %s --check-prefix=OPTION

func.func @f() {
  func.return
}

// CHECK: attnfuse-opt: error: unknown pass 'canonicalise'; did you mean 'canonicalize'
// SYNTAX: attnfuse-opt: error: invalid pass pipeline: Expected argument name here
// SYNTAX-NEXT: cse{
// SYNTAX-NEXT: ^
// OPTION: attnfuse-opt: error: invalid options for pass 'cse': Provided arguments ["frob"] not found
