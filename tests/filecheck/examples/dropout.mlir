// RUN: attnfuse-opt %S/../../../examples/dropout.attn | filecheck %s
// RUN: attnfuse-opt %S/../../../examples/dropout.attn --print-op-generic | attnfuse-opt | filecheck %s

// examples/dropout.attn prints back in its custom form, directly and through the generic form.

// CHECK:      func.func @dropout(%q: tensor<?x12x?x64xbf16>, %k: tensor<?x12x?x64xbf16>, %v: tensor<?x12x?x64xbf16>, %seed: i64) -> tensor<?x12x?x64xbf16> {
// CHECK-NEXT:   %s = attn.scores %q, %k : tensor<?x12x?x64xbf16>, tensor<?x12x?x64xbf16> -> !attn.scores<?x12x?x?xf32>
// CHECK-NEXT:   %m = attn.mask causal %s : !attn.scores<?x12x?x?xf32>
// CHECK-NEXT:   %p = attn.softmax %m : !attn.scores<?x12x?x?xf32> -> !attn.probs<?x12x?x?xf32>
// CHECK-NEXT:   %pd = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x12x?x?xf32>, i64
// CHECK-NEXT:   %o = attn.weighted_sum %pd, %v : !attn.probs<?x12x?x?xf32>, tensor<?x12x?x64xbf16> -> tensor<?x12x?x64xbf16>
// CHECK-NEXT:   func.return %o : tensor<?x12x?x64xbf16>
// CHECK-NEXT: }
