// mask-tiling: the #attn.tile_plan recorded on attn.online_softmax (block sizes, band,
// prefix, exact, runtime block map).
// RUN: attnfuse-opt %s -p 'online-softmax,mask-tiling{block-m=64 block-n=32}' --split-input-file | filecheck %s
// RUN: attnfuse-opt %s -p 'online-softmax,mask-tiling' --split-input-file | filecheck %s --check-prefix=DEFAULT
// RUN: not attnfuse-opt %s -p 'online-softmax,mask-tiling{block-m=48}' 2>&1 | filecheck %s --check-prefix=BAD
// BAD: block-m must be a power of two >= 16, got 48

// No mask: every tile, and exact (every in-bounds tile is full: no mask code, no bounds
// masks); the block sizes are by default chosen by the pass.
// CHECK-LABEL: func.func @no_mask(
// CHECK:         attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<64x32, exact>}
// DEFAULT-LABEL: func.func @no_mask(
// DEFAULT:         attn.online_softmax {{.*}} {tile_plan = #attn.tile_plan<{{(16|32|64|128|256)}}x{{(16|32|64|128|256)}}, exact>}
func.func @no_mask(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Head dim 256: the default KV block is at most 64 (shared memory).
// CHECK-LABEL: func.func @no_mask_d256(
// CHECK:         attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<64x32, exact>}
// DEFAULT-LABEL: func.func @no_mask_d256(
// DEFAULT:         attn.online_softmax {{.*}} {tile_plan = #attn.tile_plan<{{(16|32|64|128|256)}}x{{(16|32|64)}}, exact>}
func.func @no_mask_d256(%q: tensor<?x4x?x256xf16>, %k: tensor<?x2x?x256xf16>, %v: tensor<?x2x?x256xf16>) -> tensor<?x4x?x256xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x256xf16>, tensor<?x2x?x256xf16> -> !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x256xf16> -> tensor<?x4x?x256xf16>
  func.return %o : tensor<?x4x?x256xf16>
}

// -----

// CHECK-LABEL: func.func @causal(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [?, 0], exact>}
func.func @causal(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// CHECK-LABEL: func.func @causal_br(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [?, 0] bottom_right, exact>}
func.func @causal_br(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// CHECK-LABEL: func.func @window(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [-127, 3], exact>}
func.func @window(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask sliding_window %s {left = 127, right = 3} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Two bands of one alignment intersect (without attn-canonicalize).
// CHECK-LABEL: func.func @causal_window(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [-4095, 0], exact>}
func.func @causal_window(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %c = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %m = attn.mask sliding_window %c {left = 4095} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Bands of different alignments: the first plans the walk, masks stay elementwise (not exact).
// CHECK-LABEL: func.func @mixed_alignment(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [?, 0] bottom_right>}
func.func @mixed_alignment(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %c = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
  %m = attn.mask sliding_window %c {left = 8} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// CHECK-LABEL: func.func @prefix_static(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [?, 0], exact, prefix 100>}
func.func @prefix_static(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask prefix_lm %s {prefix = 100} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// CHECK-LABEL: func.func @prefix_operand(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [?, 0], exact, prefix -1>}
func.func @prefix_operand(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %plen: tensor<?xi32>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask prefix_lm %s, %plen : !attn.scores<?x4x?x?xf32>, tensor<?xi32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// prefix-lm with another band: walk by the band, mask elementwise.
// CHECK-LABEL: func.func @prefix_and_window(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [-64, ?]>}
func.func @prefix_and_window(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %c = attn.mask prefix_lm %s {prefix = 10} : !attn.scores<?x4x?x?xf32>
  %m = attn.mask sliding_window %c {left = 64} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// CHECK-LABEL: func.func @document(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, runtime_block_map>}
func.func @document(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %ids: tensor<?x?xi32>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask document %s, %ids : !attn.scores<?x4x?x?xf32>, tensor<?x?xi32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Band and document: the band is recorded, tiles classified at run time.
// CHECK-LABEL: func.func @document_causal(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [?, 0], runtime_block_map>}
func.func @document_causal(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %ids: tensor<?x?xi32>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %c = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %m = attn.mask document %c, %ids : !attn.scores<?x4x?x?xf32>, tensor<?x?xi32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}


// -----

// Custom predicates comparing kv - q with constants are bands (exact); others need the
// runtime block map.
// CHECK-LABEL: func.func @custom_affine(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [-5, 0], exact>}
func.func @custom_affine(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask custom %s : !attn.scores<?x4x?x?xf32> {
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    %d = arith.subi %qi, %ki : index
    %c5 = arith.constant 5 : index
    %near = arith.cmpi sle, %d, %c5 : index
    %past = arith.cmpi sge, %qi, %ki : index
    %keep = arith.andi %near, %past : i1
    attn.yield %keep : i1
  }
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// CHECK-LABEL: func.func @custom_per_head(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, runtime_block_map>}
func.func @custom_per_head(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask custom %s : !attn.scores<?x4x?x?xf32> {
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    %w = arith.addi %qi, %h : index
    %keep = arith.cmpi sle, %ki, %w : index
    attn.yield %keep : i1
  }
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// A mask before a softcap or a score_mod does not remove elements (-inf becomes -cap,
// or anything): no band (every tile visited, each with that mask's code, which the plan
// does not cover). After them it does (the bias in between is fine).
// CHECK-LABEL: func.func @mask_then_softcap(
// CHECK:         attn.online_softmax %c, %v {tile_plan = #attn.tile_plan<64x32, exact>} :
// CHECK-LABEL: func.func @softcap_then_mask(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<64x32, band [?, 0], exact>}
// CHECK-LABEL: func.func @mask_then_score_mod(
// CHECK:         attn.online_softmax %t, %v {tile_plan = #attn.tile_plan<64x32, exact>} :
func.func @mask_then_softcap(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %c = attn.softcap %m {cap = 30.0} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %c : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}
func.func @softcap_then_mask(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %c = attn.softcap %s {cap = 30.0} : !attn.scores<?x4x?x?xf32>
  %m0 = attn.mask causal %c : !attn.scores<?x4x?x?xf32>
  %m = attn.bias alibi %m0 : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}
func.func @mask_then_score_mod(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %t = attn.score_mod %m : !attn.scores<?x4x?x?xf32> {
  ^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index):
    %two = arith.constant 2.0 : f32
    %y = arith.mulf %x, %two : f32
    attn.yield %y : f32
  }
  %p = attn.softmax %t : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// A packed batch: the band is in indices within each sequence, and a predicate the pass
// cannot bound asks for no runtime block map (the kernels walk every tile of a sequence
// and nothing across sequences).
// CHECK-LABEL: func.func @packed(
// CHECK:         attn.online_softmax %m2, %v {tile_plan = #attn.tile_plan<64x32, band [?, 0] bottom_right>}
func.func @packed(%q: tensor<1x4x?x64xf16>, %k: tensor<1x2x?x64xf16>, %v: tensor<1x2x?x64xf16>, %cu_q: tensor<?xi32>, %cu_k: tensor<?xi32>) -> tensor<1x4x?x64xf16> {
  %s = attn.scores %q, %k cu_seqlens_q %cu_q cu_seqlens_k %cu_k : tensor<1x4x?x64xf16>, tensor<1x2x?x64xf16>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
  %m2 = attn.mask custom %m : !attn.scores<?x4x?x?xf32> {
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    %c3 = arith.constant 3 : index
    %r = arith.remsi %ki, %c3 : index
    %c0 = arith.constant 0 : index
    %keep = arith.cmpi ne, %r, %c0 : index
    attn.yield %keep : i1
  }
  %p = attn.softmax %m2 : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<1x2x?x64xf16> -> tensor<1x4x?x64xf16>
  func.return %o : tensor<1x4x?x64xf16>
}
