// lower-backward: the @f_backward host function (its arguments, launches, results and
// attnfuse.grad_of) and the tile kernels it launches (preprocess, dQ, dK/dV, and with
// hybrid/separate the recomputed pre-kernels and their transposes) of the Triton path
// (`hopper-backward=false`; the Hopper schedule's guarded path is checked in
// tests/lowering/test_hopper_backward.py).
// --verify-diagnostics: the last chunk's error must match its expected-error annotation.
// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics -p 'attn-canonicalize,rope-fusion{strategy=fused},online-softmax,mask-tiling{block-m=16 block-n=16},lower-backward{block-m=16 block-n=16 transforms-in-kernel=true}' | filecheck %s --check-prefix=FUSED
// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics -p 'attn-canonicalize,rope-fusion{strategy=hybrid},online-softmax,mask-tiling{block-m=16 block-n=16},lower-backward{block-m=16 block-n=16 rotate-in-epilogue=false hopper-backward=false}' | filecheck %s --check-prefix=HYBRID
// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics -p 'attn-canonicalize,rope-fusion{strategy=separate},online-softmax,mask-tiling{block-m=16 block-n=16},lower-backward{block-m=16 block-n=16 rotate-in-epilogue=false hopper-backward=false}' | filecheck %s --check-prefix=SEPARATE
// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics -p 'attn-canonicalize,rope-fusion{strategy=hybrid},online-softmax,mask-tiling{block-m=16 block-n=16},lower-backward{block-m=16 block-n=16 rotate-in-epilogue=true hopper-backward=false}' | filecheck %s --check-prefix=EPILOGUE
// RUN: not attnfuse-opt %s --split-input-file -p 'attn-canonicalize,rope-fusion,online-softmax,lower-backward' 2>&1 | filecheck %s --check-prefix=PREREQ
// PREREQ: pass 'lower-backward' requires 'mask-tiling' to run earlier in the pipeline

// Llama-style: RoPE on Q and K, GQA (4 query heads, 2 KV heads), causal, f16.
// fused with transforms-in-kernel: the backward rotates inside its kernels; no pre-kernel is launched.

// FUSED-LABEL: func.func @llama(
// FUSED:         attn.online_softmax
// FUSED-LABEL: func.func @llama_backward(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %out: tensor<?x4x?x64xf16>, %lse: tensor<?x4x?xf32>, %d_out: tensor<?x4x?x64xf16>, %d_lse: tensor<?x4x?xf32>)
// FUSED-SAME:      -> (tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16>)
// FUSED-SAME:      attributes {attnfuse.grad_of = [0 : i64, 1 : i64, 2 : i64]}
// FUSED-NEXT:    %batch = host.dim %q[0] : tensor<?x4x?x64xf16>
// FUSED-NEXT:    %q_len = host.dim %q[2] : tensor<?x4x?x64xf16>
// FUSED-NEXT:    %kv_len = host.dim %k[2] : tensor<?x2x?x64xf16>
// FUSED-NOT:     prologue
// FUSED:         %delta = host.alloc %batch, %q_len : tensor<?x4x?xf32>
// FUSED:         host.launch @llama_bwd_preprocess[{{.*}}] (%out, %d_out, %d_lse, %delta, %batch, %q_len)
// FUSED-NOT:     prologue
// FUSED:         %d_q = host.alloc %batch, %q_len : tensor<?x4x?x64xf16>
// FUSED-NEXT:    %d_k = host.alloc %batch, %kv_len : tensor<?x2x?x64xf16>
// FUSED-NEXT:    %d_v = host.alloc %batch, %kv_len : tensor<?x2x?x64xf16>
// FUSED:         %[[GQ:.*]] = arith.ceildivsi %q_len, %{{.*}} : i32
// FUSED:         host.launch @llama_bwd_dq[%[[GQ]], {{.*}}] (%q, %k, %v, %out, %rope_table, %batch, %q_len, %kv_len, %d_out, %lse, %delta, %d_q)
// FUSED:         %[[GK:.*]] = arith.ceildivsi %kv_len, %{{.*}} : i32
// FUSED:         host.launch @llama_bwd_dkdv[%[[GK]], {{.*}}] (%q, %k, %v, %out, %rope_table, %batch, %q_len, %kv_len, %d_out, %lse, %delta, %d_k, %d_v)
// FUSED-NEXT:    func.return %d_q, %d_k, %d_v : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16>, tensor<?x2x?x64xf16>
// FUSED-NEXT:  }
// FUSED-NOT:   tile.kernel @llama_bwd_{{.*}}prologue
// FUSED:       tile.kernel @llama_bwd_preprocess(%Out: !tile.ptr<f16>,
// FUSED:         tile.store %Delta_base
// FUSED-NEXT:    tile.return
// FUSED:       tile.kernel @llama_bwd_dq(%Q: !tile.ptr<f16>,
// FUSED-SAME:      %dQ: !tile.ptr<f16>
// FUSED-SAME:      attributes {num_warps = 4 : i64, num_stages = 2 : i64
// FUSED:         %pid_m = tile.program_id 0 : i32
// FUSED:         %cos = tile.load
// FUSED:         scf.for %start_n
// FUSED:           %cos{{.*}} = tile.load
// FUSED:           %dp = tile.dot
// FUSED:           %ds = arith.mulf
// FUSED:           scf.yield
// FUSED:         tile.store %dQ_base
// FUSED:         tile.return
// FUSED:       tile.kernel @llama_bwd_dkdv(%Q: !tile.ptr<f16>,
// FUSED-SAME:      %dK: !tile.ptr<f16>, {{.*}}%dV: !tile.ptr<f16>
// FUSED:         %pid_n = tile.program_id 0 : i32
// FUSED:         scf.for %g =
// FUSED:           scf.for %start_m =
// FUSED:             %cos{{.*}} = tile.load
// FUSED:             tile.dot
// FUSED:             scf.yield
// FUSED:           scf.yield
// FUSED:         tile.store %dK_base
// FUSED:         tile.store %dV_base
// FUSED:         tile.return

// hybrid (K rotated by a pre-kernel in the forward) and separate: the backward recomputes
// both rotations in pre-kernels, runs the main kernels on them into f32 d(rotated)
// buffers, and the transposes rotate those back into dq / dk. The pre-kernels read cos/sin
// from one f32 table built per call.

// rotate-in-epilogue=true: Q and K carry only RoPE, so dQ and dK/dV rotate their
// gradients back in the epilogue (the full-width gradient split into the two halves by a
// reshape; cos/sin from the same f32 table as the pre-kernels) and
// write dq / dk in the input dtype; no transpose kernels, no f32 buffers.
// EPILOGUE-LABEL: func.func @llama_backward(
// EPILOGUE:         host.launch @llama_bwd_q_prologue[{{.*}}] (%q, %q_transformed, %rope_table, %batch, %q_len)
// EPILOGUE:         %d_q = host.alloc %batch, %q_len : tensor<?x4x?x64xf16>
// EPILOGUE-NEXT:    %d_k = host.alloc %batch, %kv_len : tensor<?x2x?x64xf16>
// EPILOGUE:         host.launch @llama_bwd_dq[{{.*}}] (%q_transformed, %k_transformed, %v, %out, %batch, %q_len, %kv_len, %d_out, %lse, %delta, %d_q, %rope_table)
// EPILOGUE:         host.launch @llama_bwd_dkdv[{{.*}}] (%q_transformed, %k_transformed, %v, %out, %batch, %q_len, %kv_len, %d_out, %lse, %delta, %d_k, %d_v, %rope_table)
// EPILOGUE-NEXT:    func.return %d_q, %d_k, %d_v
// EPILOGUE-NOT:   prologue_transpose
// EPILOGUE:       tile.kernel @llama_bwd_dq(
// EPILOGUE:         tile.reshape %{{.*}} : tensor<16x64xf32> -> tensor<16x2x32xf32>
// EPILOGUE:         %d_a{{.*}} = arith.addf
// EPILOGUE:         %d_b{{.*}} = arith.subf
// EPILOGUE:         tile.store %dQ_base

// HYBRID-LABEL: func.func @llama_backward(
// HYBRID-SAME:      attributes {attnfuse.grad_of = [0 : i64, 1 : i64, 2 : i64]}
// HYBRID:         %q_transformed = host.alloc %batch, %q_len : tensor<?x4x?x64xf16>
// HYBRID:         %rope_table = host.alloc %rope_rows : tensor<1x?x64xf32>
// HYBRID:         host.launch @llama_bwd_rope_table0[{{.*}}] (%rope_table, %table, %rope_rows)
// HYBRID:         host.launch @llama_bwd_q_prologue[{{.*}}] (%q, %q_transformed, %rope_table, %batch, %q_len)
// HYBRID:         %k_transformed = host.alloc %batch, %kv_len : tensor<?x2x?x64xf16>
// HYBRID:         host.launch @llama_bwd_k_prologue[{{.*}}] (%k, %k_transformed, %rope_table, %batch, %kv_len)
// HYBRID:         host.launch @llama_bwd_preprocess[
// HYBRID:         %d_q_rotated = host.alloc %batch, %q_len : tensor<?x4x?x64xf32>
// HYBRID-NEXT:    %d_k_rotated = host.alloc %batch, %kv_len : tensor<?x2x?x64xf32>
// HYBRID-NEXT:    %d_v = host.alloc %batch, %kv_len : tensor<?x2x?x64xf16>
// HYBRID:         host.launch @llama_bwd_dq[{{.*}}] (%q_transformed, %k_transformed, %v, %out, %batch, %q_len, %kv_len, %d_out, %lse, %delta, %d_q_rotated)
// HYBRID:         host.launch @llama_bwd_dkdv[{{.*}}] (%q_transformed, %k_transformed, %v, %out, %batch, %q_len, %kv_len, %d_out, %lse, %delta, %d_k_rotated, %d_v)
// HYBRID:         %d_q = host.alloc %batch, %q_len : tensor<?x4x?x64xf16>
// HYBRID:         host.launch @llama_bwd_q_prologue_transpose[{{.*}}] (%q, %d_q_rotated, %d_q, %rope_table, %batch, %q_len)
// HYBRID:         %d_k = host.alloc %batch, %kv_len : tensor<?x2x?x64xf16>
// HYBRID:         host.launch @llama_bwd_k_prologue_transpose[{{.*}}] (%k, %d_k_rotated, %d_k, %rope_table, %batch, %kv_len)
// HYBRID-NEXT:    func.return %d_q, %d_k, %d_v
// HYBRID:       tile.kernel @llama_bwd_q_prologue(
// HYBRID:       tile.kernel @llama_bwd_k_prologue(
// HYBRID:       tile.kernel @llama_bwd_preprocess(
// HYBRID:       tile.kernel @llama_bwd_dq(
// HYBRID-NOT:     math.cos
// HYBRID:         tile.store %dQ_base
// HYBRID:       tile.kernel @llama_bwd_dkdv(
// HYBRID-NOT:     math.cos
// HYBRID:         tile.store %dK_base
// HYBRID:       tile.kernel @llama_bwd_q_prologue_transpose(
// HYBRID-NOT:     math.cos
// HYBRID:         %cos = tile.load
// HYBRID:         %sin = tile.load
// HYBRID:         tile.return
// HYBRID:       tile.kernel @llama_bwd_k_prologue_transpose(

// SEPARATE-LABEL: func.func @llama_backward(
// SEPARATE:         host.launch @llama_bwd_q_prologue[
// SEPARATE:         host.launch @llama_bwd_k_prologue[
// SEPARATE:         host.launch @llama_bwd_preprocess[
// SEPARATE:         host.launch @llama_bwd_dq[{{.*}}] (%q_transformed, %k_transformed,
// SEPARATE:         host.launch @llama_bwd_dkdv[{{.*}}] (%q_transformed, %k_transformed,
// SEPARATE:         host.launch @llama_bwd_q_prologue_transpose[
// SEPARATE:         host.launch @llama_bwd_k_prologue_transpose[
// SEPARATE-NEXT:    func.return %d_q, %d_k, %d_v
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

// Every learnable operand: a bf16 Q-norm weight, ALiBi slopes, a [1, H, S, S] bias and
// sink logits. The dQ kernel writes per-program partial sums (norm weight columns,
// slopes, sinks) and the full-size dS for the bias; the host finishes each gradient
// with a deterministic host.reduce_sum (keepdim over the bias' broadcast batch dim) and
// converts the weight's back to bf16. grad_of lists the argument of every result.

// FUSED-LABEL: func.func @learn_backward(%q: tensor<?x4x?x32xf32>, %k: tensor<?x2x?x32xf32>, %v: tensor<?x2x?x32xf32>, %wq: tensor<32xbf16>, %slopes: tensor<4xf32>, %bias: tensor<1x4x?x?xf32>, %sinks: tensor<4xf32>, %out: tensor<?x4x?x32xf32>, %lse: tensor<?x4x?xf32>, %d_out: tensor<?x4x?x32xf32>, %d_lse: tensor<?x4x?xf32>)
// FUSED-SAME:      -> (tensor<?x4x?x32xf32>, tensor<?x2x?x32xf32>, tensor<?x2x?x32xf32>, tensor<32xbf16>, tensor<1x4x?x?xf32>, tensor<4xf32>, tensor<4xf32>)
// FUSED-SAME:      attributes {attnfuse.grad_of = [0 : i64, 1 : i64, 2 : i64, 3 : i64, 5 : i64, 4 : i64, 6 : i64]}
// FUSED:         %n_q_blocks = arith.ceildivsi %q_len
// FUSED:         %d_slopes0 = host.alloc %batch, %n_q_blocks : tensor<?x4x?xf32>
// FUSED-NEXT:    %d_bias1 = host.alloc %batch, %q_len, %kv_len zero : tensor<?x4x?x?xf32>
// FUSED-NEXT:    %d_sinks = host.alloc %batch, %n_q_blocks : tensor<?x4x?xf32>
// FUSED:         %q_slots = arith.muli %q_bh, %n_q_blocks : i32
// FUSED:         %d_norm_w_partial0 = host.alloc %q_slots : tensor<?x32xf32>
// FUSED:         host.launch @learn_bwd_dq[{{.*}}] (%q, %k, %v, %out, %wq, %rope_table, %slopes, %bias, %sinks, %batch, %q_len, %kv_len, %d_out, %lse, %delta, %d_q, %d_bias1, %d_slopes0, %d_sinks, %d_norm_w_partial0)
// FUSED:         host.launch @learn_bwd_dkdv[{{.*}}] (%q, %k, %v, %out, %wq, %rope_table, %slopes, %bias, %sinks, %batch, %q_len, %kv_len, %d_out, %lse, %delta, %d_k, %d_v)
// FUSED-NEXT:    %d_norm_w_f32 = host.reduce_sum %d_norm_w_partial0 {dims = {{.*}}} : tensor<?x32xf32> -> tensor<32xf32>
// FUSED-NEXT:    %d_norm_w = host.convert %d_norm_w_f32 : tensor<32xf32> -> tensor<32xbf16>
// FUSED-NEXT:    %d_bias_f32 = host.reduce_sum %d_bias1 {dims = {{.*}}, keepdim} : tensor<?x4x?x?xf32> -> tensor<1x4x?x?xf32>
// FUSED-NEXT:    %d_slopes_f32 = host.reduce_sum %d_slopes0 {dims = {{.*}}} : tensor<?x4x?xf32> -> tensor<4xf32>
// FUSED-NEXT:    %d_sinks_f32 = host.reduce_sum %d_sinks {dims = {{.*}}} : tensor<?x4x?xf32> -> tensor<4xf32>
// FUSED-NEXT:    func.return %d_q, %d_k, %d_v, %d_norm_w, %d_bias_f32, %d_slopes_f32, %d_sinks_f32
// FUSED:       tile.kernel @learn_bwd_dq(
// FUSED-SAME:      %d_bias1: !tile.ptr<f32>
// FUSED-SAME:      %d_slopes0: !tile.ptr<f32>
// FUSED-SAME:      %d_sinks: !tile.ptr<f32>
// FUSED-SAME:      %d_q_norm_w0: !tile.ptr<f32>
// FUSED:         %inv_rms = math.rsqrt
// (both dQ halves start from the same zero tile: CSE merged their two splats)
// FUSED:         scf.for %start_n = {{.*}} iter_args(%dq_a_{{[0-9]+}} = %dq_a, %dq_b_{{[0-9]+}} = %dq_a, %d_slope0_{{[0-9]+}} = %d_slope0)
// FUSED:           tile.store %d_bias1_base
// FUSED:           scf.yield
// FUSED:         tile.store %d_slopes0[
// FUSED:         tile.store %d_sinks[%slot]
// FUSED:         tile.store %dQ_base
// FUSED:         tile.return
// FUSED:       tile.kernel @learn_bwd_dkdv(
// FUSED-NOT:       %d_bias1
// FUSED:         tile.store %dK_base
// FUSED:         tile.store %dV_base

// With pre-kernels the norm-weight partials come from the Q transpose pre-kernel.
// HYBRID-LABEL: func.func @learn_backward(
// HYBRID-SAME:      attributes {attnfuse.grad_of = [0 : i64, 1 : i64, 2 : i64, 3 : i64, 5 : i64, 4 : i64, 6 : i64]}
// HYBRID:         host.launch @learn_bwd_q_prologue[
// HYBRID:         host.launch @learn_bwd_dq[
// HYBRID:         host.launch @learn_bwd_dkdv[
// HYBRID:         %d_q_norm_w0 = host.alloc %q_pre_slots : tensor<?x32xf32>
// HYBRID:         host.launch @learn_bwd_q_prologue_transpose[{{.*}}] (%q, %d_q_rotated, %d_q, %wq, %rope_table, %d_q_norm_w0, %batch, %q_len)
// HYBRID-NEXT:    %d_norm_w_f32 = host.reduce_sum %d_q_norm_w0 {dims
// HYBRID-NEXT:    %d_norm_w = host.convert %d_norm_w_f32 : tensor<32xf32> -> tensor<32xbf16>
// HYBRID:         func.return %d_q, %d_k, %d_v, %d_norm_w, %d_bias_f32, %d_slopes_f32, %d_sinks_f32
func.func @learn(%q: tensor<?x4x?x32xf32>, %k: tensor<?x2x?x32xf32>, %v: tensor<?x2x?x32xf32>,
                 %wq: tensor<32xbf16>, %slopes: tensor<4xf32>, %bias: tensor<1x4x?x?xf32>,
                 %sinks: tensor<4xf32>) -> tensor<?x4x?x32xf32> {
  %qn = attn.qk_norm %q weight %wq {eps = 1.0e-06} : tensor<?x4x?x32xf32>, tensor<32xbf16>
  %qr = attn.rope %qn {theta = 10000.0} : tensor<?x4x?x32xf32>
  %kr = attn.rope %k {theta = 10000.0} : tensor<?x2x?x32xf32>
  %s = attn.scores %qr, %kr : tensor<?x4x?x32xf32>, tensor<?x2x?x32xf32> -> !attn.scores<?x4x?x?xf32>
  %a = attn.bias alibi %s slopes %slopes : !attn.scores<?x4x?x?xf32>, tensor<4xf32>
  %b = attn.bias tensor %a, %bias : !attn.scores<?x4x?x?xf32>, tensor<1x4x?x?xf32>
  %m = attn.mask causal %b : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m sinks %sinks : !attn.scores<?x4x?x?xf32>, tensor<4xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x32xf32> -> tensor<?x4x?x32xf32>
  func.return %o : tensor<?x4x?x32xf32>
}

// -----

// Document masks: the backward has its own runtime block map (built before the dQ kernel);
// dropout: the seed is passed through, the mask regenerated in both kernels; integer
// operands (ids, seed) get no gradient.

// FUSED-LABEL: func.func @doc_backward(
// FUSED-SAME:      attributes {attnfuse.grad_of = [0 : i64, 1 : i64, 2 : i64]}
// FUSED:         host.launch @doc_bwd_preprocess[
// FUSED:         host.launch @doc_bwd_block_map[
// FUSED:         host.launch @doc_bwd_dq[{{.*}}] ({{.*}}%doc, %seed,
// FUSED:         host.launch @doc_bwd_dkdv[{{.*}}] ({{.*}}%doc, %seed,
// FUSED-NEXT:    func.return %d_q, %d_k, %d_v
// FUSED:       tile.kernel @doc_bwd_block_map(
// FUSED:       tile.kernel @doc_bwd_dq(
// FUSED:         %seed_bh =
// FUSED:         tile.return
// FUSED:       tile.kernel @doc_bwd_dkdv(
// FUSED:           %seed_bh =
// FUSED:         tile.return
func.func @doc(%q: tensor<?x2x?x32xbf16>, %k: tensor<?x1x?x32xbf16>, %v: tensor<?x1x?x32xbf16>,
               %doc: tensor<?x?xi32>, %seed: i64) -> tensor<?x2x?x32xbf16> {
  %s = attn.scores %q, %k : tensor<?x2x?x32xbf16>, tensor<?x1x?x32xbf16> -> !attn.scores<?x2x?x?xf32>
  %c = attn.mask causal %s : !attn.scores<?x2x?x?xf32>
  %d = attn.mask document %c, %doc : !attn.scores<?x2x?x?xf32>, tensor<?x?xi32>
  %p = attn.softmax %d : !attn.scores<?x2x?x?xf32> -> !attn.probs<?x2x?x?xf32>
  %pd = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x2x?x?xf32>, i64
  %o = attn.weighted_sum %pd, %v : !attn.probs<?x2x?x?xf32>, tensor<?x1x?x32xbf16> -> tensor<?x2x?x32xbf16>
  func.return %o : tensor<?x2x?x32xbf16>
}

// -----

// K and V with different head counts: the backward refuses (one dK/dV program per KV head),
// reported at attn.scores.
func.func @heads(%q: tensor<?x4x?x32xf32>, %k: tensor<?x2x?x32xf32>, %v: tensor<?x1x?x32xf32>) -> tensor<?x4x?x32xf32> {
  // expected-error @+2 {{'attn.scores' op the backward needs K and V with the same number of heads (K 2, V 1)}}
  // expected-note @+1 {{in pass 'lower-backward'}}
  %s = attn.scores %q, %k : tensor<?x4x?x32xf32>, tensor<?x2x?x32xf32> -> !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x1x?x32xf32> -> tensor<?x4x?x32xf32>
  func.return %o : tensor<?x4x?x32xf32>
}
