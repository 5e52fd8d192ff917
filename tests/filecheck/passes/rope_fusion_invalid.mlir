// rope-fusion rejects a pre-kernel transform that would have to run after one placed
// in the kernel (pre-kernels run before the attention kernel).
// RUN: not attnfuse-opt %s -p 'rope-fusion{strategy=fused}' 2>&1 | filecheck %s

// CHECK: a transform placed in a pre-kernel cannot follow one placed in the kernel
func.func @order(%q: tensor<?x8x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x8x?x64xf16> {
  %qn = attn.qk_norm %q : tensor<?x8x?x64xf16>
  %qr = attn.rope %qn {placement = "prekernel"} : tensor<?x8x?x64xf16>
  %s = attn.scores %qr, %k : tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x8x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x8x?x64xf16>
  func.return %o : tensor<?x8x?x64xf16>
}
