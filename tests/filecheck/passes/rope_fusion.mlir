// rope-fusion: sets the placement of every Q/K transform (rope, qk_norm).
// RUN: attnfuse-opt %s -p 'rope-fusion{strategy=fused}' --split-input-file | filecheck %s --check-prefix=FUSED
// RUN: attnfuse-opt %s -p 'rope-fusion{strategy=hybrid}' --split-input-file | filecheck %s --check-prefix=HYBRID
// RUN: attnfuse-opt %s -p 'rope-fusion{strategy=separate}' --split-input-file | filecheck %s --check-prefix=SEPARATE
// RUN: attnfuse-opt %s -p 'rope-fusion{strategy=auto}' --split-input-file | filecheck %s --check-prefix=AUTO
// RUN: not attnfuse-opt %s -p 'rope-fusion{strategy=sideways}' 2>&1 | filecheck %s --check-prefix=BAD

// Qwen3: norm then rope on both sides.
// FUSED-LABEL: func.func @qwen(
// FUSED-NEXT:    %qn = attn.qk_norm %q weight %wq {eps = 1.0e-06, placement = "kernel"} : tensor<?x8x?x128xbf16>, tensor<128xbf16>
// FUSED-NEXT:    %kn = attn.qk_norm %k weight %wk {eps = 1.0e-06, placement = "kernel"} : tensor<?x2x?x128xbf16>, tensor<128xbf16>
// FUSED-NEXT:    %qr = attn.rope %qn {theta = 1000000.0, placement = "kernel"} : tensor<?x8x?x128xbf16>
// FUSED-NEXT:    %kr = attn.rope %kn {theta = 1000000.0, placement = "kernel"} : tensor<?x2x?x128xbf16>
// FUSED-NEXT:    %s = attn.scores %qr, %kr

// HYBRID-LABEL: func.func @qwen(
// HYBRID-NEXT:    %qn = attn.qk_norm %q weight %wq {eps = 1.0e-06, placement = "kernel"}
// HYBRID-NEXT:    %kn = attn.qk_norm %k weight %wk {eps = 1.0e-06, placement = "prekernel"}
// HYBRID-NEXT:    %qr = attn.rope %qn {theta = 1000000.0, placement = "kernel"}
// HYBRID-NEXT:    %kr = attn.rope %kn {theta = 1000000.0, placement = "prekernel"}

// SEPARATE-LABEL: func.func @qwen(
// SEPARATE-NEXT:    %qn = attn.qk_norm %q weight %wq {eps = 1.0e-06, placement = "prekernel"}
// SEPARATE-NEXT:    %kn = attn.qk_norm %k weight %wk {eps = 1.0e-06, placement = "prekernel"}
// SEPARATE-NEXT:    %qr = attn.rope %qn {theta = 1000000.0, placement = "prekernel"}
// SEPARATE-NEXT:    %kr = attn.rope %kn {theta = 1000000.0, placement = "prekernel"}

// auto asks the cost model; whatever it picks, every transform gets a placement.
// AUTO-LABEL: func.func @qwen(
// AUTO-NEXT:    %qn = attn.qk_norm %q weight %wq {eps = 1.0e-06, placement = "{{kernel|prekernel}}"}
// AUTO-NEXT:    %kn = attn.qk_norm %k weight %wk {eps = 1.0e-06, placement = "{{kernel|prekernel}}"}
// AUTO-NEXT:    %qr = attn.rope %qn {theta = 1000000.0, placement = "{{kernel|prekernel}}"}
// AUTO-NEXT:    %kr = attn.rope %kn {theta = 1000000.0, placement = "{{kernel|prekernel}}"}

// BAD: strategy must be one of auto, fused, hybrid, separate, got 'sideways'
func.func @qwen(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>,
                %wq: tensor<128xbf16>, %wk: tensor<128xbf16>) -> tensor<?x8x?x128xbf16> {
  %qn = attn.qk_norm %q weight %wq {eps = 1.0e-06} : tensor<?x8x?x128xbf16>, tensor<128xbf16>
  %kn = attn.qk_norm %k weight %wk {eps = 1.0e-06} : tensor<?x2x?x128xbf16>, tensor<128xbf16>
  %qr = attn.rope %qn {theta = 1000000.0} : tensor<?x8x?x128xbf16>
  %kr = attn.rope %kn {theta = 1000000.0} : tensor<?x2x?x128xbf16>
  %s = attn.scores %qr, %kr : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<?x8x?x?xf32>
  %m = attn.mask causal %s : !attn.scores<?x8x?x?xf32>
  %p = attn.softmax %m : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}

// -----

// Placements written in the program are kept (a user pins K's rope to a pre-kernel
// and Q's to the kernel); only "auto" ones are decided.
// FUSED-LABEL: func.func @pinned(
// FUSED-NEXT:    %qr = attn.rope %q {placement = "kernel"} : tensor<?x8x?x64xf16>
// FUSED-NEXT:    %kr = attn.rope %k {placement = "prekernel"} : tensor<?x2x?x64xf16>
// SEPARATE-LABEL: func.func @pinned(
// SEPARATE-NEXT:    %qr = attn.rope %q {placement = "kernel"} : tensor<?x8x?x64xf16>
// SEPARATE-NEXT:    %kr = attn.rope %k {placement = "prekernel"} : tensor<?x2x?x64xf16>
func.func @pinned(%q: tensor<?x8x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x8x?x64xf16> {
  %qr = attn.rope %q {placement = "kernel"} : tensor<?x8x?x64xf16>
  %kr = attn.rope %k {placement = "prekernel"} : tensor<?x2x?x64xf16>
  %s = attn.scores %qr, %kr : tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x8x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x8x?x64xf16>
  func.return %o : tensor<?x8x?x64xf16>
}

// -----

// Programs without transforms are unchanged.
// FUSED-LABEL: func.func @plain(
// FUSED-NEXT:    %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x8x?x?xf32>
// FUSED-NEXT:    %p = attn.softmax %s
func.func @plain(%q: tensor<?x8x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x8x?x64xf16> {
  %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<?x8x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x8x?x64xf16>
  func.return %o : tensor<?x8x?x64xf16>
}
