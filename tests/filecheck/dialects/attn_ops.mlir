// RUN: ATTNFUSE_ROUNDTRIP

// Every attn op, kind and option, printed back after custom -> generic -> custom.
// Options are printed only when written (so defaults given explicitly survive), in the
// op's declaration order, floats in their shortest exact form.

// ==== attn.rope

func.func @rope(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x64xf16>, %pos1: tensor<?xi32>,
                %pos2: tensor<?x?xi64>) -> () {
  %a = attn.rope %q : tensor<?x32x?x128xbf16>
  %b = attn.rope %q {theta = 500000.0, style = "half"} : tensor<?x32x?x128xbf16>
  %c = attn.rope %k {style = interleaved, rotary_dim = 32, offset = 7} : tensor<?x8x?x64xf16>
  %d = attn.rope %k positions %pos1 {placement = "kernel"} : tensor<?x8x?x64xf16>, tensor<?xi32>
  %e = attn.rope %k positions %pos2 {placement = "prekernel"} : tensor<?x8x?x64xf16>, tensor<?x?xi64>
  %f = attn.rope %q {scaling = "linear", factor = 4.0, placement = "auto"} : tensor<?x32x?x128xbf16>
  %g = attn.rope %q {theta = 500000.0, scaling = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 8192} : tensor<?x32x?x128xbf16>
  %h = attn.rope %k {theta = 150000.0, scaling = "yarn", factor = 32.0, original_max_position = 4096, beta_fast = 32.0, beta_slow = 1.0, truncate = 0, attention_factor = 1.25} : tensor<?x8x?x64xf16>
  %i = attn.rope %k {"theta" = 1.0e4 : f64, rotary_dim = 2} : tensor<?x8x?x64xf16>
  %j = attn.rope %k {} : tensor<?x8x?x64xf16>
  func.return
}

// CHECK-LABEL: func.func @rope(
// CHECK-NEXT:    %a = attn.rope %q : tensor<?x32x?x128xbf16>
// CHECK-NEXT:    %b = attn.rope %q {theta = 500000.0, style = "half"} : tensor<?x32x?x128xbf16>
// CHECK-NEXT:    %c = attn.rope %k {style = "interleaved", rotary_dim = 32, offset = 7} : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %d = attn.rope %k positions %pos1 {placement = "kernel"} : tensor<?x8x?x64xf16>, tensor<?xi32>
// CHECK-NEXT:    %e = attn.rope %k positions %pos2 {placement = "prekernel"} : tensor<?x8x?x64xf16>, tensor<?x?xi64>
// CHECK-NEXT:    %f = attn.rope %q {scaling = "linear", factor = 4.0, placement = "auto"} : tensor<?x32x?x128xbf16>
// CHECK-NEXT:    %g = attn.rope %q {theta = 500000.0, scaling = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 8192} : tensor<?x32x?x128xbf16>
// CHECK-NEXT:    %h = attn.rope %k {theta = 150000.0, scaling = "yarn", factor = 32.0, original_max_position = 4096, beta_fast = 32.0, beta_slow = 1.0, truncate = 0, attention_factor = 1.25} : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %i = attn.rope %k {theta = 10000.0, rotary_dim = 2} : tensor<?x8x?x64xf16>
// CHECK-NEXT:    %j = attn.rope %k : tensor<?x8x?x64xf16>
// CHECK-NEXT:    func.return

// -----

// ==== attn.qk_norm

func.func @qk_norm(%q: tensor<?x32x?x128xbf16>, %w: tensor<128xbf16>, %w32: tensor<128xf32>,
                   %wd: tensor<?xf32>) -> () {
  %a = attn.qk_norm %q : tensor<?x32x?x128xbf16>
  %b = attn.qk_norm %q weight %w {eps = 1.0e-06} : tensor<?x32x?x128xbf16>, tensor<128xbf16>
  %c = attn.qk_norm %q weight %w32 {eps = 1.0e-05, weight_offset = 1.0, placement = "prekernel"} : tensor<?x32x?x128xbf16>, tensor<128xf32>
  %d = attn.qk_norm %q weight %wd {eps = 0.0} : tensor<?x32x?x128xbf16>, tensor<?xf32>
  func.return
}

// CHECK-LABEL: func.func @qk_norm(
// CHECK-NEXT:    %a = attn.qk_norm %q : tensor<?x32x?x128xbf16>
// CHECK-NEXT:    %b = attn.qk_norm %q weight %w {eps = 1.0e-06} : tensor<?x32x?x128xbf16>, tensor<128xbf16>
// CHECK-NEXT:    %c = attn.qk_norm %q weight %w32 {eps = 1.0e-05, weight_offset = 1.0, placement = "prekernel"} : tensor<?x32x?x128xbf16>, tensor<128xf32>
// CHECK-NEXT:    %d = attn.qk_norm %q weight %wd {eps = 0.0} : tensor<?x32x?x128xbf16>, tensor<?xf32>
// CHECK-NEXT:    func.return

// -----

// ==== attn.scores and attn.weighted_sum

func.func @scores(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>,
                  %v: tensor<?x8x?x128xbf16>, %q1: tensor<2x4x16x96xf32>,
                  %k1: tensor<2x1x24x96xf32>, %v1: tensor<2x1x24x80xf32>) -> () {
  %s = attn.scores %q, %k : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
  %t = attn.scores %q, %k {scale = 0.0625} : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
  %p = attn.softmax %t : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  // MQA, static shapes, and a V head dim (80) different from the QK one (96).
  %s1 = attn.scores %q1, %k1 {scale = 1.0} : tensor<2x4x16x96xf32>, tensor<2x1x24x96xf32> -> !attn.scores<2x4x16x24xf32>
  %p1 = attn.softmax %s1 : !attn.scores<2x4x16x24xf32> -> !attn.probs<2x4x16x24xf32>
  %o1 = attn.weighted_sum %p1, %v1 : !attn.probs<2x4x16x24xf32>, tensor<2x1x24x80xf32> -> tensor<2x4x16x80xf32>
  func.return
}

// CHECK-LABEL: func.func @scores(
// CHECK-NEXT:    %s = attn.scores %q, %k : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
// CHECK-NEXT:    %t = attn.scores %q, %k {scale = 0.0625} : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<?x32x?x?xf32>
// CHECK-NEXT:    %p = attn.softmax %t : !attn.scores<?x32x?x?xf32> -> !attn.probs<?x32x?x?xf32>
// CHECK-NEXT:    %o = attn.weighted_sum %p, %v : !attn.probs<?x32x?x?xf32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
// CHECK-NEXT:    %s1 = attn.scores %q1, %k1 {scale = 1.0} : tensor<2x4x16x96xf32>, tensor<2x1x24x96xf32> -> !attn.scores<2x4x16x24xf32>
// CHECK-NEXT:    %p1 = attn.softmax %s1 : !attn.scores<2x4x16x24xf32> -> !attn.probs<2x4x16x24xf32>
// CHECK-NEXT:    %o1 = attn.weighted_sum %p1, %v1 : !attn.probs<2x4x16x24xf32>, tensor<2x1x24x80xf32> -> tensor<2x4x16x80xf32>
// CHECK-NEXT:    func.return

// -----

// ==== attn.bias

func.func @bias(%s: !attn.scores<?x12x?x?xf32>, %slopes: tensor<12xf32>,
                %full: tensor<?x12x?x?xf32>, %t5: tensor<1x12x?x?xf32>,
                %row: tensor<?x1x1x?xbf16>) -> () {
  %a = attn.bias alibi %s : !attn.scores<?x12x?x?xf32>
  %b = attn.bias alibi %s {max_bias = 16.0} : !attn.scores<?x12x?x?xf32>
  %c = attn.bias alibi %s slopes %slopes : !attn.scores<?x12x?x?xf32>, tensor<12xf32>
  %d = attn.bias tensor %s, %full : !attn.scores<?x12x?x?xf32>, tensor<?x12x?x?xf32>
  %e = attn.bias tensor %s, %t5 : !attn.scores<?x12x?x?xf32>, tensor<1x12x?x?xf32>
  %f = attn.bias tensor %s, %row : !attn.scores<?x12x?x?xf32>, tensor<?x1x1x?xbf16>
  func.return
}

// CHECK-LABEL: func.func @bias(
// CHECK-NEXT:    %a = attn.bias alibi %s : !attn.scores<?x12x?x?xf32>
// CHECK-NEXT:    %b = attn.bias alibi %s {max_bias = 16.0} : !attn.scores<?x12x?x?xf32>
// CHECK-NEXT:    %c = attn.bias alibi %s slopes %slopes : !attn.scores<?x12x?x?xf32>, tensor<12xf32>
// CHECK-NEXT:    %d = attn.bias tensor %s, %full : !attn.scores<?x12x?x?xf32>, tensor<?x12x?x?xf32>
// CHECK-NEXT:    %e = attn.bias tensor %s, %t5 : !attn.scores<?x12x?x?xf32>, tensor<1x12x?x?xf32>
// CHECK-NEXT:    %f = attn.bias tensor %s, %row : !attn.scores<?x12x?x?xf32>, tensor<?x1x1x?xbf16>
// CHECK-NEXT:    func.return

// -----

// ==== attn.softcap

func.func @softcap(%s: !attn.scores<?x16x?x?xf32>) -> !attn.scores<?x16x?x?xf32> {
  %c = attn.softcap %s {cap = 50.0} : !attn.scores<?x16x?x?xf32>
  %d = attn.softcap %c {cap = 3.0e1} : !attn.scores<?x16x?x?xf32>
  func.return %d : !attn.scores<?x16x?x?xf32>
}

// CHECK-LABEL: func.func @softcap(
// CHECK-NEXT:    %c = attn.softcap %s {cap = 50.0} : !attn.scores<?x16x?x?xf32>
// CHECK-NEXT:    %d = attn.softcap %c {cap = 30.0} : !attn.scores<?x16x?x?xf32>
// CHECK-NEXT:    func.return %d : !attn.scores<?x16x?x?xf32>

// -----

// ==== attn.mask

func.func @mask(%s: !attn.scores<?x8x?x?xf32>, %ids: tensor<?x?xi32>, %kv_ids: tensor<?x?xi64>,
                %plen: tensor<?xi32>, %lim: tensor<8xi32>) -> () {
  %a = attn.mask causal %s : !attn.scores<?x8x?x?xf32>
  %b = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x8x?x?xf32>
  %c = attn.mask causal %s {align = "top_left"} : !attn.scores<?x8x?x?xf32>
  %d = attn.mask sliding_window %s {left = 4095} : !attn.scores<?x8x?x?xf32>
  %e = attn.mask sliding_window %s {right = 0} : !attn.scores<?x8x?x?xf32>
  %f = attn.mask sliding_window %s {align = "bottom_right", left = 127, right = 127} : !attn.scores<?x8x?x?xf32>
  %g = attn.mask document %s, %ids : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
  %h = attn.mask document %s, %ids, %kv_ids : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>, tensor<?x?xi64>
  %i = attn.mask prefix_lm %s {prefix = 16} : !attn.scores<?x8x?x?xf32>
  %j = attn.mask prefix_lm %s, %plen : !attn.scores<?x8x?x?xf32>, tensor<?xi32>
  %k = attn.mask custom %s : !attn.scores<?x8x?x?xf32> {
  ^bb0(%b0: index, %h0: index, %qi: index, %ki: index):
    %keep = arith.cmpi sge, %qi, %ki : index
    attn.yield %keep : i1
  }
  %l = attn.mask custom %s, %lim : !attn.scores<?x8x?x?xf32>, tensor<8xi32> {
  ^bb0(%b1: index, %h1: index, %qi1: index, %ki1: index, %t: tensor<8xi32>):
    %n = tensor.extract %t[%h1] : tensor<8xi32>
    %ni = arith.index_cast %n : i32 to index
    %keep1 = arith.cmpi slt, %ki1, %ni : index
    attn.yield %keep1 : i1
  }
  func.return
}

// CHECK-LABEL: func.func @mask(
// CHECK-NEXT:    %a = attn.mask causal %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %b = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %c = attn.mask causal %s {align = "top_left"} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %d = attn.mask sliding_window %s {left = 4095} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %e = attn.mask sliding_window %s {right = 0} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %f = attn.mask sliding_window %s {align = "bottom_right", left = 127, right = 127} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %g = attn.mask document %s, %ids : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
// CHECK-NEXT:    %h = attn.mask document %s, %ids, %kv_ids : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>, tensor<?x?xi64>
// CHECK-NEXT:    %i = attn.mask prefix_lm %s {prefix = 16} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %j = attn.mask prefix_lm %s, %plen : !attn.scores<?x8x?x?xf32>, tensor<?xi32>
// CHECK-NEXT:    %k = attn.mask custom %s : !attn.scores<?x8x?x?xf32> {
// CHECK-NEXT:    ^bb0(%b0: index, %h0: index, %qi: index, %ki: index):
// CHECK-NEXT:      %keep = arith.cmpi sge, %qi, %ki : index
// CHECK-NEXT:      attn.yield %keep : i1
// CHECK-NEXT:    }
// CHECK-NEXT:    %l = attn.mask custom %s, %lim : !attn.scores<?x8x?x?xf32>, tensor<8xi32> {
// CHECK-NEXT:    ^bb0(%b1: index, %h1: index, %qi1: index, %ki1: index, %t: tensor<8xi32>):
// CHECK-NEXT:      %n = tensor.extract %t[%h1] : tensor<8xi32>
// CHECK-NEXT:      %ni = arith.index_cast %n : i32 to index
// CHECK-NEXT:      %keep1 = arith.cmpi slt, %ki1, %ni : index
// CHECK-NEXT:      attn.yield %keep1 : i1
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return

// -----

// ==== attn.score_mod

func.func @score_mod(%s: !attn.scores<?x8x?x?xf32>, %tab: tensor<8xf32>) -> () {
  // Grok-style tanh soft-cap written by hand, and a per-head learned scale (captured).
  %a = attn.score_mod %s : !attn.scores<?x8x?x?xf32> {
  ^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index):
    %c = arith.constant 3.000000e+01 : f32
    %y = arith.divf %x, %c : f32
    %t = math.tanh %y : f32
    %z = arith.mulf %t, %c : f32
    attn.yield %z : f32
  }
  %m = attn.score_mod %a, %tab : !attn.scores<?x8x?x?xf32>, tensor<8xf32> {
  ^bb0(%x1: f32, %b1: index, %h1: index, %qi1: index, %ki1: index, %tb: tensor<8xf32>):
    %w = tensor.extract %tb[%h1] : tensor<8xf32>
    %y1 = arith.mulf %x1, %w : f32
    attn.yield %y1 : f32
  }
  func.return
}

// CHECK-LABEL: func.func @score_mod(
// CHECK-NEXT:    %a = attn.score_mod %s : !attn.scores<?x8x?x?xf32> {
// CHECK-NEXT:    ^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index):
// CHECK-NEXT:      %c = arith.constant 3.000000e+01 : f32
// CHECK-NEXT:      %y = arith.divf %x, %c : f32
// CHECK-NEXT:      %t = math.tanh %y : f32
// CHECK-NEXT:      %z = arith.mulf %t, %c : f32
// CHECK-NEXT:      attn.yield %z : f32
// CHECK-NEXT:    }
// CHECK-NEXT:    %m = attn.score_mod %a, %tab : !attn.scores<?x8x?x?xf32>, tensor<8xf32> {
// CHECK-NEXT:    ^bb0(%x1: f32, %b1: index, %h1: index, %qi1: index, %ki1: index, %tb: tensor<8xf32>):
// CHECK-NEXT:      %w = tensor.extract %tb[%h1] : tensor<8xf32>
// CHECK-NEXT:      %y1 = arith.mulf %x1, %w : f32
// CHECK-NEXT:      attn.yield %y1 : f32
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return

// -----

// ==== attn.softmax

func.func @softmax(%s: !attn.scores<?x64x?x?xf32>, %sinks: tensor<64xf32>,
                   %sinks16: tensor<64xbf16>) -> () {
  %p = attn.softmax %s : !attn.scores<?x64x?x?xf32> -> !attn.probs<?x64x?x?xf32>
  %p1, %lse1 = attn.softmax %s : !attn.scores<?x64x?x?xf32> -> !attn.probs<?x64x?x?xf32>, tensor<?x64x?xf32>
  %p2 = attn.softmax %s sinks %sinks : !attn.scores<?x64x?x?xf32>, tensor<64xf32> -> !attn.probs<?x64x?x?xf32>
  %p3, %lse3 = attn.softmax %s sinks %sinks16 : !attn.scores<?x64x?x?xf32>, tensor<64xbf16> -> !attn.probs<?x64x?x?xf32>, tensor<?x64x?xf32>
  func.return
}

// CHECK-LABEL: func.func @softmax(
// CHECK-NEXT:    %p = attn.softmax %s : !attn.scores<?x64x?x?xf32> -> !attn.probs<?x64x?x?xf32>
// CHECK-NEXT:    %p1, %lse1 = attn.softmax %s : !attn.scores<?x64x?x?xf32> -> !attn.probs<?x64x?x?xf32>, tensor<?x64x?xf32>
// CHECK-NEXT:    %p2 = attn.softmax %s sinks %sinks : !attn.scores<?x64x?x?xf32>, tensor<64xf32> -> !attn.probs<?x64x?x?xf32>
// CHECK-NEXT:    %p3, %lse3 = attn.softmax %s sinks %sinks16 : !attn.scores<?x64x?x?xf32>, tensor<64xbf16> -> !attn.probs<?x64x?x?xf32>, tensor<?x64x?xf32>
// CHECK-NEXT:    func.return

// -----

// ==== attn.dropout

func.func @dropout(%p: !attn.probs<?x12x?x?xf32>, %seed: i64) -> !attn.probs<?x12x?x?xf32> {
  %a = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x12x?x?xf32>, i64
  %b = attn.dropout %a, %seed {p = 0.0} : !attn.probs<?x12x?x?xf32>, i64
  func.return %b : !attn.probs<?x12x?x?xf32>
}

// CHECK-LABEL: func.func @dropout(
// CHECK-NEXT:    %a = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x12x?x?xf32>, i64
// CHECK-NEXT:    %b = attn.dropout %a, %seed {p = 0.0} : !attn.probs<?x12x?x?xf32>, i64
// CHECK-NEXT:    func.return %b : !attn.probs<?x12x?x?xf32>

// -----

// ==== attn.online_softmax and #attn.tile_plan (made by passes; clauses in any order,
// printed in a fixed one, `top_left` and `?` bounds as written defaults)

func.func @online_softmax(%s: !attn.scores<?x4x?x?xf32>, %v: tensor<?x2x?x64xf16>, %sk: tensor<4xf32>,
                          %seed: i64) -> () {
  %a = attn.online_softmax %s, %v : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  %b = attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<128x64>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  %c = attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<64x32, exact, band [-4095, 0] top_left>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  %d = attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<16x16, prefix -1, band [?, 0] bottom_right, exact>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  %e, %lse = attn.online_softmax %s, %v sinks %sk dropout_seed %seed {dropout_p = 0.1, tile_plan = #attn.tile_plan<128x128, band [-64, ?], runtime_block_map>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16>, tensor<4xf32>, i64 -> tensor<?x4x?x64xf16>, tensor<?x4x?xf32>
  func.return
}

// CHECK-LABEL: func.func @online_softmax(
// CHECK-NEXT:    %a = attn.online_softmax %s, %v : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
// CHECK-NEXT:    %b = attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<128x64>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
// CHECK-NEXT:    %c = attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<64x32, band [-4095, 0], exact>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
// CHECK-NEXT:    %d = attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<16x16, band [?, 0] bottom_right, exact, prefix -1>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
// CHECK-NEXT:    %e, %lse = attn.online_softmax %s, %v sinks %sk dropout_seed %seed {dropout_p = 0.1, tile_plan = #attn.tile_plan<128x128, band [-64, ?], runtime_block_map>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16>, tensor<4xf32>, i64 -> tensor<?x4x?x64xf16>, tensor<?x4x?xf32>
// CHECK-NEXT:    func.return

// -----

// ==== a whole program using every op

func.func @everything(%q: tensor<?x8x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x32xf16>,
                      %pos: tensor<?x?xi32>, %w: tensor<64xf32>, %bias: tensor<1x8x?x?xf32>,
                      %ids: tensor<?x?xi32>, %sinks: tensor<8xf32>, %seed: i64,
                      %tab: tensor<8xf32>) -> (tensor<?x8x?x32xf16>, tensor<?x8x?xf32>) {
  %qn = attn.qk_norm %q weight %w {eps = 1.0e-05} : tensor<?x8x?x64xf16>, tensor<64xf32>
  %qr = attn.rope %qn positions %pos {style = "interleaved", rotary_dim = 32} : tensor<?x8x?x64xf16>, tensor<?x?xi32>
  %s = attn.scores %qr, %k {scale = 0.125} : tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x8x?x?xf32>
  %s1 = attn.bias alibi %s : !attn.scores<?x8x?x?xf32>
  %s2 = attn.bias tensor %s1, %bias : !attn.scores<?x8x?x?xf32>, tensor<1x8x?x?xf32>
  %s3 = attn.softcap %s2 {cap = 30.0} : !attn.scores<?x8x?x?xf32>
  %s4 = attn.mask sliding_window %s3 {left = 127, right = 0} : !attn.scores<?x8x?x?xf32>
  %s5 = attn.mask document %s4, %ids : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
  %s6 = attn.score_mod %s5, %tab : !attn.scores<?x8x?x?xf32>, tensor<8xf32> {
  ^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index, %t: tensor<8xf32>):
    %wt = tensor.extract %t[%h] : tensor<8xf32>
    %y = arith.mulf %x, %wt : f32
    attn.yield %y : f32
  }
  %p, %lse = attn.softmax %s6 sinks %sinks : !attn.scores<?x8x?x?xf32>, tensor<8xf32> -> !attn.probs<?x8x?x?xf32>, tensor<?x8x?xf32>
  %pd = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x8x?x?xf32>, i64
  %o = attn.weighted_sum %pd, %v : !attn.probs<?x8x?x?xf32>, tensor<?x2x?x32xf16> -> tensor<?x8x?x32xf16>
  func.return %o, %lse : tensor<?x8x?x32xf16>, tensor<?x8x?xf32>
}

// CHECK-LABEL: func.func @everything(
// CHECK-NEXT:    %qn = attn.qk_norm %q weight %w {eps = 1.0e-05} : tensor<?x8x?x64xf16>, tensor<64xf32>
// CHECK-NEXT:    %qr = attn.rope %qn positions %pos {style = "interleaved", rotary_dim = 32} : tensor<?x8x?x64xf16>, tensor<?x?xi32>
// CHECK-NEXT:    %s = attn.scores %qr, %k {scale = 0.125} : tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %s1 = attn.bias alibi %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %s2 = attn.bias tensor %s1, %bias : !attn.scores<?x8x?x?xf32>, tensor<1x8x?x?xf32>
// CHECK-NEXT:    %s3 = attn.softcap %s2 {cap = 30.0} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %s4 = attn.mask sliding_window %s3 {left = 127, right = 0} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT:    %s5 = attn.mask document %s4, %ids : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
// CHECK-NEXT:    %s6 = attn.score_mod %s5, %tab : !attn.scores<?x8x?x?xf32>, tensor<8xf32> {
// CHECK-NEXT:    ^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index, %t: tensor<8xf32>):
// CHECK-NEXT:      %wt = tensor.extract %t[%h] : tensor<8xf32>
// CHECK-NEXT:      %y = arith.mulf %x, %wt : f32
// CHECK-NEXT:      attn.yield %y : f32
// CHECK-NEXT:    }
// CHECK-NEXT:    %p, %lse = attn.softmax %s6 sinks %sinks : !attn.scores<?x8x?x?xf32>, tensor<8xf32> -> !attn.probs<?x8x?x?xf32>, tensor<?x8x?xf32>
// CHECK-NEXT:    %pd = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x8x?x?xf32>, i64
// CHECK-NEXT:    %o = attn.weighted_sum %pd, %v : !attn.probs<?x8x?x?xf32>, tensor<?x2x?x32xf16> -> tensor<?x8x?x32xf16>
// CHECK-NEXT:    func.return %o, %lse : tensor<?x8x?x32xf16>, tensor<?x8x?xf32>
