"""The small causal program the run-time tests compile (f32, 2 heads, head dim 32)."""

TINY = """
func.func @tiny(%q: tensor<?x2x?x32xf32>, %k: tensor<?x2x?x32xf32>, %v: tensor<?x2x?x32xf32>) -> tensor<?x2x?x32xf32> {
  %s = attn.scores %q, %k : tensor<?x2x?x32xf32>, tensor<?x2x?x32xf32> -> !attn.scores<?x2x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x2x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x2x?x?xf32> -> !attn.probs<?x2x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x2x?x?xf32>, tensor<?x2x?x32xf32> -> tensor<?x2x?x32xf32>
  func.return %o : tensor<?x2x?x32xf32>
}
"""
