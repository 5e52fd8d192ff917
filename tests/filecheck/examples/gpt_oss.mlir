// RUN: attnfuse-opt %S/../../../examples/gpt_oss.attn | filecheck %s
// RUN: attnfuse-opt %S/../../../examples/gpt_oss.attn --print-op-generic | attnfuse-opt | filecheck %s

// examples/gpt_oss.attn prints back in its custom form, directly and through the generic form.

// CHECK:      func.func @gpt_oss(%q: tensor<?x64x?x64xbf16>, %k: tensor<?x8x?x64xbf16>, %v: tensor<?x8x?x64xbf16>, %sinks: tensor<64xf32>) -> tensor<?x64x?x64xbf16> {
// CHECK-NEXT:   %qr = attn.rope %q {theta = 150000.0, scaling = "yarn", factor = 32.0, original_max_position = 4096, beta_fast = 32.0, beta_slow = 1.0, truncate = 0} : tensor<?x64x?x64xbf16>
// CHECK-NEXT:   %kr = attn.rope %k {theta = 150000.0, scaling = "yarn", factor = 32.0, original_max_position = 4096, beta_fast = 32.0, beta_slow = 1.0, truncate = 0} : tensor<?x8x?x64xbf16>
// CHECK-NEXT:   %s = attn.scores %qr, %kr : tensor<?x64x?x64xbf16>, tensor<?x8x?x64xbf16> -> !attn.scores<?x64x?x?xf32>
// CHECK-NEXT:   %c = attn.mask causal %s : !attn.scores<?x64x?x?xf32>
// CHECK-NEXT:   %w = attn.mask sliding_window %c {left = 127} : !attn.scores<?x64x?x?xf32>
// CHECK-NEXT:   %p = attn.softmax %w sinks %sinks : !attn.scores<?x64x?x?xf32>, tensor<64xf32> -> !attn.probs<?x64x?x?xf32>
// CHECK-NEXT:   %o = attn.weighted_sum %p, %v : !attn.probs<?x64x?x?xf32>, tensor<?x8x?x64xbf16> -> tensor<?x64x?x64xbf16>
// CHECK-NEXT:   func.return %o : tensor<?x64x?x64xbf16>
// CHECK-NEXT: }
