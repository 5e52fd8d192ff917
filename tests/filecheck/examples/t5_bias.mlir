// RUN: attnfuse-opt %S/../../../examples/t5_bias.attn | filecheck %s
// RUN: attnfuse-opt %S/../../../examples/t5_bias.attn --print-op-generic | attnfuse-opt | filecheck %s

// examples/t5_bias.attn prints back in its custom form, directly and through the generic form.

// CHECK:      func.func @t5_bias(%q: tensor<?x12x?x64xf32>, %k: tensor<?x12x?x64xf32>, %v: tensor<?x12x?x64xf32>, %bias: tensor<1x12x?x?xf32>) -> tensor<?x12x?x64xf32> {
// CHECK-NEXT:   %s = attn.scores %q, %k {scale = 1.0} : tensor<?x12x?x64xf32>, tensor<?x12x?x64xf32> -> !attn.scores<?x12x?x?xf32>
// CHECK-NEXT:   %b = attn.bias tensor %s, %bias : !attn.scores<?x12x?x?xf32>, tensor<1x12x?x?xf32>
// CHECK-NEXT:   %p = attn.softmax %b : !attn.scores<?x12x?x?xf32> -> !attn.probs<?x12x?x?xf32>
// CHECK-NEXT:   %o = attn.weighted_sum %p, %v : !attn.probs<?x12x?x?xf32>, tensor<?x12x?x64xf32> -> tensor<?x12x?x64xf32>
// CHECK-NEXT:   func.return %o : tensor<?x12x?x64xf32>
// CHECK-NEXT: }
