// lower-to-tile on a paged KV cache (block_table / kv_lens on attn.scores): the host's
// key bound is the block table's max_pages * page_size, the forward and split-KV kernels
// read each sequence's kv_lens entry and gather K/V rows through the block table, and
// lower-backward leaves the program without a backward (inference).
// RUN: attnfuse-opt %s -p 'attn-canonicalize,rope-fusion,online-softmax,mask-tiling{block-m=16 block-n=16},split-kv{block-n=16},lower-backward,lower-to-tile' | filecheck %s

// CHECK-LABEL: func.func @paged(
// CHECK-SAME:    attributes {attnfuse.no_backward = "a paged KV cache (block_table) is for inference: lower-backward builds no backward for it"}
// CHECK:         %max_pages = host.dim %bt[1] : tensor<?x?xi32>
// CHECK-NEXT:    %[[P:.*]] = arith.constant 8 : i32
// CHECK-NEXT:    %kv_len = arith.muli %max_pages, %[[P]] : i32
// CHECK-NEXT:    %num_pages = host.dim %kc[0] : tensor<?x2x8x32xf16>
// The split kernels but the last address the pools with i32 offsets: calls whose pools
// those reach take them. A call whose SMs each walk at most 8 KV blocks (waves x blocks
// per split) takes the short kernel.
// CHECK:         %pools_fit_i32 = host.fits_i32 %kc, %vc : tensor<?x2x8x32xf16>, tensor<?x2x8x32xf16>
// CHECK:         %split_waves = arith.ceildivsi %split_programs, %sms : i32
// CHECK-NEXT:    %blocks_per_sm = arith.muli %split_waves, %blocks_per_split : i32
// CHECK:         %few_blocks = arith.cmpi sle, %blocks_per_sm, %{{.*}} : i32
// CHECK-NEXT:    %short_split = arith.andi %fits_16_rows, %few_blocks : i1
// CHECK-NEXT:    %short_narrow = arith.andi %short_split, %pools_fit_i32 : i1
// CHECK:         host.launch @paged_split_kv_short[%short_split_grid, %split_bh, %one] (%q, %kc, %vc, %out, %lse, %batch, %q_len, %kv_len, %bt, %lens, %num_pages, %o_part, %lse_part, %split_counts, %merge)
// CHECK:         %small_narrow = arith.andi %small_tile, %pools_fit_i32 : i1
// CHECK:         %small_split_grid = arith.select %small_narrow, %after_short_grid, %{{.*}} : i32
// CHECK:         host.launch @paged_split_kv_small[%small_split_grid, %split_bh, %one] (%q, %kc, %vc, %out, %lse, %batch, %q_len, %kv_len, %bt, %lens, %num_pages, %o_part, %lse_part, %split_counts, %merge)
// CHECK:         %full_split_grid = arith.select %pools_fit_i32, %after_small_grid, %{{.*}} : i32
// CHECK:         %after_full_grid = arith.select %pools_fit_i32, %{{.*}}, %after_small_grid : i32
// CHECK-NEXT:    host.launch @paged_split_kv[%full_split_grid, %split_bh, %one] (%q, %kc, %vc, %out, %lse, %batch, %q_len, %kv_len, %bt, %lens, %num_pages, %o_part, %lse_part)
// CHECK-NEXT:    host.launch @paged_split_kv_i64[%after_full_grid, %split_bh, %one] (%q, %kc, %vc, %out, %lse, %batch, %q_len, %kv_len, %bt, %lens, %num_pages, %o_part, %lse_part)
// Neither full tile merges: a call that takes either combines.
// CHECK:         %full_tile_splits = arith.cmpi sgt, %full_split_grid, %{{.*}} : i32
// CHECK:         %full_tile_splits_1 = arith.cmpi sgt, %after_full_grid, %{{.*}} : i32
// CHECK:         host.launch @paged_fwd[%grid_m_1, %grid_bh, %one] (%q, %kc, %vc, %out, %lse, %batch, %q_len, %kv_len, %bt, %lens, %num_pages)
// CHECK-NOT:     @paged_backward

// The forward kernel: the sequence's keys, clamped to the block table's; pool rows per key.
// CHECK-LABEL: tile.kernel @paged_fwd(
// CHECK:         %kv_seq_len = tile.load %kv_lens[%{{.*}}] : !tile.ptr<i32>, i32 -> i32
// CHECK:         %kv_len = arith.minsi %{{.*}}, %Skv : i32
// CHECK:         %diag = arith.subi %kv_len, %Sq : i32
// Full tiles: every key in range, no mask on the block-table load; the diagonal's
// masked tiles mask it by the sequence's length.
// CHECK:         %page_slot = arith.divsi %cols, %{{.*}} : tensor<16xi32>
// CHECK:         %page_row = arith.remsi %cols, %{{.*}} : tensor<16xi32>
// CHECK:         %page = tile.load %block_table_base[%{{.*}}] : !tile.ptr<i32>, tensor<16xi32> -> tensor<16xi32>
// CHECK:         %page_in_pool = arith.minsi %{{.*}}, %{{.*}} : tensor<16xi32>
// CHECK:         %K_rows = arith.addi
// CHECK:         %V_rows = arith.addi
// CHECK:         %col_ok = tile.cmp lt, %cols_1, %{{.*}} : tensor<16xi32> -> tensor<16xi1>
// CHECK:         %page_1 = tile.load %block_table_base[%{{.*}}] mask %col_ok other %{{.*}} : !tile.ptr<i32>, tensor<16xi32> -> tensor<16xi32>
// The split kernels (short, 16-row and full-tile) read their sequence's keys the same
// way; the short one walks its split in one masked loop at three stages. Their tiles
// (16 keys, two pages of 8) start at multiples of 16: the in-page rows are the same for
// every tile, the page slots the tile's first slot plus the key's, the offsets i32.
// CHECK-LABEL: tile.kernel @paged_split_kv_short(
// CHECK-SAME:    num_stages = 3
// CHECK:         %kv_seq_len = tile.load %kv_lens
// CHECK:         %page_row = arith.remsi %packed, %{{.*}} : tensor<16xi32>
// CHECK:         scf.for %start_n =
// CHECK:           %col_ok = tile.cmp lt
// CHECK:           %page_slot = arith.addi %{{.*}}, %{{.*}} : tensor<16xi32>
// CHECK:           %K_rows = arith.addi %{{.*}}, %{{.*}} : tensor<16xi32>
// CHECK-NOT:     scf.for %start_n
// CHECK-LABEL: tile.kernel @paged_split_kv_small(
// CHECK:         %kv_seq_len = tile.load %kv_lens
// CHECK:         %K_rows = arith.addi %{{.*}}, %{{.*}} : tensor<16xi32>
// CHECK-LABEL: tile.kernel @paged_split_kv(
// CHECK:         %kv_seq_len = tile.load %kv_lens
// CHECK:         %K_rows = arith.addi %{{.*}}, %{{.*}} : tensor<16xi32>
// CHECK-LABEL: tile.kernel @paged_split_kv_i64(
// CHECK:         %kv_seq_len = tile.load %kv_lens
// CHECK:         %page_row = arith.remsi %cols, %{{.*}} : tensor<16xi32>
// CHECK:         %K_rows = arith.addi %{{.*}}, %{{.*}} : tensor<16xi64>
func.func @paged(%q: tensor<?x4x?x32xf16>, %kc: tensor<?x2x8x32xf16>, %vc: tensor<?x2x8x32xf16>,
                 %bt: tensor<?x?xi32>, %lens: tensor<?xi32>) -> tensor<?x4x?x32xf16> {
  %s = attn.scores %q, %kc block_table %bt kv_lens %lens : tensor<?x4x?x32xf16>, tensor<?x2x8x32xf16>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %vc : !attn.probs<?x4x?x?xf32>, tensor<?x2x8x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}
