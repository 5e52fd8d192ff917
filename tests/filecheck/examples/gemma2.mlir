// RUN: attnfuse-opt %S/../../../examples/gemma2.attn | filecheck %s
// RUN: attnfuse-opt %S/../../../examples/gemma2.attn --print-op-generic | attnfuse-opt | filecheck %s

// examples/gemma2.attn prints back in its custom form, directly and through the generic form.

// CHECK:      func.func @gemma2(%q: tensor<?x16x?x256xbf16>, %k: tensor<?x8x?x256xbf16>, %v: tensor<?x8x?x256xbf16>) -> tensor<?x16x?x256xbf16> {
// CHECK-NEXT:   %qr = attn.rope %q {theta = 10000.0} : tensor<?x16x?x256xbf16>
// CHECK-NEXT:   %kr = attn.rope %k {theta = 10000.0} : tensor<?x8x?x256xbf16>
// CHECK-NEXT:   %s = attn.scores %qr, %kr {scale = 0.0625} : tensor<?x16x?x256xbf16>, tensor<?x8x?x256xbf16> -> !attn.scores<?x16x?x?xf32>
// CHECK-NEXT:   %c = attn.softcap %s {cap = 50.0} : !attn.scores<?x16x?x?xf32>
// CHECK-NEXT:   %m = attn.mask causal %c : !attn.scores<?x16x?x?xf32>
// CHECK-NEXT:   %w = attn.mask sliding_window %m {left = 4095} : !attn.scores<?x16x?x?xf32>
// CHECK-NEXT:   %p = attn.softmax %w : !attn.scores<?x16x?x?xf32> -> !attn.probs<?x16x?x?xf32>
// CHECK-NEXT:   %o = attn.weighted_sum %p, %v : !attn.probs<?x16x?x?xf32>, tensor<?x8x?x256xbf16> -> tensor<?x16x?x256xbf16>
// CHECK-NEXT:   func.return %o : tensor<?x16x?x256xbf16>
// CHECK-NEXT: }
