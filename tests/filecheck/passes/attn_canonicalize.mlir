// attn-canonicalize: adjacent band masks of one alignment merge, verbatim repeats of a
// mask are dropped, p = 0 dropout disappears; everything else is left alone.
// RUN: attnfuse-opt %s -p attn-canonicalize --split-input-file | filecheck %s

// CHECK-LABEL: func.func @causal_then_window(
// CHECK:         %s = attn.scores
// CHECK-NEXT:    %w = attn.mask sliding_window %s {left = 4095, right = 0} : !attn.scores<?x4x?x?xf32>
// CHECK-NEXT:    %p = attn.softmax %w
func.func @causal_then_window(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %c = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %w = attn.mask sliding_window %c {left = 4095} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %w : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Two windows intersect; three band masks in a row collapse into one.
// CHECK-LABEL: func.func @windows(
// CHECK:         %s = attn.scores
// CHECK-NEXT:    %{{.*}} = attn.mask sliding_window %s {align = "bottom_right", left = 3, right = 2} : !attn.scores<?x4x?x?xf32>
// CHECK-NEXT:    %p = attn.softmax
func.func @windows(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %a = attn.mask sliding_window %s {left = 10, align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
  %b = attn.mask sliding_window %a {right = 2, align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
  %c = attn.mask sliding_window %b {left = 3, right = 7, align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %c : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// causal twice is causal; a window {right = 0} merged with causal is causal again.
// CHECK-LABEL: func.func @causal_twice(
// CHECK:         %s = attn.scores
// CHECK-NEXT:    %{{.*}} = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
// CHECK-NEXT:    %p = attn.softmax
func.func @causal_twice(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %a = attn.mask causal %s : !attn.scores<?x4x?x?xf32>
  %b = attn.mask causal %a : !attn.scores<?x4x?x?xf32>
  %c = attn.mask sliding_window %b {right = 0} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %c : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Bands of different alignments do not merge.
// CHECK-LABEL: func.func @mixed_alignment(
// CHECK:         %c = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
// CHECK-NEXT:    %w = attn.mask sliding_window %c {left = 8} : !attn.scores<?x4x?x?xf32>
func.func @mixed_alignment(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %c = attn.mask causal %s {align = "bottom_right"} : !attn.scores<?x4x?x?xf32>
  %w = attn.mask sliding_window %c {left = 8} : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %w : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// A repeated document mask goes; masks with other operands, and custom masks, stay.
// CHECK-LABEL: func.func @repeats(
// CHECK:         %d1 = attn.mask document %s, %ids : !attn.scores<?x4x?x?xf32>, tensor<?x?xi32>
// CHECK-NEXT:    %d3 = attn.mask document %d1, %ids2 : !attn.scores<?x4x?x?xf32>, tensor<?x?xi32>
// CHECK-NEXT:    %c1 = attn.mask custom %d3 : !attn.scores<?x4x?x?xf32> {
// CHECK:         %c2 = attn.mask custom %c1 : !attn.scores<?x4x?x?xf32> {
// CHECK:         %p = attn.softmax %c2
func.func @repeats(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %ids: tensor<?x?xi32>, %ids2: tensor<?x?xi32>) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %d1 = attn.mask document %s, %ids : !attn.scores<?x4x?x?xf32>, tensor<?x?xi32>
  %d2 = attn.mask document %d1, %ids : !attn.scores<?x4x?x?xf32>, tensor<?x?xi32>
  %d3 = attn.mask document %d2, %ids2 : !attn.scores<?x4x?x?xf32>, tensor<?x?xi32>
  %c1 = attn.mask custom %d3 : !attn.scores<?x4x?x?xf32> {
  ^bb0(%b0: index, %h0: index, %q0: index, %k0: index):
    %keep0 = arith.cmpi sge, %q0, %k0 : index
    attn.yield %keep0 : i1
  }
  %c2 = attn.mask custom %c1 : !attn.scores<?x4x?x?xf32> {
  ^bb0(%b1: index, %h1: index, %q1: index, %k1: index):
    %keep1 = arith.cmpi sge, %q1, %k1 : index
    attn.yield %keep1 : i1
  }
  %p = attn.softmax %c2 : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Dropout with p = 0 is the identity; p > 0 stays.
// CHECK-LABEL: func.func @dropout(
// CHECK:         %p = attn.softmax
// CHECK-NEXT:    %d2 = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x4x?x?xf32>, i64
// CHECK-NEXT:    %o = attn.weighted_sum %d2, %v
func.func @dropout(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>, %seed: i64) -> tensor<?x4x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %d1 = attn.dropout %p, %seed {p = 0.0} : !attn.probs<?x4x?x?xf32>, i64
  %d2 = attn.dropout %d1, %seed {p = 0.1} : !attn.probs<?x4x?x?xf32>, i64
  %o = attn.weighted_sum %d2, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// Programs already in normal form are unchanged.
// CHECK-LABEL: func.func @normal(
// CHECK-NEXT:    %qr = attn.rope %q {theta = 500000.0} : tensor<?x4x?x64xf16>
// CHECK-NEXT:    %s = attn.scores %qr, %k {scale = 0.125} : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
// CHECK-NEXT:    %c = attn.softcap %s {cap = 50.0} : !attn.scores<?x4x?x?xf32>
// CHECK-NEXT:    %m = attn.mask causal %c : !attn.scores<?x4x?x?xf32>
// CHECK-NEXT:    %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
// CHECK-NEXT:    %o = attn.weighted_sum %p, %v
// CHECK-NEXT:    func.return %o
func.func @normal(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %qr = attn.rope %q {theta = 500000.0} : tensor<?x4x?x64xf16>
  %s = attn.scores %qr, %k {scale = 0.125} : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  %c = attn.softcap %s {cap = 50.0} : !attn.scores<?x4x?x?xf32>
  %m = attn.mask causal %c : !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}
