// lower-to-tile on a packed batch (cu_seqlens on attn.scores): schedule kernels list the
// (sequence, block) slots from cu_seqlens, the grid counts slots from shapes alone, and
// every kernel offsets its per-token tensors by its sequence's start and works on local rows.
// RUN: attnfuse-opt %s -p 'attn-canonicalize,rope-fusion{strategy=hybrid},online-softmax,mask-tiling{block-m=64 block-n=32},lower-to-tile' | filecheck %s --check-prefix=HYBRID
// RUN: attnfuse-opt %s -p 'attn-canonicalize,rope-fusion{strategy=fused},online-softmax,mask-tiling{block-m=64 block-n=32},lower-to-tile' | filecheck %s --check-prefix=FUSED

// Llama-style GQA with RoPE, causal aligned bottom-right within each sequence.

// HYBRID-LABEL: func.func @packed(
// HYBRID:         %k_transformed = host.alloc %kv_len : tensor<1x2x?x64xf16>
// The K pre-kernel walks 64-row blocks of every key sequence: slots (Tk + N * 63) // 64.
// HYBRID-NEXT:    %cu_k_entries = host.dim %cu_k[0] : tensor<?xi32>
// HYBRID-NEXT:    %[[ONE:.*]] = arith.constant 1 : i32
// HYBRID-NEXT:    %k_sequences = arith.subi %cu_k_entries, %[[ONE]] : i32
// HYBRID-NEXT:    %[[C63:.*]] = arith.constant 63 : i32
// HYBRID-NEXT:    %[[SPARE:.*]] = arith.muli %k_sequences, %[[C63]] : i32
// HYBRID-NEXT:    %[[BOUND:.*]] = arith.addi %kv_len, %[[SPARE]] : i32
// HYBRID-NEXT:    %[[C64:.*]] = arith.constant 64 : i32
// HYBRID-NEXT:    %k_slots64 = arith.divsi %[[BOUND]], %[[C64]] : i32
// HYBRID-NEXT:    %k_schedule64 = host.alloc %k_slots64 : tensor<?x2xi32>
// HYBRID:         host.launch @packed_schedule_k64[%cu_k_entries, %{{.*}}, %{{.*}}] (%cu_k, %kv_len, %k_schedule64, %k_slots64) : tensor<?xi32>, i32, tensor<?x2xi32>, i32
// HYBRID:         host.launch @packed_k_prologue[%k_slots64, %k_grid_bh, %one] (%k, %k_transformed, %rope_table, %batch, %kv_len, %k_schedule64, %cu_k)
// HYBRID:         %q_slots64 = arith.divsi
// HYBRID:         host.launch @packed_schedule_q64[%cu_q_entries, {{.*}}] (%cu_q, %q_len, %q_schedule64, %q_slots64)
// HYBRID:         host.launch @packed_fwd[%q_slots64, %grid_bh, %one] (%q, %k_transformed, %v, %out, %lse, %{{.*}}, %batch, %q_len, %kv_len, %q_schedule64, %cu_q, %cu_k)
// HYBRID-NEXT:    func.return %out, %lse
// HYBRID-NOT:     block_map

// The pre-kernel: its slot names a sequence and a block; X and Y start at the sequence.
// HYBRID-LABEL: tile.kernel @packed_k_prologue(
// HYBRID-SAME:      %schedule: !tile.ptr<i32>, %schedule_stride0: i32, %schedule_stride1: i32, %cu_seqlens_k: !tile.ptr<i32>, %cu_seqlens_k_stride0: i32)
// HYBRID:         %pid_s = tile.program_id 0 : i32
// HYBRID:         %seq = tile.load %schedule[%{{.*}}] : !tile.ptr<i32>, i32 -> i32
// HYBRID:         %seq_block = tile.load %schedule[%{{.*}}] : !tile.ptr<i32>, i32 -> i32
// HYBRID:         %real = arith.cmpi sge, %seq, %{{.*}} : i32
// HYBRID:         tile.load %cu_seqlens_k[%{{.*}}] mask %real other %{{.*}} : !tile.ptr<i32>, i32 -> i32
// HYBRID:         %k_seq_start = arith.minsi %{{.*}}, %S : i32
// HYBRID:         %k_seq_len = arith.subi %{{.*}}, %k_seq_start : i32
// HYBRID:         %[[START:.*]] = arith.muli %seq_block, %{{.*}} : i32
// HYBRID:         %rows = arith.addi %{{.*}}, %{{.*}} : tensor<64xi32>
// HYBRID:         %[[LEN:.*]] = tile.splat %k_seq_len : i32 -> tensor<64xi32>
// HYBRID-NEXT:    %row_ok = tile.cmp lt, %rows, %[[LEN]] : tensor<64xi32> -> tensor<64xi1>
// HYBRID:         %[[X0:.*]] = arith.extsi %k_seq_start : i32 to i64
// HYBRID-NEXT:    %[[XS:.*]] = arith.extsi %X_stride2 : i32 to i64
// HYBRID-NEXT:    %[[XO:.*]] = arith.muli %[[X0]], %[[XS]] : i64
// HYBRID-NEXT:    %[[XB:.*]] = arith.addi %{{.*}}, %[[XO]] : i64
// HYBRID-NEXT:    %X_base = tile.ptr_add %X, %[[XB]] : !tile.ptr<f16>, i64
// HYBRID:         %[[Y0:.*]] = arith.extsi %k_seq_start : i32 to i64
// HYBRID-NEXT:    %[[YS:.*]] = arith.extsi %Y_stride2 : i32 to i64

// The forward: Q, Out and LSE start at the query sequence, K and V at the key sequence;
// the band's diagonal is the sequence's own kv_len - q_len.
// HYBRID-LABEL: tile.kernel @packed_fwd(
// HYBRID-SAME:      %schedule: !tile.ptr<i32>, %schedule_stride0: i32, %schedule_stride1: i32, %cu_seqlens_q: !tile.ptr<i32>, %cu_seqlens_q_stride0: i32, %cu_seqlens_k: !tile.ptr<i32>, %cu_seqlens_k_stride0: i32)
// HYBRID:         %pid_m = tile.program_id 0 : i32
// HYBRID-NEXT:    %[[ROW:.*]] = arith.muli %pid_m, %schedule_stride0 : i32
// HYBRID-NEXT:    %seq = tile.load %schedule[%[[ROW]]] : !tile.ptr<i32>, i32 -> i32
// HYBRID:         tile.load %cu_seqlens_q
// HYBRID:         %q_seq_start = arith.minsi
// HYBRID:         %q_seq_len = arith.subi
// HYBRID:         tile.load %cu_seqlens_k
// HYBRID:         %k_seq_start = arith.minsi
// HYBRID:         %k_seq_len = arith.subi
// HYBRID:         %q_start = arith.muli %seq_block, %{{.*}} : i32
// HYBRID:         %[[Q0:.*]] = arith.extsi %q_seq_start : i32 to i64
// HYBRID-NEXT:    %[[QS:.*]] = arith.extsi %Q_stride2 : i32 to i64
// HYBRID-NEXT:    %[[QO:.*]] = arith.muli %[[Q0]], %[[QS]] : i64
// HYBRID-NEXT:    %[[QB:.*]] = arith.addi %{{.*}}, %[[QO]] : i64
// HYBRID-NEXT:    %Q_base = tile.ptr_add %Q, %[[QB]] : !tile.ptr<f16>, i64
// HYBRID:         %K_base = tile.ptr_add %K,
// HYBRID:         %V_base = tile.ptr_add %V,
// HYBRID:         %diag = arith.subi %k_seq_len, %q_seq_len : i32
// HYBRID:         scf.for %start_n = %{{.*}} to %full_hi
// HYBRID:         %[[O0:.*]] = arith.extsi %q_seq_start : i32 to i64
// HYBRID-NEXT:    %[[OS:.*]] = arith.extsi %Out_stride2 : i32 to i64
// HYBRID:         %Out_base = tile.ptr_add %Out,
// HYBRID:         %[[L0:.*]] = arith.extsi %q_seq_start : i32 to i64
// HYBRID-NEXT:    %[[LS:.*]] = arith.extsi %LSE_stride2 : i32 to i64
// HYBRID:         %LSE_base = tile.ptr_add %LSE,

// The schedule kernel: one program per sequence (and one for the padding slots).
// HYBRID-LABEL: tile.kernel @packed_schedule_k64(%cu_seqlens: !tile.ptr<i32>, %cu_seqlens_stride0: i32, %tokens: i32, %schedule: !tile.ptr<i32>, %schedule_stride0: i32, %schedule_stride1: i32, %slots: i32)
// HYBRID:         %seq = tile.program_id 0 : i32
// HYBRID:         %first = scf.for %j0 = %{{.*}} to %seq step %{{.*}} iter_args(%{{.*}}) -> (i32) : i32 {
// HYBRID:           tile.reduce sum
// HYBRID:         %count = arith.select %real, %{{.*}}, %{{.*}} : i32
// HYBRID:         %value = arith.select %real, %seq, %{{.*}} : i32
// HYBRID:         scf.for %k0 = %{{.*}} to %count step %{{.*}} : i32 {
// HYBRID:           tile.store %schedule[%{{.*}}], %{{.*}} mask %{{.*}}
// HYBRID:           tile.store %schedule[%{{.*}}], %{{.*}} mask %{{.*}}

// fused: no pre-kernel, one schedule (the queries'), K rotated in the forward by local rows.
// FUSED-LABEL: func.func @packed(
// FUSED-NOT:     _prologue
// FUSED-NOT:     schedule_k
// FUSED:         host.launch @packed_schedule_q64
// FUSED:         host.launch @packed_fwd[%q_slots64, %grid_bh, %one] (%q, %k, %v, %out, %lse,
func.func @packed(%q: tensor<1x4x?x64xf16>, %k: tensor<1x2x?x64xf16>, %v: tensor<1x2x?x64xf16>, %cu_q: tensor<?xi32>, %cu_k: tensor<?xi32>) -> tensor<1x4x?x64xf16> {
  %qr = attn.rope %q {theta = 10000.0} : tensor<1x4x?x64xf16>
  %kr = attn.rope %k {theta = 10000.0} : tensor<1x2x?x64xf16>
  %s = attn.scores %qr, %kr cu_seqlens_q %cu_q cu_seqlens_k %cu_k : tensor<1x4x?x64xf16>, tensor<1x2x?x64xf16>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<1x2x?x64xf16> -> tensor<1x4x?x64xf16>
  func.return %o : tensor<1x4x?x64xf16>
}
