// lower-backward on a packed batch: the dQ kernel walks (sequence, q block) slots, the
// dK/dV kernel (sequence, KV block) slots, the recomputed pre-kernels and their transposes
// (sequence, 64-row block) slots; the preprocess is per token and stays as it is.
// RUN: attnfuse-opt %s -p 'attn-canonicalize,rope-fusion{strategy=hybrid},online-softmax,mask-tiling{block-m=64 block-n=32},lower-backward{block-m=32 block-n=32 rotate-in-epilogue=false},lower-to-tile' | filecheck %s

// CHECK-LABEL: func.func @packed_backward(%q: tensor<1x4x?x64xf16>, %k: tensor<1x2x?x64xf16>, %v: tensor<1x2x?x64xf16>, %cu_q: tensor<?xi32>, %cu_k: tensor<?xi32>, %out: tensor<1x4x?x64xf16>, %lse: tensor<1x4x?xf32>, %d_out: tensor<1x4x?x64xf16>, %d_lse: tensor<1x4x?xf32>)
// CHECK-SAME:      attributes {attnfuse.grad_of = [0 : i64, 1 : i64, 2 : i64]}
// CHECK:         host.launch @packed_bwd_schedule_q64[%cu_q_entries, {{.*}}] (%cu_q, %q_len, %q_schedule64, %q_slots64)
// CHECK:         host.launch @packed_bwd_q_prologue[%q_slots64, {{.*}}] (%q, %q_transformed, %rope_table, %batch, %q_len, %q_schedule64, %cu_q)
// CHECK:         host.launch @packed_bwd_schedule_k64[%cu_k_entries, {{.*}}] (%cu_k, %kv_len, %k_schedule64, %k_slots64)
// CHECK:         host.launch @packed_bwd_k_prologue[%k_slots64, {{.*}}] (%k, %k_transformed, %rope_table, %batch, %kv_len, %k_schedule64, %cu_k)
// CHECK:         %[[GRID:.*]] = arith.ceildivsi %q_len, %{{.*}} : i32
// CHECK:         host.launch @packed_bwd_preprocess[%[[GRID]], {{.*}}] (%out, %d_out, %d_lse, %delta, %batch, %q_len)
// CHECK:         host.launch @packed_bwd_schedule_q32[{{.*}}] (%cu_q, %q_len, %q_schedule32, %q_slots32)
// CHECK:         host.launch @packed_bwd_schedule_k32[{{.*}}] (%cu_k, %kv_len, %k_schedule32, %k_slots32)
// CHECK:         host.launch @packed_bwd_dq[%q_slots32, {{.*}}] ({{.*}}, %q_schedule32, %cu_q, %cu_k, %d_out, %lse, %delta, %d_q_rotated)
// CHECK:         host.launch @packed_bwd_dkdv[%k_slots32, {{.*}}] ({{.*}}, %k_schedule32, %cu_q, %cu_k, %d_out, %lse, %delta, %d_k_rotated, %d_v)
// CHECK:         host.launch @packed_bwd_q_prologue_transpose[%q_slots64, {{.*}}] (%q, %d_q_rotated, %d_q, %rope_table, %batch, %q_len, %q_schedule64, %cu_q)
// CHECK:         host.launch @packed_bwd_k_prologue_transpose[%k_slots64, {{.*}}] (%k, %d_k_rotated, %d_k, %rope_table, %batch, %kv_len, %k_schedule64, %cu_k)
// CHECK:         func.return %d_q, %d_k, %d_v

// dQ: the q rows (Q, dO, lse, delta, dQ) start at the query sequence, K and V at the key one.
// CHECK-LABEL: tile.kernel @packed_bwd_dq(
// CHECK:         %pid_m = tile.program_id 0 : i32
// CHECK:         tile.load %cu_seqlens_q
// CHECK:         %q_seq_start = arith.minsi
// CHECK:         tile.load %cu_seqlens_k
// CHECK:         %k_seq_start = arith.minsi
// CHECK:         %q_start = arith.muli %seq_block
// CHECK:         arith.extsi %q_seq_start
// CHECK-NEXT:    arith.extsi %Q_stride2
// CHECK:         %Q_base = tile.ptr_add %Q,
// CHECK:         arith.extsi %k_seq_start
// CHECK-NEXT:    arith.extsi %K_stride2
// CHECK:         %K_base = tile.ptr_add %K,
// CHECK:         arith.extsi %q_seq_start
// CHECK-NEXT:    arith.extsi %dOut_stride2
// CHECK:         %dOut_base = tile.ptr_add %dOut,

// dK/dV: one KV block of one key sequence; its q loop stays within the query sequence.
// CHECK-LABEL: tile.kernel @packed_bwd_dkdv(
// CHECK:         %pid_n = tile.program_id 0 : i32
// CHECK:         %seq = tile.load %schedule
// CHECK:         %n_start = arith.muli %seq_block
// CHECK:         %col_ok = tile.cmp lt, %cols, %{{.*}} : tensor<32xi32> -> tensor<32xi1>
// CHECK:         %[[HI:.*]] = arith.select %{{.*}}, %q_lo, %q_seq_len : i32
// CHECK:         scf.for %start_m = %q_lo to %q_full_lo

// The transpose pre-kernel rotates back by local rows too.
// CHECK-LABEL: tile.kernel @packed_bwd_q_prologue_transpose(
// CHECK:         tile.load %cu_seqlens_q
// CHECK:         %q_seq_start = arith.minsi
// CHECK:         arith.extsi %q_seq_start
// CHECK-NEXT:    arith.extsi %X_stride2
// CHECK:         %X_base = tile.ptr_add %X,
// CHECK:         arith.extsi %q_seq_start
// CHECK-NEXT:    arith.extsi %dY_stride2
// CHECK:         %dY_base = tile.ptr_add %dY,
// CHECK:         arith.extsi %q_seq_start
// CHECK-NEXT:    arith.extsi %dX_stride2
// CHECK:         %dX_base = tile.ptr_add %dX,
func.func @packed(%q: tensor<1x4x?x64xf16>, %k: tensor<1x2x?x64xf16>, %v: tensor<1x2x?x64xf16>, %cu_q: tensor<?xi32>, %cu_k: tensor<?xi32>) -> tensor<1x4x?x64xf16> {
  %qr = attn.rope %q {theta = 10000.0} : tensor<1x4x?x64xf16>
  %kr = attn.rope %k {theta = 10000.0} : tensor<1x2x?x64xf16>
  %s = attn.scores %qr, %kr cu_seqlens_q %cu_q cu_seqlens_k %cu_k : tensor<1x4x?x64xf16>, tensor<1x2x?x64xf16>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<1x2x?x64xf16> -> tensor<1x4x?x64xf16>
  func.return %o : tensor<1x4x?x64xf16>
}
