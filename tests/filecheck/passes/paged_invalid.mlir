// Paged programs with a block the paged lowering cannot serve: errors at the op.
// RUN: not attnfuse-opt %s --split-input-file -p 'attn-canonicalize,rope-fusion,online-softmax,mask-tiling,lower-to-tile' 2>&1 | filecheck %s

// CHECK: paged_invalid.mlir:[[# @LINE + 3]]:9: error: 'attn.rope' op attn.rope on K of a paged KV cache would transform the whole cache on every call: store keys transformed (attnfuse.inference.append_paged_kv rotates them)
func.func @k_rope(%q: tensor<?x4x?x32xf16>, %kc: tensor<?x2x8x32xf16>, %vc: tensor<?x2x8x32xf16>,
                  %bt: tensor<?x?xi32>, %lens: tensor<?xi32>) -> tensor<?x4x?x32xf16> {
  %kr = attn.rope %kc : tensor<?x2x8x32xf16>
  %s = attn.scores %q, %kr block_table %bt kv_lens %lens : tensor<?x4x?x32xf16>, tensor<?x2x8x32xf16>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %vc : !attn.probs<?x4x?x?xf32>, tensor<?x2x8x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}

// -----

// CHECK: paged_invalid.mlir:[[# @LINE + 5]]:8: error: 'attn.mask' op attn.mask document with an operand indexes a padded [B, S] batch: not supported with a paged KV cache
func.func @document(%q: tensor<?x4x?x32xf16>, %kc: tensor<?x2x8x32xf16>, %vc: tensor<?x2x8x32xf16>,
                    %bt: tensor<?x?xi32>, %lens: tensor<?xi32>, %qd: tensor<?x?xi32>,
                    %kd: tensor<?x?xi32>) -> tensor<?x4x?x32xf16> {
  %s = attn.scores %q, %kc block_table %bt kv_lens %lens : tensor<?x4x?x32xf16>, tensor<?x2x8x32xf16>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask document %s, %qd, %kd : !attn.scores<?x4x?x?xf32>, tensor<?x?xi32>, tensor<?x?xi32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %vc : !attn.probs<?x4x?x?xf32>, tensor<?x2x8x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}
