// RUN: attnfuse-opt %S/../../../examples/alibi.attn | filecheck %s
// RUN: attnfuse-opt %S/../../../examples/alibi.attn --print-op-generic | attnfuse-opt | filecheck %s

// examples/alibi.attn prints back in its custom form, directly and through the generic form.

// CHECK:      func.func @alibi(%q: tensor<?x16x?x64xf16>, %k: tensor<?x16x?x64xf16>, %v: tensor<?x16x?x64xf16>) -> tensor<?x16x?x64xf16> {
// CHECK-NEXT:   %s = attn.scores %q, %k : tensor<?x16x?x64xf16>, tensor<?x16x?x64xf16> -> !attn.scores<?x16x?x?xf32>
// CHECK-NEXT:   %b = attn.bias alibi %s : !attn.scores<?x16x?x?xf32>
// CHECK-NEXT:   %m = attn.mask causal %b : !attn.scores<?x16x?x?xf32>
// CHECK-NEXT:   %p = attn.softmax %m : !attn.scores<?x16x?x?xf32> -> !attn.probs<?x16x?x?xf32>
// CHECK-NEXT:   %o = attn.weighted_sum %p, %v : !attn.probs<?x16x?x?xf32>, tensor<?x16x?x64xf16> -> tensor<?x16x?x64xf16>
// CHECK-NEXT:   func.return %o : tensor<?x16x?x64xf16>
// CHECK-NEXT: }
