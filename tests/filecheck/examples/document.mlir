// RUN: attnfuse-opt %S/../../../examples/document.attn | filecheck %s
// RUN: attnfuse-opt %S/../../../examples/document.attn --print-op-generic | attnfuse-opt | filecheck %s

// examples/document.attn prints back in its custom form, directly and through the generic form.

// CHECK:      func.func @document(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>, %pos: tensor<?x?xi32>, %doc: tensor<?x?xi32>) -> tensor<?x32x?x128xbf16> {
// CHECK-NEXT:   %qr = attn.rope %q positions %pos {theta = 500000.0} : tensor<?x32x?x128xbf16>, tensor<?x?xi32>
// CHECK-NEXT:   %kr = attn.rope %k positions %pos {theta = 500000.0} : tensor<?x8x?x128xbf16>, tensor<?x?xi32>
// CHECK-NEXT:   %s = attn.scores %qr, %kr : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
// CHECK-NEXT:   %c = attn.mask causal %s : !attn.scores<?x32x?x?xf32>
// CHECK-NEXT:   %d = attn.mask document %c, %doc : !attn.scores<?x32x?x?xf32>, tensor<?x?xi32>
// CHECK-NEXT:   %p = attn.softmax %d : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
// CHECK-NEXT:   %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
// CHECK-NEXT:   func.return %o : tensor<?x32x?x128xbf16>
// CHECK-NEXT: }
