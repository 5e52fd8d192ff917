// RUN: attnfuse-opt %S/../../../examples/varlen.attn | filecheck %s
// RUN: attnfuse-opt %S/../../../examples/varlen.attn --print-op-generic | attnfuse-opt | filecheck %s

// examples/varlen.attn prints back in its custom form, directly and through the generic form
// (where attn.scores carries its two optional cu_seqlens operands as operand segments).

// CHECK:      func.func @varlen(%q: tensor<1x32x?x128xbf16>, %k: tensor<1x8x?x128xbf16>, %v: tensor<1x8x?x128xbf16>, %cu_seqlens_q: tensor<?xi32>, %cu_seqlens_k: tensor<?xi32>) -> tensor<1x32x?x128xbf16> {
// CHECK-NEXT:   %qr = attn.rope %q {theta = 500000.0} : tensor<1x32x?x128xbf16>
// CHECK-NEXT:   %kr = attn.rope %k {theta = 500000.0} : tensor<1x8x?x128xbf16>
// CHECK-NEXT:   %s = attn.scores %qr, %kr cu_seqlens_q %cu_seqlens_q cu_seqlens_k %cu_seqlens_k : tensor<1x32x?x128xbf16>, tensor<1x8x?x128xbf16>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<?x32x?x?xf32>
// CHECK-NEXT:   %m = attn.mask causal %s : !attn.scores<?x32x?x?xf32>
// CHECK-NEXT:   %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
// CHECK-NEXT:   %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<1x8x?x128xbf16> -> tensor<1x32x?x128xbf16>
// CHECK-NEXT:   func.return %o : tensor<1x32x?x128xbf16>
// CHECK-NEXT: }
