// RUN: attnfuse-opt %S/../../../examples/llama3_1.attn | filecheck %s
// RUN: attnfuse-opt %S/../../../examples/llama3_1.attn --print-op-generic | attnfuse-opt | filecheck %s

// examples/llama3_1.attn prints back in its custom form, directly and through the generic form.

// CHECK:      func.func @llama3_1(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
// CHECK-NEXT:   %qr = attn.rope %q {theta = 500000.0, scaling = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 8192} : tensor<?x32x?x128xbf16>
// CHECK-NEXT:   %kr = attn.rope %k {theta = 500000.0, scaling = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 8192} : tensor<?x8x?x128xbf16>
// CHECK-NEXT:   %s = attn.scores %qr, %kr : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
// CHECK-NEXT:   %m = attn.mask causal %s : !attn.scores<?x32x?x?xf32>
// CHECK-NEXT:   %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
// CHECK-NEXT:   %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
// CHECK-NEXT:   func.return %o : tensor<?x32x?x128xbf16>
// CHECK-NEXT: }
