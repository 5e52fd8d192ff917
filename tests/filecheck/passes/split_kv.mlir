// split-kv: the #attn.split_kv plan recorded on attn.online_softmax, the programs it
// leaves alone, its options, and the host code and kernels lower-to-tile builds from it.
// RUN: attnfuse-opt %s --split-input-file -p 'online-softmax,mask-tiling,split-kv' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'online-softmax,mask-tiling,split-kv{splits=3 rows=32 block-n=16 waves=4 min-blocks=1 merge=false}' | filecheck %s --check-prefix=OPTS
// RUN: attnfuse-opt %s --split-input-file -p 'attn-canonicalize,rope-fusion,online-softmax,mask-tiling,split-kv{merge=false},lower-to-tile' | filecheck %s --check-prefix=LOWER
// RUN: attnfuse-opt %s --split-input-file -p 'attn-canonicalize,rope-fusion,online-softmax,mask-tiling,split-kv,lower-to-tile' | filecheck %s --check-prefix=MERGE
// RUN: attnfuse-opt %s --split-input-file -p 'online-softmax,mask-tiling,split-kv' | attnfuse-opt --split-input-file | filecheck %s --check-prefix=MERGE-PLAN
// RUN: attnfuse-opt %s --split-input-file -p 'attn-canonicalize,rope-fusion,online-softmax,mask-tiling,split-kv{persistent=false},lower-to-tile' | filecheck %s --check-prefix=NO-PERSISTENT
// RUN: not attnfuse-opt %s -p 'online-softmax,mask-tiling,split-kv{splits=0}' 2>&1 | filecheck %s --check-prefix=BAD-SPLITS
// RUN: not attnfuse-opt %s -p 'online-softmax,mask-tiling,split-kv{splits="many"}' 2>&1 | filecheck %s --check-prefix=BAD-SPLITS
// RUN: not attnfuse-opt %s -p 'online-softmax,mask-tiling,split-kv{rows=48}' 2>&1 | filecheck %s --check-prefix=BAD-ROWS
// RUN: not attnfuse-opt %s -p 'online-softmax,split-kv' 2>&1 | filecheck %s --check-prefix=PREREQ
// BAD-SPLITS: pass 'split-kv' failed: splits must be auto or a count >= 1
// BAD-ROWS: pass 'split-kv' failed: rows must be a power of two >= 16, got 48
// PREREQ: pass 'split-kv' requires 'mask-tiling' to run earlier in the pipeline

// Llama 3 decoding against a cache: 4 query heads per KV head, packed 16 queries deep
// into 64 rows; 64 keys per block (bf16, head dim 128).
// CHECK-LABEL: func.func @llama(
// CHECK:         attn.online_softmax %m, %v {tile_plan = #attn.tile_plan<{{.*}}>, split_kv = #attn.split_kv<64x64, group 4, splits auto, waves 1, min_blocks 1, merge 1, persistent 1>}
// MERGE-PLAN-LABEL: func.func @llama(
// MERGE-PLAN:    split_kv = #attn.split_kv<64x64, group 4, splits auto, waves 1, min_blocks 1, merge 1, persistent 1>
// `persistent=false`: no persistent kernel; its calls take the wide one.
// NO-PERSISTENT-LABEL: func.func @llama(
// NO-PERSISTENT-NOT:     persistent
// NO-PERSISTENT:         host.launch @llama_split_kv_wide[%wide_split_grid, %split_bh, %one]
// NO-PERSISTENT-NOT:     persistent
// NO-PERSISTENT:       tile.kernel @llama_split_kv_wide(
// OPTS-LABEL:  func.func @llama(
// OPTS:          split_kv = #attn.split_kv<32x16, group 4, splits 3, waves 4, min_blocks 1>

// The host code: which path a call takes (its Sq x 4 rows fit 16 and its programs one
// wave: the wide split kernel of 128-key blocks when each split walks at least 4 blocks
// of 64, else the small one; 64: the full one; more: the usual kernel), the split count from
// the batch, the 8 KV heads, the KV blocks and the SM count (`%sms`, queried once for the
// function: the Hopper forward's persistent grid reads it too), the workspace, the split
// and combine launches, and the usual forward kernel with a zero grid when decoding.
// By default (`merge=true`) the 16-row kernels' last program per (batch, KV head)
// merges up to 16 splits (4 heads of 128) of a workspace its i32 offsets reach (at
// most (2**31 - 1) // (16 x 128) = 1048575 slots per split):
// counters zeroed once and left zero, the combine kernel for calls beyond that or on
// the full tile; the kernel counts itself done after a barrier and the last one
// merges. `merge=false` (LOWER) launches the combine kernel for every call of several
// splits.
// MERGE-LABEL: func.func @llama(
// MERGE:         %few_splits = arith.cmpi sle, %split_grid, %{{.*}} : i32
// MERGE-NEXT:    %[[SLOTS:.*]] = arith.constant 1048575 : i32
// MERGE-NEXT:    %narrow_workspace = arith.cmpi sle, %workspace_slots, %[[SLOTS]] : i32
// MERGE-NEXT:    %[[FEW:.*]] = arith.andi %few_splits, %narrow_workspace : i1
// MERGE-NEXT:    %merge_in_kernel = arith.andi %several_splits, %[[FEW]] : i1
// MERGE:         %split_counts = host.alloc %{{.*}} zero restored : tensor<?xi32>
// MERGE:         %merge = arith.select %merge_in_kernel, %one, %{{.*}} : i32
// MERGE:         host.launch @llama_split_kv_wide[%wide_split_grid, %split_bh, %one] ({{.*}}, %o_part, %lse_part, %split_counts, %merge)
// MERGE:         host.launch @llama_split_kv[%full_split_grid, %split_bh, %one] ({{.*}}, %o_part, %lse_part)
// MERGE:         %combine_needed = arith.ori %beyond_merge_limit, %full_tile_splits : i1
// MERGE-NEXT:    %combined = arith.andi %several_splits, %combine_needed : i1
// MERGE:         tile.kernel @llama_split_kv_wide(
// MERGE:           tile.barrier
// MERGE-NEXT:      %ticket = tile.atomic_fetch_add %Counts[%{{.*}}], %{{.*}} : !tile.ptr<i32>, i32
// LOWER-LABEL: func.func @llama(
// LOWER:         %packed_rows = arith.muli %q_len, %{{.*}} : i32
// LOWER:         %decoding = arith.cmpi sle, %packed_rows, %{{.*}} : i32
// LOWER:         %fits_16_rows = arith.cmpi sle, %packed_rows, %{{.*}} : i32
// LOWER:         %kv_blocks_visited = arith.ceildivsi %kv_len, %{{.*}} : i32
// LOWER:         %programs_per_split = arith.muli %batch, %{{.*}} : i32
// LOWER:         %target_programs = arith.muli %sms, %{{.*}} : i32
// LOWER:         %splits_by_sms = arith.divsi %target_programs, %programs : i32
// LOWER:         %splits_by_work = arith.ceildivsi %kv_blocks, %{{.*}} : i32
// LOWER-NEXT:    %splits_one_wave = arith.minsi %splits_by_sms, %splits_by_work : i32
// LOWER:         %two_per_sm = arith.muli %sms, %{{.*}} : i32
// LOWER-NEXT:    %splits_two_per_sm = arith.divsi %two_per_sm, %programs : i32
// LOWER:         %splits_long = arith.divsi %kv_blocks, %{{.*}} : i32
// LOWER-NEXT:    %splits_two_waves = arith.minsi %splits_two_per_sm, %splits_long : i32
// LOWER:         %splits_two_waves_narrow = arith.select %fits_16_rows, %{{.*}}, %splits_two_waves : i32
// LOWER-NEXT:    %splits_one_per_sm = arith.divsi %sms, %programs : i32
// LOWER-NEXT:    %splits_fill = arith.minsi %splits_one_per_sm, %kv_blocks : i32
// LOWER-NEXT:    %[[M:.*]] = arith.maxsi %splits_one_wave, %splits_two_waves_narrow : i32
// LOWER-NEXT:    %splits_most = arith.maxsi %[[M]], %splits_fill : i32
// LOWER:         %blocks_per_split = arith.ceildivsi %kv_blocks, %splits_wanted : i32
// LOWER-NEXT:    %splits = arith.ceildivsi %kv_blocks, %blocks_per_split : i32
// LOWER:         %split_grid = arith.select %decoding, %splits, %{{.*}} : i32
// LOWER:         %workspace_slots = arith.select %decoding, %slots_padded, %{{.*}} : i32
// LOWER-NEXT:    %o_part = host.alloc %split_grid, %workspace_slots : tensor<?x?x128xf32>
// LOWER-NEXT:    %lse_part = host.alloc %split_grid, %workspace_slots : tensor<?x?xf32>
// LOWER:         %several_splits = arith.cmpi sgt, %split_grid, %one : i32
// LOWER-NEXT:    %split_programs = arith.muli %split_grid, %split_bh : i32
// LOWER-NEXT:    %one_wave = arith.cmpi sle, %split_programs, %sms : i32
// LOWER-NOT:     split_kv_short
// The persistent kernel takes calls of one split and more programs than two per SM:
// two programs per SM (at most one per pair) walk the (batch, KV head) pairs; no workspace.
// LOWER:         %persistent_min_programs = arith.muli %sms, %{{.*}} : i32
// LOWER-NEXT:    %many_programs = arith.cmpi sgt, %split_programs, %persistent_min_programs : i32
// LOWER:         %persistent_split = arith.andi %{{.*}}, %{{.*}} : i1
// LOWER:         %persistent_resident = arith.muli %sms, %{{.*}} : i32
// LOWER-NEXT:    %persistent_programs = arith.minsi %split_programs, %persistent_resident : i32
// LOWER:         %persistent_split_grid = arith.select %persistent_split, %persistent_programs, %{{.*}} : i32
// LOWER:         %after_persistent_grid = arith.select %persistent_split, %{{.*}}, %split_grid : i32
// LOWER-NEXT:    host.launch @llama_split_kv_persistent[%persistent_split_grid, %one, %one] (%q, %k, %v, %out, %lse, %batch, %q_len, %kv_len) :
// The wide tile takes calls of one wave, and of more programs than two per SM (the full
// tile's several waves).
// LOWER:         %programs_two_per_sm = arith.muli %sms, %{{.*}} : i32
// LOWER-NEXT:    %beyond_two_per_sm = arith.cmpi sgt, %split_programs, %programs_two_per_sm : i32
// LOWER-NEXT:    %wide_waves = arith.ori %one_wave, %beyond_two_per_sm : i1
// LOWER-NEXT:    %wide_tile = arith.andi %fits_16_rows, %wide_waves : i1
// LOWER:         %long_splits = arith.cmpi sge, %blocks_per_split, %{{.*}} : i32
// LOWER-NEXT:    %wide_split = arith.andi %wide_tile, %long_splits : i1
// LOWER:         %wide_split_grid = arith.select %wide_split, %after_persistent_grid, %{{.*}} : i32
// LOWER:         %after_wide_grid = arith.select %wide_split, %{{.*}}, %after_persistent_grid : i32
// LOWER-NEXT:    host.launch @llama_split_kv_wide[%wide_split_grid, %split_bh, %one] (%q, %k, %v, %out, %lse, %batch, %q_len, %kv_len, %o_part, %lse_part)
// The small tile reads the same compare (16 rows).
// LOWER-NOT:     arith.cmpi sle, %packed_rows
// LOWER:         %small_tile = arith.andi %fits_16_rows, %one_wave : i1
// LOWER:         %small_split_grid = arith.select %small_tile, %after_wide_grid, %{{.*}} : i32
// LOWER:         %full_split_grid = arith.select %small_tile, %{{.*}}, %after_wide_grid : i32
// LOWER:         host.launch @llama_split_kv_small[%small_split_grid, %split_bh, %one] (%q, %k, %v, %out, %lse, %batch, %q_len, %kv_len, %o_part, %lse_part)
// LOWER-NEXT:    host.launch @llama_split_kv[%full_split_grid, %split_bh, %one] (%q, %k, %v, %out, %lse, %batch, %q_len, %kv_len, %o_part, %lse_part)
// LOWER:         %combine_grid = arith.select %several_splits, %q_len, %{{.*}} : i32
// LOWER:         host.launch @llama_split_kv_combine[%combine_grid, %combine_bh, %one] (%o_part, %lse_part, %out, %lse, %q_len, %split_grid)
// LOWER:         %[[GRID:.*]] = arith.select %decoding, %{{.*}}, %grid_m : i32
// LOWER:         host.launch @llama_fwd[%[[GRID]], %grid_bh, %one]
// LOWER-NEXT:    func.return %out, %lse

// The split kernel: one program per (split, batch x KV head); packed row r is query
// r / 4 of head kv_head * 4 + r % 4; the causal band's loops, cut at the split's keys:
// the full tiles, then the masked diagonal (no loop for the band's empty left edge); one
// split writes out and lse, several write the workspace.
// The persistent kernel: no workspace; program p walks pairs p, p + programs, ... in
// a loop marked for flattening with the KV loop inside it (one masked loop), and stores
// out and lse directly.
// LOWER:       tile.kernel @llama_split_kv_persistent(%Q: !tile.ptr<bf16>, {{.*}}, %B: i32, %Sq: i32, %Skv: i32) attributes {num_warps = 4 : i64, num_stages = 2 : i64, launch = {role = "split_kv"}}
// LOWER:         %pairs = arith.muli %B, %{{.*}} : i32
// LOWER-NEXT:    %first_pair = tile.program_id 0 : i32
// LOWER-NEXT:    %[[PROGRAMS:.*]] = tile.num_programs 0 : i32
// LOWER:         scf.for %pid_bh = %first_pair to %pairs step %[[PROGRAMS]] : i32 {
// LOWER:           scf.for %start_n = %{{.*}} to %{{.*}} step %{{.*}} iter_args({{.*}}) -> (tensor<16xf32>, tensor<16xf32>, tensor<16x128xf32>)
// LOWER-NOT:       scf.for
// LOWER-NOT:       scf.if
// LOWER:           tile.store %Out_base
// LOWER:           tile.store %LSE_base
// LOWER-NEXT:    } {tile.flatten}
// LOWER:       tile.kernel @llama_split_kv(%Q: !tile.ptr<bf16>, {{.*}}, %Opart: !tile.ptr<f32>, %Opart_stride0: i32, %Opart_stride1: i32, %Opart_stride2: i32, %LSEpart: !tile.ptr<f32>, %LSEpart_stride0: i32, %LSEpart_stride1: i32) attributes {num_warps = 4 : i64, num_stages = 3 : i64, launch = {role = "split_kv"}}
// LOWER-NEXT:    %split = tile.program_id 0 : i32
// LOWER-NEXT:    %pid_bh = tile.program_id 1 : i32
// LOWER:         %kv_head = arith.remsi %pid_bh, %{{.*}} : i32
// LOWER-NEXT:    %packed = tile.arange 0, 64 : tensor<64xi32>
// LOWER:         %rows = arith.divsi %packed, %{{.*}} : tensor<64xi32>
// LOWER:         %head = arith.addi %{{.*}}, %{{.*}} : tensor<64xi32>
// LOWER:         %split_keys = arith.muli %{{.*}}, %{{.*}} : i32
// LOWER:         %split_lo = arith.addi %{{.*}}, %{{.*}} : i32
// LOWER:         %split_hi = arith.minsi %{{.*}}, %{{.*}} : i32
// LOWER:         scf.for %start_n = %{{.*}} to %{{.*}} step %{{.*}} iter_args({{.*}}) -> (tensor<64xf32>, tensor<64xf32>, tensor<64x128xf32>)
// LOWER:           tile.dot %{{.*}} : tensor<64x128xbf16>, tensor<128x64xbf16> -> tensor<64x64xf32>
// LOWER:         scf.for %start_n_1
// LOWER-NOT:     scf.for
// LOWER:         %one_split = arith.cmpi eq, %{{.*}}, %{{.*}} : i32
// LOWER-NEXT:    scf.if %one_split {
// LOWER:           tile.store %Out_base
// LOWER:           tile.store %LSE_base
// LOWER:         } else {
// LOWER:           tile.store %Opart_base
// LOWER:           tile.store %LSEpart_base
// LOWER:         }

// The combine kernel: one program per (query, batch x head), 16 partial results a step.
// LOWER:       tile.kernel @llama_split_kv_combine(%Opart: !tile.ptr<f32>, {{.*}}, %Sq: i32, %splits: i32) attributes {num_warps = 4 : i64, num_stages = 2 : i64, launch = {role = "split_kv_combine"}}
// LOWER:         scf.for %s0 = %{{.*}} to %splits step %{{.*}} iter_args({{.*}}) -> (f32, f32, f32, tensor<128xf32>)
// LOWER:           %lse_s = tile.load %LSEpart
// LOWER:           %o_s = tile.load %Opart
// LOWER:           %w = math.exp2 %{{.*}} : tensor<16xf32>
// LOWER:         tile.store %Out_base
// LOWER:         tile.store %LSE_base

func.func @llama(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %s = attn.scores %q, %k : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x32x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}

// -----

// gpt-oss: 8 query heads per KV head (128 rows), sinks, a 128-key window: the split
// count follows the keys the window reaches, min(Skv, Sq + 127), not the whole cache.
// CHECK-LABEL: func.func @gpt_oss(
// CHECK:         split_kv = #attn.split_kv<128x64, group 8, splits auto, waves 1, min_blocks 1, merge 1, persistent 1>
// LOWER-LABEL: func.func @gpt_oss(
// LOWER:         %band_keys = arith.addi %q_len, %{{.*}} : i32
// LOWER-NEXT:    %visited_keys = arith.minsi %kv_len, %band_keys : i32
// LOWER:         %kv_blocks_visited = arith.ceildivsi %visited_keys, %{{.*}} : i32
// LOWER:       tile.kernel @gpt_oss_split_kv({{.*}}%sinks: !tile.ptr<bf16>{{.*}}) attributes {num_warps = 4 : i64
// LOWER:         %sink = arith.extf
// LOWER-SAME:      tensor<128xbf16> to tensor<128xf32>
func.func @gpt_oss(%q: tensor<?x64x?x64xbf16>, %k: tensor<?x8x?x64xbf16>, %v: tensor<?x8x?x64xbf16>, %sinks: tensor<64xbf16>) -> tensor<?x64x?x64xbf16> {
  %s = attn.scores %q, %k : tensor<?x64x?x64xbf16>, tensor<?x8x?x64xbf16> -> !attn.scores<?x64x?x?xf32>
  %w = attn.mask sliding_window %s {align = "bottom_right", left = 127, right = 0} : !attn.scores<?x64x?x?xf32>
  %p = attn.softmax %w sinks %sinks : !attn.scores<?x64x?x?xf32>, tensor<64xbf16> -> !attn.probs<?x64x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x64x?x?xf32>, tensor<?x8x?x64xbf16> -> tensor<?x64x?x64xbf16>
  func.return %o : tensor<?x64x?x64xbf16>
}

// -----

// f32 (dots on FMA units, tiles in registers): at most 32 packed rows, 16 keys per block.
// CHECK-LABEL: func.func @wide(
// CHECK:         split_kv = #attn.split_kv<32x16, group 4, splits auto, waves 1, min_blocks 1, merge 1>
func.func @wide(%q: tensor<?x8x?x256xf32>, %k: tensor<?x2x?x256xf32>, %v: tensor<?x2x?x256xf32>) -> tensor<?x8x?x256xf32> {
  %s = attn.scores %q, %k : tensor<?x8x?x256xf32>, tensor<?x2x?x256xf32> -> !attn.scores<?x8x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x2x?x256xf32> -> tensor<?x8x?x256xf32>
  func.return %o : tensor<?x8x?x256xf32>
}

// -----

// Left alone (the usual forward kernel serves every call; the pass logs why): dropout,
// V heads other than K heads, and a static query length that never fits a tile.
// CHECK-LABEL: func.func @dropout(
// CHECK-NOT:     split_kv
// CHECK:         func.return
// LOWER-LABEL: func.func @dropout(
// LOWER-NOT:     split_kv
// LOWER:         host.launch @dropout_fwd[%grid_m, %grid_bh, %one]
func.func @dropout(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %seed: i64) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %d = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x4x?x?xf32>, i64
  %o = attn.weighted_sum %d, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// CHECK-LABEL: func.func @v_heads(
// CHECK-NOT:     split_kv
// CHECK:         func.return
func.func @v_heads(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x1x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x1x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// CHECK-LABEL: func.func @prefill_only(
// CHECK-NOT:     split_kv
// CHECK:         func.return
func.func @prefill_only(%q: tensor<?x4x512x64xf16>, %k: tensor<?x2x512x64xf16>, %v: tensor<?x2x512x64xf16>) -> tensor<?x4x512x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x512x64xf16>, tensor<?x2x512x64xf16> -> !attn.scores<?x4x512x512xf32>
  %p = attn.softmax %s : !attn.scores<?x4x512x512xf32> -> !attn.probs<?x4x512x512xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x512x512xf32>, tensor<?x2x512x64xf16> -> tensor<?x4x512x64xf16>
  func.return %o : tensor<?x4x512x64xf16>
}
