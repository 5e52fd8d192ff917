// lower-to-tile{hopper-forward}: an eligible program (bf16, head dim 128, GQA, causal,
// RoPE with K pre-rotated by rope-fusion hybrid) gets, besides the Triton forward, the
// warp-specialized Gluon kernel: device functions in tile IR (KV walk and its tiles, Q
// prologue, score chain), a tile_hopper.kernel with TMA descriptor arguments for K, V and Out,
// and host code that picks one of the two forward launches per shape class. Under
// rope-fusion fused the kernel reads the raw K and its producer rotates each K tile
// (device functions @..._k and @..._k_angles).
// RUN: attnfuse-opt %s -p 'attn-canonicalize,rope-fusion{strategy=hybrid},online-softmax,mask-tiling,lower-to-tile' | filecheck %s
// RUN: attnfuse-opt %s -p 'attn-canonicalize,rope-fusion{strategy=hybrid},online-softmax,mask-tiling,lower-to-tile{hopper-forward=false}' | filecheck %s --check-prefix=OFF
// RUN: attnfuse-opt %s -p 'attn-canonicalize,rope-fusion{strategy=fused},online-softmax,mask-tiling,lower-to-tile' | filecheck %s --check-prefix=FUSED
// RUN: attnfuse-opt %s -p 'attn-canonicalize,rope-fusion{strategy=hybrid},online-softmax,mask-tiling,lower-to-tile' -t triton | filecheck %s --check-prefix=GLUON

func.func @llama(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>) -> tensor<?x8x?x128xbf16> {
  %qr = attn.rope %q {theta = 500000.0} : tensor<?x8x?x128xbf16>
  %kr = attn.rope %k {theta = 500000.0} : tensor<?x2x?x128xbf16>
  %s = attn.scores %qr, %kr : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<?x8x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x8x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}

// CHECK-LABEL: func.func @llama(
// CHECK:         host.launch @llama_k_prologue
// CHECK:         %use_hopper = host.tma_ready %q, %k_transformed, %v, %out {arch = 9 : i64, rows = 128 : i64}
// CHECK:         %ws_bh = arith.muli %batch, %{{.*}} : i32
// CHECK:         %ws_m = arith.ceildivsi %q_len, %{{.*}} : i32
// CHECK-NEXT:    %ws_items = arith.muli %ws_bh, %ws_m : i32
// CHECK-NEXT:    %sms = host.sm_count : i32
// CHECK-NEXT:    %ws_ctas = arith.minsi %ws_items, %sms : i32
// CHECK-NEXT:    host.launch @llama_fwd_ws[%ws_ctas, %one, %one] (%k_transformed, %v, %out, %q, %lse, %{{.*}}, %q_len, %kv_len, %batch) when %use_hopper :
// CHECK:         host.launch @llama_fwd[%grid_m, %grid_bh, %one] ({{.*}}) when %use_hopper unless :
// CHECK:       tile.kernel @llama_fwd(
// CHECK:       tile_hopper.func @llama_fwd_ws_range(%q_start: i32, %batch: i32, %head: i32, {{.*}}) -> (i32, i32, i32, i32) {
// CHECK:         %n_tiles = arith.divsi
// CHECK:         tile_hopper.return
// CHECK:       tile_hopper.func @llama_fwd_ws_q(%rows: tensor<64xi32>, %batch: i32, %head: i32, {{.*}}) -> (tensor<64x64xbf16>, tensor<64x64xbf16>) {
// CHECK:         %rot_a = arith.subf
// CHECK:         %rot_b = arith.addf
// CHECK:       tile_hopper.func @llama_fwd_ws_tile(%j: i32, %kv_lo: i32, %n_tiles: i32, %full_lo: i32, %full_hi: i32, {{.*}}) -> (i32, i1) {
// CHECK:         %masked = arith.ori
// CHECK:       tile_hopper.func @llama_fwd_ws_score_masks(%s: tensor<64x128xf32>, %rows: tensor<64xi32>, %cols: tensor<128xi32>, {{.*}}) -> (tensor<64x128xf32>) {
// CHECK:         %s_masked = tile.where
// CHECK-NOT:   tile_hopper.func @llama_fwd_ws_score(
// CHECK:       tile_hopper.kernel @llama_fwd_ws(%k_desc: !tile_hopper.tma<bf16, [128, 128]>, %k_desc_stride_r0: i32, %k_desc_stride_c0: i32, %k_desc_stride_r1: i32, %k_desc_stride_c1: i32, %v_desc: !tile_hopper.tma<bf16, [128, 128]>, {{.*}}, %o_desc: !tile_hopper.tma<bf16, [64, 128]>, {{.*}}, %o_desc_stride_c1: i32, %Q: !tile.ptr<bf16>,
// CHECK-SAME:    num_warps = 4 : i64, maxnreg = 168 : i64
// CHECK-SAME:    callees = [@llama_fwd_ws_range, @llama_fwd_ws_q, @llama_fwd_ws_tile, @llama_fwd_ws_score_masks, @llama_fwd_ws_steps, @llama_fwd_ws_work]

// FUSED:       %use_hopper = host.tma_ready %q, %k, %v, %out
// FUSED:       %ws_ctas = arith.minsi
// FUSED:       host.launch @llama_fwd_ws[%ws_ctas, %one, %one] (%k, %v, %out, %q, %lse,
// FUSED:       tile_hopper.func @llama_fwd_ws_k(%k_a: tensor<8x64xbf16>, %k_b: tensor<8x64xbf16>, %cos: tensor<8x64xf32>, %sin: tensor<8x64xf32>, %rows: tensor<8xi32>, %batch: i32,
// FUSED:         %rot_a = arith.subf
// FUSED:       tile_hopper.func @llama_fwd_ws_k_angles(%pos: tensor<8xi32>,
// FUSED:         %cos = math.cos %angle : tensor<8x64xf32>
// The K ring is two allocations of 64-column tiles (the rope's halves): K's descriptor
// loads a [128, 64] box.
// FUSED:       tile_hopper.kernel @llama_fwd_ws(%k_desc: !tile_hopper.tma<bf16, [128, 64]>, %k_desc_stride_r0: i32, {{.*}}, %v_desc: !tile_hopper.tma<bf16, [128, 128]>,
// FUSED-SAME:    callees = [@llama_fwd_ws_range, @llama_fwd_ws_q, @llama_fwd_ws_tile, @llama_fwd_ws_score_masks, @llama_fwd_ws_k, @llama_fwd_ws_k_angles, @llama_fwd_ws_steps, @llama_fwd_ws_work]

// OFF-NOT:     tma_ready
// OFF-NOT:     tile_hopper
// OFF:         host.launch @llama_fwd[%grid_m, %grid_bh, %one] ({{.*}}) :
// OFF-NOT:     tile_hopper

// GLUON:       from triton.experimental import gluon
// GLUON:       def llama_fwd_ws_score_masks(s, rows, cols, start, batch, head,
// GLUON:       gl.where(
// GLUON:       def llama_fwd_ws_qk(q, k_smem, k2_smem, st, zero_s):
// GLUON-NEXT:      """Issue S = Q K^T of ring slot `st` (async)."""
// GLUON-NEXT:      return warpgroup_mma(q, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
// GLUON:       def llama_fwd_ws_consumer(
// GLUON:       for step in range(llama_fwd_ws_steps(ctas,
// GLUON:       # kernel llama_fwd_ws
// GLUON-NEXT:  #   num_warps=4 num_stages=1 maxnreg=168
// GLUON:       @gluon.jit(do_not_specialize=['Sq', 'Skv', 'B'])
// GLUON-NEXT:  def llama_fwd_ws(k_desc, k_desc_stride_r0, k_desc_stride_c0, k_desc_stride_r1, k_desc_stride_c1, v_desc, {{.*}}, o_desc, {{.*}}, o_desc_stride_c1, Q, Q_stride0, Q_stride1, Q_stride2, Q_stride3, LSE,
// GLUON:       gl.warp_specialize([
