// online-softmax: softmax [+ dropout] + weighted_sum -> attn.online_softmax.
// RUN: attnfuse-opt %s -p online-softmax --split-input-file | filecheck %s

// CHECK-LABEL: func.func @plain(
// CHECK:         %m = attn.mask causal %s
// CHECK-NEXT:    %o = attn.online_softmax %m, %v : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
// CHECK-NEXT:    func.return %o : tensor<?x4x?x64xf16>
// CHECK-NOT:     attn.softmax
// CHECK-NOT:     attn.weighted_sum
func.func @plain(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Sinks, the lse result (its name kept) and dropout all fold in.
// CHECK-LABEL: func.func @gpt_oss_like(
// CHECK:         %o, %lse = attn.online_softmax %s, %v sinks %sk dropout_seed %seed {dropout_p = 0.1} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x32xbf16>, tensor<4xf32>, i64 -> tensor<?x4x?x32xbf16>, tensor<?x4x?xf32>
// CHECK-NEXT:    func.return %o, %lse : tensor<?x4x?x32xbf16>, tensor<?x4x?xf32>
func.func @gpt_oss_like(%q: tensor<?x4x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x32xbf16>,
                        %sk: tensor<4xf32>, %seed: i64) -> (tensor<?x4x?x32xbf16>, tensor<?x4x?xf32>) {
  %s = attn.scores %q, %k : tensor<?x4x?x64xbf16>, tensor<?x2x?x64xbf16> -> !attn.scores<?x4x?x?xf32>
  %p, %lse = attn.softmax %s sinks %sk : !attn.scores<?x4x?x?xf32>, tensor<4xf32> -> !attn.probs<?x4x?x?xf32>, tensor<?x4x?xf32>
  %pd = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x4x?x?xf32>, i64
  %o = attn.weighted_sum %pd, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x32xbf16> -> tensor<?x4x?x32xbf16>
  func.return %o, %lse : tensor<?x4x?x32xbf16>, tensor<?x4x?xf32>
}

// -----

// The score ops and the Q/K side are not touched.
// CHECK-LABEL: func.func @scores_untouched(
// CHECK-NEXT:    %qr = attn.rope %q : tensor<?x4x?x64xf32>
// CHECK-NEXT:    %s = attn.scores %qr, %k
// CHECK-NEXT:    %b = attn.bias alibi %s : !attn.scores<?x4x?x?xf32>
// CHECK-NEXT:    %c = attn.softcap %b {cap = 30.0} : !attn.scores<?x4x?x?xf32>
// CHECK-NEXT:    %o = attn.online_softmax %c, %v : !attn.scores<?x4x?x?xf32>, tensor<?x4x?x64xf32> -> tensor<?x4x?x64xf32>
func.func @scores_untouched(%q: tensor<?x4x?x64xf32>, %k: tensor<?x4x?x64xf32>, %v: tensor<?x4x?x64xf32>) -> tensor<?x4x?x64xf32> {
  %qr = attn.rope %q : tensor<?x4x?x64xf32>
  %s = attn.scores %qr, %k : tensor<?x4x?x64xf32>, tensor<?x4x?x64xf32> -> !attn.scores<?x4x?x?xf32>
  %b = attn.bias alibi %s : !attn.scores<?x4x?x?xf32>
  %c = attn.softcap %b {cap = 30.0} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %c : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x4x?x64xf32> -> tensor<?x4x?x64xf32>
  func.return %o : tensor<?x4x?x64xf32>
}

// -----

// Probabilities used twice cannot stream: left as they are.
// CHECK-LABEL: func.func @probs_twice(
// CHECK:         %p = attn.softmax %s
// CHECK-NEXT:    %o1 = attn.weighted_sum %p, %v
// CHECK-NEXT:    %o2 = attn.weighted_sum %p, %v
// CHECK-NOT:     attn.online_softmax
func.func @probs_twice(%q: tensor<?x4x?x64xf32>, %k: tensor<?x4x?x64xf32>, %v: tensor<?x4x?x64xf32>) -> (tensor<?x4x?x64xf32>, tensor<?x4x?x64xf32>) {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf32>, tensor<?x4x?x64xf32> -> !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o1 = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x4x?x64xf32> -> tensor<?x4x?x64xf32>
  %o2 = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x4x?x64xf32> -> tensor<?x4x?x64xf32>
  func.return %o1, %o2 : tensor<?x4x?x64xf32>, tensor<?x4x?x64xf32>
}
