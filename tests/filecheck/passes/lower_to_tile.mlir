// lower-to-tile: host launch code plus tile.kernels (pre-kernels, block map, forward).
// RUN: attnfuse-opt %s --split-input-file -p 'attn-canonicalize,rope-fusion{strategy=fused},online-softmax,mask-tiling{block-m=64 block-n=32},lower-to-tile' | filecheck %s --check-prefix=FUSED
// RUN: attnfuse-opt %s --split-input-file -p 'attn-canonicalize,rope-fusion{strategy=hybrid},online-softmax,mask-tiling{block-m=64 block-n=32},lower-to-tile' | filecheck %s --check-prefix=HYBRID
// RUN: attnfuse-opt %s --split-input-file -p 'attn-canonicalize,rope-fusion{strategy=separate},online-softmax,mask-tiling{block-m=64 block-n=32},lower-to-tile' | filecheck %s --check-prefix=SEPARATE
// RUN: attnfuse-opt %s --split-input-file -p 'attn-canonicalize,rope-fusion{strategy=fused},online-softmax,mask-tiling{block-m=64 block-n=32},lower-to-tile{count-tiles=true}' | filecheck %s --check-prefix=COUNT
// RUN: not attnfuse-opt %s --split-input-file -p 'attn-canonicalize,online-softmax,mask-tiling,lower-to-tile' 2>&1 | filecheck %s --check-prefix=PREREQ
// PREREQ: pass 'lower-to-tile' requires 'rope-fusion' to run earlier in the pipeline

// Llama-style: RoPE on both sides, causal. The causal band gives two KV loops per q
// block: full tiles (no mask code) from key 0, then the masked tiles of the diagonal
// (no loop for masked tiles below the band: causal has no lower edge).

// FUSED-LABEL: func.func @llama(
// FUSED-SAME:      -> (tensor<?x4x?x64xf16>, tensor<?x4x?xf32>)
// FUSED-NEXT:    %batch = host.dim %q[0] : tensor<?x4x?x64xf16>
// FUSED-NEXT:    %q_len = host.dim %q[2] : tensor<?x4x?x64xf16>
// FUSED-NEXT:    %kv_len = host.dim %k[2] : tensor<?x2x?x64xf16>
// FUSED-NOT:     _prologue
// FUSED:         %out = host.alloc %batch, %q_len : tensor<?x4x?x64xf16>
// FUSED-NEXT:    %lse = host.alloc %batch, %q_len : tensor<?x4x?xf32>
// FUSED:         %[[TABLE:.*]] = arith.constant dense<[1.000000e+00, {{.*}}]> : tensor<32xf32>
// FUSED:         %grid_m = arith.ceildivsi %q_len, %{{.*}} : i32
// FUSED:         %grid_bh = arith.muli %batch, %{{.*}} : i32
// FUSED-NEXT:    host.launch @llama_fwd[%grid_m, %grid_bh, %one] (%q, %k, %v, %out, %lse, {{.*}}%batch, %q_len, %kv_len)
// FUSED-NEXT:    func.return %out, %lse : tensor<?x4x?x64xf16>, tensor<?x4x?xf32>
// FUSED-NEXT:  }
// FUSED-NOT:   tile.kernel @llama_{{.*}}_prologue
// FUSED:       tile.kernel @llama_fwd(%Q: !tile.ptr<f16>, %Q_stride0: i32, %Q_stride1: i32, %Q_stride2: i32, %Q_stride3: i32, %K: !tile.ptr<f16>,
// FUSED-SAME:      %B: i32, %Sq: i32, %Skv: i32)
// FUSED:         %pid_m = tile.program_id 0 : i32
// FUSED:         %pid_bh = tile.program_id 1 : i32
// FUSED:         %cos = tile.load
// FUSED:         scf.for %start_n = %{{.*}} to %full_hi
// FUSED:           %cos{{.*}} = tile.load
// FUSED-NOT:       %keep
// FUSED:           tile.dot
// FUSED:           math.exp2
// FUSED:           scf.yield
// FUSED:         scf.for %{{.*}} = %full_hi to
// FUSED:           tile.dot
// FUSED:           %keep{{.*}} = tile.cmp le
// FUSED:           scf.yield
// FUSED-NOT:     scf.for
// FUSED:         tile.store %Out_base
// FUSED:         tile.store %LSE_base
// FUSED-NEXT:    tile.return

// Hybrid: K rotated once by a pre-kernel (cos/sin from an f32 table), the forward kernel
// reads the result.
// HYBRID-LABEL: func.func @llama(
// HYBRID:         %k_transformed = host.alloc %batch, %kv_len : tensor<?x2x?x64xf16>
// HYBRID:         %rope_table = host.alloc %rope_rows : tensor<1x?x64xf32>
// HYBRID:         host.launch @llama_rope_table0[%rope_grid, %one_1, %one_1] (%rope_table, %table, %rope_rows)
// HYBRID:         host.launch @llama_k_prologue[%k_grid_s, %k_grid_bh, %one] (%k, %k_transformed, %rope_table,
// HYBRID-NOT:     @llama_q_prologue
// HYBRID:         host.launch @llama_fwd[%grid_m, %grid_bh, %one] (%q, %k_transformed, %v, %out, %lse,
// HYBRID:       tile.kernel @llama_k_prologue(%X: !tile.ptr<f16>,
// HYBRID-NOT:     math.cos
// HYBRID:         %cos = tile.load
// HYBRID:         tile.store %Y_base
// HYBRID:       tile.kernel @llama_fwd(

// Separate: both sides in pre-kernels; no rotation left in the forward kernel.
// SEPARATE-LABEL: func.func @llama(
// SEPARATE:         %q_transformed = host.alloc %batch, %q_len : tensor<?x4x?x64xf16>
// SEPARATE:         host.launch @llama_q_prologue[%q_grid_s, %q_grid_bh, %one] (%q, %q_transformed,
// SEPARATE:         %k_transformed = host.alloc %batch, %kv_len : tensor<?x2x?x64xf16>
// SEPARATE:         host.launch @llama_k_prologue[%k_grid_s, %k_grid_bh, %one] (%k, %k_transformed,
// SEPARATE:         host.launch @llama_fwd[%grid_m, %grid_bh, %one] (%q_transformed, %k_transformed, %v, %out, %lse,
// SEPARATE:       tile.kernel @llama_q_prologue(
// SEPARATE:       tile.kernel @llama_k_prologue(
// SEPARATE:       tile.kernel @llama_fwd(
// SEPARATE-NOT:     math.cos
// SEPARATE:         tile.return

// count-tiles: a zeroed counter, bumped once per visited tile, returned third.
// COUNT-LABEL: func.func @llama(
// COUNT-SAME:      -> (tensor<?x4x?x64xf16>, tensor<?x4x?xf32>, tensor<1xi32>)
// COUNT:         %tile_count = host.alloc zero : tensor<1xi32>
// COUNT:         host.launch @llama_fwd{{.*}}%tile_count
// COUNT:         func.return %out, %lse, %tile_count : tensor<?x4x?x64xf16>, tensor<?x4x?xf32>, tensor<1xi32>
// COUNT:       tile.kernel @llama_fwd(
// COUNT-COUNT-3: tile.atomic_add %tile_counter
func.func @llama(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %qr = attn.rope %q {theta = 10000.0} : tensor<?x4x?x64xf16>
  %kr = attn.rope %k {theta = 10000.0} : tensor<?x2x?x64xf16>
  %s = attn.scores %qr, %kr : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// No mask: an exact plan without a band; every tile inside [0, Skv) is full (K loaded
// without a mask), the last partial one is masked; no mask code anywhere. The ALiBi
// slopes become a host constant table read by the kernel.
// FUSED-LABEL: func.func @alibi(
// FUSED:         %table = arith.constant dense<[2.500000e-01, 6.250000e-02, 1.562500e-02, 3.906250e-03]> : tensor<4xf32>
// FUSED:         host.launch @alibi_fwd[%grid_m, %grid_bh, %one] (%q, %k, %v, %out, %lse, %table, %batch, %q_len, %kv_len)
// FUSED:       tile.kernel @alibi_fwd(
// FUSED-SAME:      %alibi_slopes0: !tile.ptr<f32>, %alibi_slopes0_stride0: i32
// FUSED-NOT:     %keep
// FUSED:         scf.for %start_n = %{{.*}} to %full_hi
// FUSED:         %K_all = tile.load %K_base[%{{[0-9]+}}] : !tile.ptr<f16>
// FUSED-NOT:     %keep
// FUSED:         scf.for %start_n_1 = %full_hi to %Skv
// FUSED-NOT:     %keep
// FUSED:         tile.return
func.func @alibi(%q: tensor<?x4x?x64xf16>, %k: tensor<?x4x?x64xf16>, %v: tensor<?x4x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x4x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %b = attn.bias alibi %s : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %b : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x4x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Document ids: a block-map kernel classifies tiles first; the forward kernel walks the
// partial tiles (with the mask) and the full ones (without).
// FUSED-LABEL: func.func @doc(
// FUSED:         %partial_count = host.alloc %map_slots : tensor<?xi32>
// FUSED-NEXT:    %partial_index = host.alloc %map_slots, %map_kv_blocks : tensor<?x?xi32>
// FUSED-NEXT:    %full_count = host.alloc %map_slots : tensor<?xi32>
// FUSED-NEXT:    %full_index = host.alloc %map_slots, %map_kv_blocks : tensor<?x?xi32>
// FUSED:         host.launch @doc_block_map[%map_grid_m, %map_grid_bh, %one] (%ids, %partial_count, %partial_index, %full_count, %full_index, %batch, %q_len, %kv_len)
// FUSED:         host.launch @doc_fwd[%grid_m, %grid_bh, %one] ({{.*}}%partial_count, %partial_index, %full_count, %full_index, %batch, %q_len, %kv_len)
// FUSED:       tile.kernel @doc_block_map(
// FUSED:         %n_partial, %n_full = scf.for %kv_block =
// FUSED:           %same_doc = tile.cmp eq
// FUSED:           %is_full =
// FUSED:           %is_partial =
// FUSED:       tile.kernel @doc_fwd(
// FUSED:         scf.for %j =
// FUSED:           %same_doc = tile.cmp eq
// FUSED:           tile.where %same_doc
// FUSED:         scf.for %j_1 =
// FUSED-NOT:       %same_doc
// FUSED:           tile.dot
// FUSED:         tile.return
func.func @doc(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %ids: tensor<?x?xi32>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask document %s, %ids : !attn.scores<?x4x?x?xf32>, tensor<?x?xi32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Sinks start the running state, dropout draws from the counter-based RNG, the lse is
// returned by the program.
// FUSED-LABEL: func.func @sinks_dropout(
// FUSED:         host.launch @sinks_dropout_fwd[%grid_m, %grid_bh, %one] (%q, %k, %v, %out, %lse, %sk, %seed, %batch, %q_len, %kv_len)
// FUSED:         func.return %out, %lse
// FUSED:       tile.kernel @sinks_dropout_fwd(
// FUSED-SAME:      %sinks: !tile.ptr<f32>, %sinks_stride0: i32, %seed: i64,
// FUSED:         %seed_bh = arith.addi %seed,
// FUSED:         tile.load %sinks[
// FUSED:         %m_i = tile.splat {{.*}} -> tensor<64xf32>
// FUSED:         scf.for
// FUSED:           %u = tile.rand %seed_bh, {{.*}} : i64, tensor<64x32xi32> -> tensor<64x32xf32>
// FUSED:           %p_dropped = tile.where
// FUSED:         %lse{{.*}} = tile.where
func.func @sinks_dropout(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>,
                         %sk: tensor<4xf32>, %seed: i64) -> (tensor<?x4x?x64xf16>, tensor<?x4x?xf32>) {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %p, %lse = attn.softmax %s sinks %sk : !attn.scores<?x4x?x?xf32>, tensor<4xf32> -> !attn.probs<?x4x?x?xf32>, tensor<?x4x?xf32>
  %pd = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x4x?x?xf32>, i64
  %o = attn.weighted_sum %pd, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o, %lse : tensor<?x4x?x64xf16>, tensor<?x4x?xf32>
}
