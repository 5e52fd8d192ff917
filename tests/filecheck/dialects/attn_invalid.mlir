// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics
// RUN: not attnfuse-opt %s --split-input-file 2>&1 | filecheck %s

// One case per verifier / parser error of the attn dialect: each chunk has exactly one
// error. The expected-error annotations check the line and message (the first RUN fails
// on any mismatch); the CHECK lines check the column and the caret under the reported
// token (the op name for verifier errors, the offending token for syntax errors).

// scores type must be rank 4
func.func @f(%s: !attn.scores<?x8x?xf32>) {
// expected-error @above {{attn.scores must be <BxHxSqxSkvxf32> (4 dims, f32)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:31: error: attn.scores must be <BxHxSqxSkvxf32> (4 dims, f32)
// CHECK-NEXT: func.func @f(%s: !attn.scores<?x8x?xf32>) {
// CHECK-NEXT: ^~~~~~~~~

// -----

// scores element type must be f32
func.func @f(%s: !attn.scores<?x8x?x?xf16>) {
// expected-error @above {{attn.scores must be <BxHxSqxSkvxf32> (4 dims, f32)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:31: error: attn.scores must be <BxHxSqxSkvxf32> (4 dims, f32)
// CHECK-NEXT: func.func @f(%s: !attn.scores<?x8x?x?xf16>) {
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// unknown option
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {base = 10000.0} : tensor<?x8x?x64xf16>
  // expected-error @above {{unknown option 'base' for attn.rope (known options: theta, style, rotary_dim, offset, align, scaling, factor, low_freq_factor, high_freq_factor, original_max_position, beta_fast, beta_slow, truncate, attention_factor, placement)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:22: error: unknown option 'base' for attn.rope (known options: theta, style, rotary_dim, offset, align, scaling, factor, low_freq_factor, high_freq_factor, original_max_position, beta_fast, beta_slow, truncate, attention_factor, placement)
// CHECK-NEXT: %r = attn.rope %q {base = 10000.0} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~

// -----

// option given twice
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {theta = 10000.0, theta = 500000.0} : tensor<?x8x?x64xf16>
  // expected-error @above {{option 'theta' given twice}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:39: error: option 'theta' given twice
// CHECK-NEXT: %r = attn.rope %q {theta = 10000.0, theta = 500000.0} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~

// -----

// int option given a float
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {rotary_dim = 32.0} : tensor<?x8x?x64xf16>
  // expected-error @above {{option 'rotary_dim' expects an integer, got 32.0}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:35: error: option 'rotary_dim' expects an integer, got 32.0
// CHECK-NEXT: %r = attn.rope %q {rotary_dim = 32.0} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~

// -----

// float option given a string
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {theta = "big"} : tensor<?x8x?x64xf16>
  // expected-error @above {{option 'theta' expects a number}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:30: error: option 'theta' expects a number
// CHECK-NEXT: %r = attn.rope %q {theta = "big"} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~

// -----

// non-finite float option
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {theta = 1.0e999} : tensor<?x8x?x64xf16>
  // expected-error @above {{option 'theta' must be finite}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:30: error: option 'theta' must be finite
// CHECK-NEXT: %r = attn.rope %q {theta = 1.0e999} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~

// -----

// int option out of range
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {offset = 9223372036854775808} : tensor<?x8x?x64xf16>
  // expected-error @above {{option 'offset' is out of the i64 range}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:31: error: option 'offset' is out of the i64 range
// CHECK-NEXT: %r = attn.rope %q {offset = 9223372036854775808} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~~~~~~~~~~~

// -----

// bad style choice
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {style = "neox"} : tensor<?x8x?x64xf16>
  // expected-error @above {{option 'style' must be one of half, interleaved, got 'neox'}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:30: error: option 'style' must be one of half, interleaved, got 'neox'
// CHECK-NEXT: %r = attn.rope %q {style = "neox"} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~

// -----

// bad scaling choice
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {scaling = "ntk"} : tensor<?x8x?x64xf16>
  // expected-error @above {{option 'scaling' must be one of none, linear, llama3, yarn, got 'ntk'}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:32: error: option 'scaling' must be one of none, linear, llama3, yarn, got 'ntk'
// CHECK-NEXT: %r = attn.rope %q {scaling = "ntk"} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~

// -----

// string option given a number
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {placement = 1} : tensor<?x8x?x64xf16>
  // expected-error @above {{option 'placement' expects a string}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:34: error: option 'placement' expects a string
// CHECK-NEXT: %r = attn.rope %q {placement = 1} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^

// -----

// float written without a dot before the exponent
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %n = attn.qk_norm %q {eps = 1e-6} : tensor<?x8x?x64xf16>
  // expected-error @above {{expected ',' or '}' after option 'eps' (floats are written like 1.0e-05)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:32: error: expected ',' or '}' after option 'eps' (floats are written like 1.0e-05)
// CHECK-NEXT: %n = attn.qk_norm %q {eps = 1e-6} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^

// -----

// unknown kind
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask chunked %s : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{unknown attn.mask kind 'chunked' (expected one of causal, sliding_window, document, prefix_lm, custom)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:18: error: unknown attn.mask kind 'chunked' (expected one of causal, sliding_window, document, prefix_lm, custom)
// CHECK-NEXT: %m = attn.mask chunked %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~

// -----

// missing kind
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask %s : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{expected attn.mask kind: one of causal, sliding_window, document, prefix_lm, custom}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:18: error: expected attn.mask kind: one of causal, sliding_window, document, prefix_lm, custom
// CHECK-NEXT: %m = attn.mask %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~

// -----

// operand type count
func.func @f(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.scores %q, %k : tensor<?x8x?x64xf16> -> !attn.scores<?x8x?x?xf32>
  // expected-error @above {{attn.scores expects 2 operand types, got 1}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:29: error: attn.scores expects 2 operand types, got 1
// CHECK-NEXT: %s = attn.scores %q, %k : tensor<?x8x?x64xf16> -> !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~~~~~~~~~~~

// -----

// too many result types
func.func @f(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<?x8x?x?xf32>, !attn.scores<?x8x?x?xf32>
  func.return
  // expected-error @above {{attn.scores got too many result types}}
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:3: error: attn.scores got too many result types
// CHECK-NEXT: func.return
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// rope input not a tensor of rank 4
func.func @f(%q: tensor<?x?x64xf16>) {
  %r = attn.rope %q : tensor<?x?x64xf16>
  // expected-error @above {{'attn.rope' op rope input must be rank 4 [batch, heads, seq, head_dim], got rank 3}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op rope input must be rank 4 [batch, heads, seq, head_dim], got rank 3
// CHECK-NEXT: %r = attn.rope %q : tensor<?x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// rope input integer element type
func.func @f(%q: tensor<?x8x?x64xi32>) {
  %r = attn.rope %q : tensor<?x8x?x64xi32>
  // expected-error @above {{'attn.rope' op rope input element type must be f16, bf16 or f32, got i32}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op rope input element type must be f16, bf16 or f32, got i32
// CHECK-NEXT: %r = attn.rope %q : tensor<?x8x?x64xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// rope dynamic heads
func.func @f(%q: tensor<?x?x?x64xf16>) {
  %r = attn.rope %q : tensor<?x?x?x64xf16>
  // expected-error @above {{'attn.rope' op rope input heads dim must be static}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op rope input heads dim must be static
// CHECK-NEXT: %r = attn.rope %q : tensor<?x?x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// zero key heads
func.func @f(%q: tensor<?x8x?x64xf16>, %k: tensor<?x0x?x64xf16>) {
  %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x0x?x64xf16> -> !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.scores' op attn.scores k heads dim must be positive, got 0}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op attn.scores k heads dim must be positive, got 0
// CHECK-NEXT: %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x0x?x64xf16> -> !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// rope dynamic head dim
func.func @f(%q: tensor<?x8x?x?xf16>) {
  %r = attn.rope %q : tensor<?x8x?x?xf16>
  // expected-error @above {{'attn.rope' op rope input head_dim dim must be static}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op rope input head_dim dim must be static
// CHECK-NEXT: %r = attn.rope %q : tensor<?x8x?x?xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// rotary_dim odd
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {rotary_dim = 33} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op rotary_dim must be even and in [2, 64], got 33}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op rotary_dim must be even and in [2, 64], got 33
// CHECK-NEXT: %r = attn.rope %q {rotary_dim = 33} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// rotary_dim too big
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {rotary_dim = 128} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op rotary_dim must be even and in [2, 64], got 128}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op rotary_dim must be even and in [2, 64], got 128
// CHECK-NEXT: %r = attn.rope %q {rotary_dim = 128} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// rotary_dim zero
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {rotary_dim = 0} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op rotary_dim must be even and in [2, 64], got 0}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op rotary_dim must be even and in [2, 64], got 0
// CHECK-NEXT: %r = attn.rope %q {rotary_dim = 0} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// theta not positive
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {theta = 0.0} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op theta must be positive}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op theta must be positive
// CHECK-NEXT: %r = attn.rope %q {theta = 0.0} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// factor not positive
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {scaling = "linear", factor = -2.0} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op factor must be positive}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op factor must be positive
// CHECK-NEXT: %r = attn.rope %q {scaling = "linear", factor = -2.0} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// llama3 frequency factors
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {scaling = "llama3", factor = 8.0, low_freq_factor = 4.0, high_freq_factor = 1.0} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op llama3 scaling needs high_freq_factor > low_freq_factor > 0}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op llama3 scaling needs high_freq_factor > low_freq_factor > 0
// CHECK-NEXT: %r = attn.rope %q {scaling = "llama3", factor = 8.0, low_freq_factor = 4.0, high_freq_factor = 1.0} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// yarn original_max_position zero
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {scaling = "yarn", factor = 32.0, original_max_position = 0} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op original_max_position must be positive}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op original_max_position must be positive
// CHECK-NEXT: %r = attn.rope %q {scaling = "yarn", factor = 32.0, original_max_position = 0} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// yarn beta_fast zero
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {scaling = "yarn", factor = 32.0, beta_fast = 0.0} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op yarn scaling needs beta_fast > 0 and beta_slow > 0}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op yarn scaling needs beta_fast > 0 and beta_slow > 0
// CHECK-NEXT: %r = attn.rope %q {scaling = "yarn", factor = 32.0, beta_fast = 0.0} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// yarn theta 1
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {theta = 1.0, scaling = "yarn", factor = 32.0} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op yarn scaling needs theta > 1}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op yarn scaling needs theta > 1
// CHECK-NEXT: %r = attn.rope %q {theta = 1.0, scaling = "yarn", factor = 32.0} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// yarn truncate not 0 or 1
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {scaling = "yarn", factor = 32.0, truncate = 2} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op truncate must be 0 or 1}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op truncate must be 0 or 1
// CHECK-NEXT: %r = attn.rope %q {scaling = "yarn", factor = 32.0, truncate = 2} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// positions rank 3
func.func @f(%q: tensor<?x8x?x64xf16>, %p: tensor<?x?x?xi32>) {
  %r = attn.rope %q positions %p : tensor<?x8x?x64xf16>, tensor<?x?x?xi32>
  // expected-error @above {{'attn.rope' op positions must be tensor<?xi32> or tensor<?x?xi32>}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op positions must be tensor<?xi32> or tensor<?x?xi32>
// CHECK-NEXT: %r = attn.rope %q positions %p : tensor<?x8x?x64xf16>, tensor<?x?x?xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// positions float
func.func @f(%q: tensor<?x8x?x64xf16>, %p: tensor<?xf32>) {
  %r = attn.rope %q positions %p : tensor<?x8x?x64xf16>, tensor<?xf32>
  // expected-error @above {{'attn.rope' op attn.rope positions must be a rank-1 integer tensor, got tensor<?xf32>}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op attn.rope positions must be a rank-1 integer tensor, got tensor<?xf32>
// CHECK-NEXT: %r = attn.rope %q positions %p : tensor<?x8x?x64xf16>, tensor<?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// positions and offset
func.func @f(%q: tensor<?x8x?x64xf16>, %p: tensor<?xi32>) {
  %r = attn.rope %q positions %p {offset = 5} : tensor<?x8x?x64xf16>, tensor<?xi32>
  // expected-error @above {{'attn.rope' op give either positions or offset, not both}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op give either positions or offset, not both
// CHECK-NEXT: %r = attn.rope %q positions %p {offset = 5} : tensor<?x8x?x64xf16>, tensor<?xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// positions and align = "bottom_right"
func.func @f(%q: tensor<?x8x?x64xf16>, %p: tensor<?xi32>) {
  %r = attn.rope %q positions %p {align = "bottom_right"} : tensor<?x8x?x64xf16>, tensor<?xi32>
  // expected-error @above {{'attn.rope' op give either positions or align = "bottom_right", not both}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op give either positions or align = "bottom_right", not both
// CHECK-NEXT: %r = attn.rope %q positions %p {align = "bottom_right"} : tensor<?x8x?x64xf16>, tensor<?xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// rope result type differs (generic form)
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = "attn.rope"(%q) : (tensor<?x8x?x64xf16>) -> tensor<?x8x?x64xbf16>
  // expected-error @above {{'attn.rope' op result must have type tensor<?x8x?x64xf16>, got tensor<?x8x?x64xbf16>}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op result must have type tensor<?x8x?x64xf16>, got tensor<?x8x?x64xbf16>
// CHECK-NEXT: %r = "attn.rope"(%q) : (tensor<?x8x?x64xf16>) -> tensor<?x8x?x64xbf16>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// qk_norm weight length
func.func @f(%q: tensor<?x8x?x64xf16>, %w: tensor<128xf32>) {
  %n = attn.qk_norm %q weight %w : tensor<?x8x?x64xf16>, tensor<128xf32>
  // expected-error @above {{'attn.qk_norm' op attn.qk_norm weight must have 64 elements, got 128}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.qk_norm' op attn.qk_norm weight must have 64 elements, got 128
// CHECK-NEXT: %n = attn.qk_norm %q weight %w : tensor<?x8x?x64xf16>, tensor<128xf32>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// qk_norm weight rank
func.func @f(%q: tensor<?x8x?x64xf16>, %w: tensor<8x64xf32>) {
  %n = attn.qk_norm %q weight %w : tensor<?x8x?x64xf16>, tensor<8x64xf32>
  // expected-error @above {{'attn.qk_norm' op attn.qk_norm weight must be a rank-1 tensor<64xf32>, got tensor<8x64xf32>}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.qk_norm' op attn.qk_norm weight must be a rank-1 tensor<64xf32>, got tensor<8x64xf32>
// CHECK-NEXT: %n = attn.qk_norm %q weight %w : tensor<?x8x?x64xf16>, tensor<8x64xf32>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// qk_norm weight integer
func.func @f(%q: tensor<?x8x?x64xf16>, %w: tensor<64xi32>) {
  %n = attn.qk_norm %q weight %w : tensor<?x8x?x64xf16>, tensor<64xi32>
  // expected-error @above {{'attn.qk_norm' op attn.qk_norm weight must have a float element type}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.qk_norm' op attn.qk_norm weight must have a float element type
// CHECK-NEXT: %n = attn.qk_norm %q weight %w : tensor<?x8x?x64xf16>, tensor<64xi32>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// qk_norm eps negative
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %n = attn.qk_norm %q {eps = -1.0e-06} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.qk_norm' op eps must be >= 0}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.qk_norm' op eps must be >= 0
// CHECK-NEXT: %n = attn.qk_norm %q {eps = -1.0e-06} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// Hq % Hkv
func.func @f(%q: tensor<?x12x?x64xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.scores %q, %k : tensor<?x12x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<?x12x?x?xf32>
  // expected-error @above {{'attn.scores' op query heads (12) must be a multiple of key heads (8)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op query heads (12) must be a multiple of key heads (8)
// CHECK-NEXT: %s = attn.scores %q, %k : tensor<?x12x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<?x12x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// head dims mismatch
func.func @f(%q: tensor<?x8x?x128xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.scores %q, %k : tensor<?x8x?x128xf16>, tensor<?x8x?x64xf16> -> !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.scores' op q head_dim 128 != k head_dim 64}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op q head_dim 128 != k head_dim 64
// CHECK-NEXT: %s = attn.scores %q, %k : tensor<?x8x?x128xf16>, tensor<?x8x?x64xf16> -> !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// q/k element types differ
func.func @f(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xbf16>) {
  %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xbf16> -> !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.scores' op q and k must have the same element type}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op q and k must have the same element type
// CHECK-NEXT: %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xbf16> -> !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// batch dims differ
func.func @f(%q: tensor<2x8x?x64xf16>, %k: tensor<3x8x?x64xf16>) {
  %s = attn.scores %q, %k : tensor<2x8x?x64xf16>, tensor<3x8x?x64xf16> -> !attn.scores<2x8x?x?xf32>
  // expected-error @above {{'attn.scores' op batch dims differ (2 vs 3)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op batch dims differ (2 vs 3)
// CHECK-NEXT: %s = attn.scores %q, %k : tensor<2x8x?x64xf16>, tensor<3x8x?x64xf16> -> !attn.scores<2x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// scores result heads
func.func @f(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<?x4x?x?xf32>
  // expected-error @above {{'attn.scores' op result heads dim 4 != 8}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op result heads dim 4 != 8
// CHECK-NEXT: %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<?x4x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// scores result kv_len
func.func @f(%q: tensor<?x8x16x64xf16>, %k: tensor<?x8x24x64xf16>) {
  %s = attn.scores %q, %k : tensor<?x8x16x64xf16>, tensor<?x8x24x64xf16> -> !attn.scores<?x8x16x16xf32>
  // expected-error @above {{'attn.scores' op result kv_len dim 16 != 24}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op result kv_len dim 16 != 24
// CHECK-NEXT: %s = attn.scores %q, %k : tensor<?x8x16x64xf16>, tensor<?x8x24x64xf16> -> !attn.scores<?x8x16x16xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// scores result is a tensor
func.func @f(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> tensor<?x8x?x?xf32>
  // expected-error @above {{'attn.scores' op result 'output' at position 0 does not verify: tensor<?x8x?x?xf32> should be of base attribute attn.scores}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op result 'output' at position 0 does not verify: tensor<?x8x?x?xf32> should be of base attribute attn.scores
// CHECK-NEXT: %s = attn.scores %q, %k : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> tensor<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// scale not positive
func.func @f(%q: tensor<?x8x?x64xf16>, %k: tensor<?x8x?x64xf16>) {
  %s = attn.scores %q, %k {scale = -0.125} : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.scores' op scale must be positive}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op scale must be positive
// CHECK-NEXT: %s = attn.scores %q, %k {scale = -0.125} : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16> -> !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// alibi with a tensor
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %b: tensor<1x8x?x?xf32>) {
  %r = attn.bias alibi %s, %b : !attn.scores<?x8x?x?xf32>, tensor<1x8x?x?xf32>
  // expected-error @above {{'attn.bias' op attn.bias alibi takes no bias tensor}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.bias' op attn.bias alibi takes no bias tensor
// CHECK-NEXT: %r = attn.bias alibi %s, %b : !attn.scores<?x8x?x?xf32>, tensor<1x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// alibi slopes length
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %sl: tensor<16xf32>) {
  %r = attn.bias alibi %s slopes %sl : !attn.scores<?x8x?x?xf32>, tensor<16xf32>
  // expected-error @above {{'attn.bias' op attn.bias slopes must have 8 elements, got 16}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.bias' op attn.bias slopes must have 8 elements, got 16
// CHECK-NEXT: %r = attn.bias alibi %s slopes %sl : !attn.scores<?x8x?x?xf32>, tensor<16xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// bias tensor without tensor
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %r = attn.bias tensor %s : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.bias' op attn.bias tensor takes exactly one bias tensor operand}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.bias' op attn.bias tensor takes exactly one bias tensor operand
// CHECK-NEXT: %r = attn.bias tensor %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// bias tensor rank
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %b: tensor<?x?xf32>) {
  %r = attn.bias tensor %s, %b : !attn.scores<?x8x?x?xf32>, tensor<?x?xf32>
  // expected-error @above {{'attn.bias' op bias must be a rank-4 tensor broadcast over [B, H, Sq, Skv], got tensor<?x?xf32>}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.bias' op bias must be a rank-4 tensor broadcast over [B, H, Sq, Skv], got tensor<?x?xf32>
// CHECK-NEXT: %r = attn.bias tensor %s, %b : !attn.scores<?x8x?x?xf32>, tensor<?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// bias tensor head dim not broadcastable
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %b: tensor<1x4x?x?xf32>) {
  %r = attn.bias tensor %s, %b : !attn.scores<?x8x?x?xf32>, tensor<1x4x?x?xf32>
  // expected-error @above {{'attn.bias' op bias heads dim must be 1 or 8, got 4}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.bias' op bias heads dim must be 1 or 8, got 4
// CHECK-NEXT: %r = attn.bias tensor %s, %b : !attn.scores<?x8x?x?xf32>, tensor<1x4x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// bias kind missing (generic form)
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %r = "attn.bias"(%s) <{operandSegmentSizes = array<i32: 1, 0, 0>}> : (!attn.scores<?x8x?x?xf32>) -> !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.bias' op kind must be given (alibi or tensor)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.bias' op kind must be given (alibi or tensor)
// CHECK-NEXT: %r = "attn.bias"(%s) <{operandSegmentSizes = array<i32: 1, 0, 0>}> : (!attn.scores<?x8x?x?xf32>) -> !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// softcap without cap
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %c = attn.softcap %s : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.softcap' op option cap must be given and positive}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.softcap' op option cap must be given and positive
// CHECK-NEXT: %c = attn.softcap %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// softcap cap zero
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %c = attn.softcap %s {cap = 0.0} : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.softcap' op option cap must be given and positive}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.softcap' op option cap must be given and positive
// CHECK-NEXT: %c = attn.softcap %s {cap = 0.0} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// mask applied to a tensor instead of scores
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %m = attn.mask causal %q : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.mask' op operand 'input' at position 0 does not verify: tensor<?x8x?x64xf16> should be of base attribute attn.scores}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op operand 'input' at position 0 does not verify: tensor<?x8x?x64xf16> should be of base attribute attn.scores
// CHECK-NEXT: %m = attn.mask causal %q : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// mask kind option mismatch (causal + left)
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask causal %s {left = 128} : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.mask' op attn.mask causal does not take option(s) left}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask causal does not take option(s) left
// CHECK-NEXT: %m = attn.mask causal %s {left = 128} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// mask kind option mismatch (document + align)
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %ids: tensor<?x?xi32>) {
  %m = attn.mask document %s, %ids {align = "bottom_right"} : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
  // expected-error @above {{'attn.mask' op attn.mask document does not take option(s) align}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask document does not take option(s) align
// CHECK-NEXT: %m = attn.mask document %s, %ids {align = "bottom_right"} : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// bad align choice
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask causal %s {align = "center"} : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{option 'align' must be one of top_left, bottom_right, got 'center'}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:37: error: option 'align' must be one of top_left, bottom_right, got 'center'
// CHECK-NEXT: %m = attn.mask causal %s {align = "center"} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~

// -----

// causal with an operand
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %ids: tensor<?x?xi32>) {
  %m = attn.mask causal %s, %ids : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
  // expected-error @above {{'attn.mask' op attn.mask causal takes no operands}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask causal takes no operands
// CHECK-NEXT: %m = attn.mask causal %s, %ids : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// sliding_window without bounds
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask sliding_window %s : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.mask' op attn.mask sliding_window needs left and/or right}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask sliding_window needs left and/or right
// CHECK-NEXT: %m = attn.mask sliding_window %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// sliding_window negative left
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask sliding_window %s {left = -1} : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.mask' op attn.mask sliding_window: left must be >= 0}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask sliding_window: left must be >= 0
// CHECK-NEXT: %m = attn.mask sliding_window %s {left = -1} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// document without ids
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask document %s : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.mask' op attn.mask document takes one or two [B, S] segment-id tensors}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask document takes one or two [B, S] segment-id tensors
// CHECK-NEXT: %m = attn.mask document %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// document ids rank
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %ids: tensor<?xi32>) {
  %m = attn.mask document %s, %ids : !attn.scores<?x8x?x?xf32>, tensor<?xi32>
  // expected-error @above {{'attn.mask' op attn.mask document ids must be a rank-2 integer tensor, got tensor<?xi32>}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask document ids must be a rank-2 integer tensor, got tensor<?xi32>
// CHECK-NEXT: %m = attn.mask document %s, %ids : !attn.scores<?x8x?x?xf32>, tensor<?xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// document ids batch
func.func @f(%s: !attn.scores<2x8x?x?xf32>, %ids: tensor<3x?xi32>) {
  %m = attn.mask document %s, %ids : !attn.scores<2x8x?x?xf32>, tensor<3x?xi32>
  // expected-error @above {{'attn.mask' op attn.mask document: ids batch dim must match scores}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask document: ids batch dim must match scores
// CHECK-NEXT: %m = attn.mask document %s, %ids : !attn.scores<2x8x?x?xf32>, tensor<3x?xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// prefix_lm without prefix
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask prefix_lm %s : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.mask' op attn.mask prefix_lm needs either {prefix = N} or one [B] operand}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask prefix_lm needs either {prefix = N} or one [B] operand
// CHECK-NEXT: %m = attn.mask prefix_lm %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// prefix_lm with both
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %n: tensor<?xi32>) {
  %m = attn.mask prefix_lm %s, %n {prefix = 4} : !attn.scores<?x8x?x?xf32>, tensor<?xi32>
  // expected-error @above {{'attn.mask' op attn.mask prefix_lm needs either {prefix = N} or one [B] operand}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask prefix_lm needs either {prefix = N} or one [B] operand
// CHECK-NEXT: %m = attn.mask prefix_lm %s, %n {prefix = 4} : !attn.scores<?x8x?x?xf32>, tensor<?xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// prefix_lm negative
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask prefix_lm %s {prefix = -4} : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.mask' op attn.mask prefix_lm: prefix must be >= 0}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask prefix_lm: prefix must be >= 0
// CHECK-NEXT: %m = attn.mask prefix_lm %s {prefix = -4} : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// prefix_lm operand rank
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %n: tensor<?x?xi32>) {
  %m = attn.mask prefix_lm %s, %n : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
  // expected-error @above {{'attn.mask' op attn.mask prefix lengths must be a rank-1 integer tensor, got tensor<?x?xi32>}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask prefix lengths must be a rank-1 integer tensor, got tensor<?x?xi32>
// CHECK-NEXT: %m = attn.mask prefix_lm %s, %n : !attn.scores<?x8x?x?xf32>, tensor<?x?xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// custom without region
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask custom %s : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.mask' op attn.mask custom needs a predicate region}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask custom needs a predicate region
// CHECK-NEXT: %m = attn.mask custom %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// region on a non-custom mask
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask causal %s : !attn.scores<?x8x?x?xf32> {
  // expected-error @above {{'attn.mask' op only the custom kind has a predicate region}}
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    %keep = arith.cmpi sge, %qi, %ki : index
    attn.yield %keep : i1
  }
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op only the custom kind has a predicate region
// CHECK-NEXT: %m = attn.mask causal %s : !attn.scores<?x8x?x?xf32> {
// CHECK-NEXT: ^~~~~~~~~

// -----

// custom mask region signature
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask custom %s : !attn.scores<?x8x?x?xf32> {
  // expected-error @above {{'attn.mask' op custom mask region arguments must be (index, index, index, index), got (index, index)}}
  ^bb0(%qi: index, %ki: index):
    %keep = arith.cmpi sge, %qi, %ki : index
    attn.yield %keep : i1
  }
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op custom mask region arguments must be (index, index, index, index), got (index, index)
// CHECK-NEXT: %m = attn.mask custom %s : !attn.scores<?x8x?x?xf32> {
// CHECK-NEXT: ^~~~~~~~~

// -----

// custom mask region signature misses a capture
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %t: tensor<8xi32>) {
  %m = attn.mask custom %s, %t : !attn.scores<?x8x?x?xf32>, tensor<8xi32> {
  // expected-error @above {{'attn.mask' op custom mask region arguments must be (index, index, index, index, tensor<8xi32>), got (index, index, index, index)}}
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    %keep = arith.cmpi sge, %qi, %ki : index
    attn.yield %keep : i1
  }
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op custom mask region arguments must be (index, index, index, index, tensor<8xi32>), got (index, index, index, index)
// CHECK-NEXT: %m = attn.mask custom %s, %t : !attn.scores<?x8x?x?xf32>, tensor<8xi32> {
// CHECK-NEXT: ^~~~~~~~~

// -----

// custom mask yields an index
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask custom %s : !attn.scores<?x8x?x?xf32> {
  // expected-error @above {{'attn.mask' op region must yield one i1, got [IndexType()]}}
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    attn.yield %qi : index
  }
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op region must yield one i1, got [IndexType()]
// CHECK-NEXT: %m = attn.mask custom %s : !attn.scores<?x8x?x?xf32> {
// CHECK-NEXT: ^~~~~~~~~

// -----

// custom mask region without a terminator
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask custom %s : !attn.scores<?x8x?x?xf32> {
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    %keep = arith.cmpi sge, %qi, %ki : index
    // expected-error @above {{'arith.cmpi' op terminates block in single-block region but is not a terminator}}
  }
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:13: error: 'arith.cmpi' op terminates block in single-block region but is not a terminator
// CHECK-NEXT: %keep = arith.cmpi sge, %qi, %ki : index
// CHECK-NEXT: ^~~~~~~~~~

// -----

// unknown mask kind (generic form)
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = "attn.mask"(%s) <{kind = "chunked"}> ({}) : (!attn.scores<?x8x?x?xf32>) -> !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.mask' op unknown kind 'chunked' (expected one of causal, sliding_window, document, prefix_lm, custom)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op unknown kind 'chunked' (expected one of causal, sliding_window, document, prefix_lm, custom)
// CHECK-NEXT: %m = "attn.mask"(%s) <{kind = "chunked"}> ({}) : (!attn.scores<?x8x?x?xf32>) -> !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// string option outside its choices (generic form)
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = "attn.rope"(%q) <{style = "neox"}> : (tensor<?x8x?x64xf16>) -> tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op option 'style' must be one of half, interleaved, got 'neox'}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op option 'style' must be one of half, interleaved, got 'neox'
// CHECK-NEXT: %r = "attn.rope"(%q) <{style = "neox"}> : (tensor<?x8x?x64xf16>) -> tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// infinite float option (generic form)
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = "attn.rope"(%q) <{theta = 0x7FF0000000000000 : f64}> : (tensor<?x8x?x64xf16>) -> tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op option 'theta' must be finite}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op option 'theta' must be finite
// CHECK-NEXT: %r = "attn.rope"(%q) <{theta = 0x7FF0000000000000 : f64}> : (tensor<?x8x?x64xf16>) -> tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// custom mask region with two blocks
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.mask custom %s : !attn.scores<?x8x?x?xf32> {
  // expected-error @above {{'attn.mask' op custom mask region must have a single block}}
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    %keep = arith.cmpi sge, %qi, %ki : index
    attn.yield %keep : i1
  ^bb1:
    %t = arith.constant true
    attn.yield %t : i1
  }
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op custom mask region must have a single block
// CHECK-NEXT: %m = attn.mask custom %s : !attn.scores<?x8x?x?xf32> {
// CHECK-NEXT: ^~~~~~~~~

// -----

// mask kind missing (generic form)
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = "attn.mask"(%s) ({}) : (!attn.scores<?x8x?x?xf32>) -> !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.mask' op kind must be given}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op kind must be given
// CHECK-NEXT: %m = "attn.mask"(%s) ({}) : (!attn.scores<?x8x?x?xf32>) -> !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~

// -----

// prefix_lm with two operands
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %n: tensor<?xi32>) {
  %m = attn.mask prefix_lm %s, %n, %n : !attn.scores<?x8x?x?xf32>, tensor<?xi32>, tensor<?xi32>
  // expected-error @above {{'attn.mask' op attn.mask prefix_lm takes one [B] prefix-length operand}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.mask' op attn.mask prefix_lm takes one [B] prefix-length operand
// CHECK-NEXT: %m = attn.mask prefix_lm %s, %n, %n : !attn.scores<?x8x?x?xf32>, tensor<?xi32>, tensor<?xi32>
// CHECK-NEXT: ^~~~~~~~~

// -----

// score_mod region signature
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.score_mod %s : !attn.scores<?x8x?x?xf32> {
  // expected-error @above {{'attn.score_mod' op score_mod region arguments must be (f32, index, index, index, index), got (f32)}}
  ^bb0(%x: f32):
    attn.yield %x : f32
  }
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.score_mod' op score_mod region arguments must be (f32, index, index, index, index), got (f32)
// CHECK-NEXT: %m = attn.score_mod %s : !attn.scores<?x8x?x?xf32> {
// CHECK-NEXT: ^~~~~~~~~~~~~~

// -----

// score_mod without a region
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.score_mod %s : !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.score_mod' op Region 'body' at position 0 expected a single block, but got 0 blocks}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.score_mod' op Region 'body' at position 0 expected a single block, but got 0 blocks
// CHECK-NEXT: %m = attn.score_mod %s : !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~~~~

// -----

// score_mod yield type
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.score_mod %s : !attn.scores<?x8x?x?xf32> {
  // expected-error @above {{'attn.score_mod' op region must yield one f32, got [Float16Type()]}}
  ^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index):
    %y = arith.truncf %x : f32 to f16
    attn.yield %y : f16
  }
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.score_mod' op region must yield one f32, got [Float16Type()]
// CHECK-NEXT: %m = attn.score_mod %s : !attn.scores<?x8x?x?xf32> {
// CHECK-NEXT: ^~~~~~~~~~~~~~

// -----

// score_mod yields two values
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %m = attn.score_mod %s : !attn.scores<?x8x?x?xf32> {
  // expected-error @above {{'attn.score_mod' op region must yield one f32, got [Float32Type(), Float32Type()]}}
  ^bb0(%x: f32, %b: index, %h: index, %qi: index, %ki: index):
    attn.yield %x, %x : f32, f32
  }
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.score_mod' op region must yield one f32, got [Float32Type(), Float32Type()]
// CHECK-NEXT: %m = attn.score_mod %s : !attn.scores<?x8x?x?xf32> {
// CHECK-NEXT: ^~~~~~~~~~~~~~

// -----

// attn.yield outside a region of mask/score_mod
func.func @f(%x: f32) {
  attn.yield %x : f32
  // expected-error @above {{'attn.yield' expects parent op to be one of 'attn.mask', 'attn.score_mod'}}
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:3: error: 'attn.yield' expects parent op to be one of 'attn.mask', 'attn.score_mod'
// CHECK-NEXT: attn.yield %x : f32
// CHECK-NEXT: ^~~~~~~~~~

// -----

// softmax result not probs
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %p = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.scores<?x8x?x?xf32>
  // expected-error @above {{'attn.softmax' op result 'output' at position 0 does not verify: !attn.scores<?x8x?x?xf32> should be of base attribute attn.probs}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.softmax' op result 'output' at position 0 does not verify: !attn.scores<?x8x?x?xf32> should be of base attribute attn.probs
// CHECK-NEXT: %p = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.scores<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// softmax result dims
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %p = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  // expected-error @above {{'attn.softmax' op result must be !attn.probs with dims [?, 8, ?, ?]}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.softmax' op result must be !attn.probs with dims [?, 8, ?, ?]
// CHECK-NEXT: %p = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x4x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// softmax lse shape
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %p, %lse = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>, tensor<?x4x?xf32>
  // expected-error @above {{'attn.softmax' op lse shape must be [?, 8, ?]}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:14: error: 'attn.softmax' op lse shape must be [?, 8, ?]
// CHECK-NEXT: %p, %lse = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>, tensor<?x4x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// softmax lse rank
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %p, %lse = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>, tensor<?x8x?x?xf32>
  // expected-error @above {{'attn.softmax' op lse must be tensor<BxHxSqxf32>}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:14: error: 'attn.softmax' op lse must be tensor<BxHxSqxf32>
// CHECK-NEXT: %p, %lse = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>, tensor<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// softmax lse element type
func.func @f(%s: !attn.scores<?x8x?x?xf32>) {
  %p, %lse = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>, tensor<?x8x?xf16>
  // expected-error @above {{'attn.softmax' op lse must be tensor<BxHxSqxf32>}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:14: error: 'attn.softmax' op lse must be tensor<BxHxSqxf32>
// CHECK-NEXT: %p, %lse = attn.softmax %s : !attn.scores<?x8x?x?xf32> -> !attn.probs<?x8x?x?xf32>, tensor<?x8x?xf16>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// softmax sinks length
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %sk: tensor<64xf32>) {
  %p = attn.softmax %s sinks %sk : !attn.scores<?x8x?x?xf32>, tensor<64xf32> -> !attn.probs<?x8x?x?xf32>
  // expected-error @above {{'attn.softmax' op attn.softmax sinks must have 8 elements, got 64}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.softmax' op attn.softmax sinks must have 8 elements, got 64
// CHECK-NEXT: %p = attn.softmax %s sinks %sk : !attn.scores<?x8x?x?xf32>, tensor<64xf32> -> !attn.probs<?x8x?x?xf32>
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// dropout p out of range
func.func @f(%p: !attn.probs<?x8x?x?xf32>, %seed: i64) {
  %d = attn.dropout %p, %seed {p = 1.0} : !attn.probs<?x8x?x?xf32>, i64
  // expected-error @above {{'attn.dropout' op option p must be given, in [0, 1)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.dropout' op option p must be given, in [0, 1)
// CHECK-NEXT: %d = attn.dropout %p, %seed {p = 1.0} : !attn.probs<?x8x?x?xf32>, i64
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// dropout p negative
func.func @f(%p: !attn.probs<?x8x?x?xf32>, %seed: i64) {
  %d = attn.dropout %p, %seed {p = -0.1} : !attn.probs<?x8x?x?xf32>, i64
  // expected-error @above {{'attn.dropout' op option p must be given, in [0, 1)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.dropout' op option p must be given, in [0, 1)
// CHECK-NEXT: %d = attn.dropout %p, %seed {p = -0.1} : !attn.probs<?x8x?x?xf32>, i64
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// dropout without p
func.func @f(%p: !attn.probs<?x8x?x?xf32>, %seed: i64) {
  %d = attn.dropout %p, %seed : !attn.probs<?x8x?x?xf32>, i64
  // expected-error @above {{'attn.dropout' op option p must be given, in [0, 1)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.dropout' op option p must be given, in [0, 1)
// CHECK-NEXT: %d = attn.dropout %p, %seed : !attn.probs<?x8x?x?xf32>, i64
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// dropout seed i32
func.func @f(%p: !attn.probs<?x8x?x?xf32>, %seed: i32) {
  %d = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x8x?x?xf32>, i32
  // expected-error @above {{'attn.dropout' op seed must be i64}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.dropout' op seed must be i64
// CHECK-NEXT: %d = attn.dropout %p, %seed {p = 0.1} : !attn.probs<?x8x?x?xf32>, i32
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// dropout on scores
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %seed: i64) {
  %d = attn.dropout %s, %seed {p = 0.1} : !attn.scores<?x8x?x?xf32>, i64
  // expected-error @above {{'attn.dropout' op operand 'input' at position 0 does not verify: !attn.scores<?x8x?x?xf32> should be of base attribute attn.probs}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.dropout' op operand 'input' at position 0 does not verify: !attn.scores<?x8x?x?xf32> should be of base attribute attn.probs
// CHECK-NEXT: %d = attn.dropout %s, %seed {p = 0.1} : !attn.scores<?x8x?x?xf32>, i64
// CHECK-NEXT: ^~~~~~~~~~~~

// -----

// weighted_sum on scores
func.func @f(%s: !attn.scores<?x8x?x?xf32>, %v: tensor<?x8x?x64xf16>) {
  %o = attn.weighted_sum %s, %v : !attn.scores<?x8x?x?xf32>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.weighted_sum' op operand 'probs' at position 0 does not verify: !attn.scores<?x8x?x?xf32> should be of base attribute attn.probs}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.weighted_sum' op operand 'probs' at position 0 does not verify: !attn.scores<?x8x?x?xf32> should be of base attribute attn.probs
// CHECK-NEXT: %o = attn.weighted_sum %s, %v : !attn.scores<?x8x?x?xf32>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~~~~~~~~~

// -----

// weighted_sum v heads
func.func @f(%p: !attn.probs<?x8x?x?xf32>, %v: tensor<?x3x?x64xf16>) {
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x3x?x64xf16> -> tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.weighted_sum' op heads (8) must be a multiple of v heads (3)}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.weighted_sum' op heads (8) must be a multiple of v heads (3)
// CHECK-NEXT: %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x3x?x64xf16> -> tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~~~~~~~~~

// -----

// weighted_sum v seq
func.func @f(%p: !attn.probs<?x8x?x32xf32>, %v: tensor<?x8x16x64xf16>) {
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x32xf32>, tensor<?x8x16x64xf16> -> tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.weighted_sum' op v batch/seq dims must match the probabilities}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.weighted_sum' op v batch/seq dims must match the probabilities
// CHECK-NEXT: %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x32xf32>, tensor<?x8x16x64xf16> -> tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~~~~~~~~~

// -----

// weighted_sum result head dim
func.func @f(%p: !attn.probs<?x8x?x?xf32>, %v: tensor<?x8x?x64xf16>) {
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x8x?x64xf16> -> tensor<?x8x?x128xf16>
  // expected-error @above {{'attn.weighted_sum' op result must be [?, 8, ?, 64]}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.weighted_sum' op result must be [?, 8, ?, 64]
// CHECK-NEXT: %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x8x?x64xf16> -> tensor<?x8x?x128xf16>
// CHECK-NEXT: ^~~~~~~~~~~~~~~~~

// -----

// weighted_sum result element type
func.func @f(%p: !attn.probs<?x8x?x?xf32>, %v: tensor<?x8x?x64xf16>) {
  %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xf32>
  // expected-error @above {{'attn.weighted_sum' op result must be a tensor of v's element type}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.weighted_sum' op result must be a tensor of v's element type
// CHECK-NEXT: %o = attn.weighted_sum %p, %v : !attn.probs<?x8x?x?xf32>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xf32>
// CHECK-NEXT: ^~~~~~~~~~~~~~~~~

// -----

// rotation frequencies theta^(-2i/d) beyond f32 (driver fuzz: lower-backward crashed)
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {theta = 1.0e-320} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op theta and factor give rotation frequencies beyond the f32 range}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op theta and factor give rotation frequencies beyond the f32 range (theta^(-2i/rotary_dim) / factor > 3.4e38)
// CHECK-NEXT: %r = attn.rope %q {theta = 1.0e-320} : tensor<?x8x?x64xf16>
// CHECK-NEXT: ^~~~~~~~~

// -----

// the same through a tiny scaling factor
func.func @f(%q: tensor<?x8x?x64xf16>) {
  %r = attn.rope %q {scaling = "linear", factor = 1.0e-40} : tensor<?x8x?x64xf16>
  // expected-error @above {{'attn.rope' op theta and factor give rotation frequencies beyond the f32 range}}
  func.return
}

// -----

// a static dim beyond i32 (lower-backward failed unlocated on an i32 constant)
func.func @f(%q: tensor<?x4294967296x?x64xf16>) {
  %r = attn.rope %q : tensor<?x4294967296x?x64xf16>
  // expected-error @above {{rope input heads dim 4294967296 is larger than 2147483647}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op rope input heads dim 4294967296 is larger than 2147483647

// -----

// more heads than the grid holds (driver fuzz: per-head tables ran out of memory)
func.func @f(%q: tensor<?x65536x?x64xf16>) {
  %r = attn.rope %q : tensor<?x65536x?x64xf16>
  // expected-error @above {{rope input heads 65536 is more than 65535}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op rope input heads 65536 is more than 65535 (kernels launch batch x heads programs on the grid's y axis)

// -----

// a head dim no Triton block holds (driver fuzz: rope tables ran out of memory)
func.func @f(%q: tensor<?x8x?x65538xf16>) {
  %r = attn.rope %q : tensor<?x8x?x65538xf16>
  // expected-error @above {{rope input head_dim 65538 is larger than 65536}}
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.rope' op rope input head_dim 65538 is larger than 65536 (a 16-row tile of it must fit Triton's 2^20-element block)

// -----

// a tile plan clause that does not exist
func.func @f(%s: !attn.scores<?x4x?x?xf32>, %v: tensor<?x2x?x64xf16>) {
  // expected-error @+1 {{Expected one of 'band', 'exact', 'prefix', 'runtime_block_map' in #attn.tile_plan}}
  %o = attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<128x64, causal>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:72: error: Expected one of 'band', 'exact', 'prefix', 'runtime_block_map' in #attn.tile_plan

// -----

// a tile plan clause given twice
func.func @f(%s: !attn.scores<?x4x?x?xf32>, %v: tensor<?x2x?x64xf16>) {
  // expected-error @+1 {{'exact' given twice}}
  %o = attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<128x64, exact, exact>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:79: error: 'exact' given twice

// -----

// tile_plan takes a #attn.tile_plan
func.func @f(%s: !attn.scores<?x4x?x?xf32>, %v: tensor<?x2x?x64xf16>) {
  // expected-error @+1 {{option 'tile_plan' expects #attn.tile_plan<...>}}
  %o = attn.online_softmax %s, %v {tile_plan = 128} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:48: error: option 'tile_plan' expects #attn.tile_plan<...>

// -----

// tile sizes the kernels cannot use
func.func @f(%s: !attn.scores<?x4x?x?xf32>, %v: tensor<?x2x?x64xf16>) {
  // expected-error @+1 {{#attn.tile_plan: block_n must be a power of two >= 16, got 48}}
  %o = attn.online_softmax %s, %v {tile_plan = #attn.tile_plan<128x48>} : !attn.scores<?x4x?x?xf32>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.online_softmax' op #attn.tile_plan: block_n must be a power of two >= 16, got 48

// -----

// a packed batch needs cu_seqlens for both sides
func.func @f(%q: tensor<1x4x?x16xf16>, %k: tensor<1x2x?x16xf16>, %cu: tensor<?xi32>) {
  // expected-error @+1 {{a packed batch needs both cu_seqlens_q and cu_seqlens_k}}
  %s = attn.scores %q, %k cu_seqlens_q %cu : tensor<1x4x?x16xf16>, tensor<1x2x?x16xf16>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op a packed batch needs both cu_seqlens_q and cu_seqlens_k

// -----

// packed q and k have batch dim 1
func.func @f(%q: tensor<?x4x?x16xf16>, %k: tensor<?x2x?x16xf16>, %cu: tensor<?xi32>) {
  // expected-error @+1 {{packed q and k have batch dim 1 ([1, heads, total_tokens, head_dim]), got q [?, 4, ?, 16] and k [?, 2, ?, 16]}}
  %s = attn.scores %q, %k cu_seqlens_q %cu cu_seqlens_k %cu : tensor<?x4x?x16xf16>, tensor<?x2x?x16xf16>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op packed q and k have batch dim 1 ([1, heads, total_tokens, head_dim]), got q [?, 4, ?, 16] and k [?, 2, ?, 16]

// -----

// cumulative sequence lengths are int32
func.func @f(%q: tensor<1x4x?x16xf16>, %k: tensor<1x2x?x16xf16>, %cu: tensor<?xi64>) {
  // expected-error @+1 {{attn.scores cu_seqlens_q must be tensor<?xi32> (cumulative sequence lengths), got tensor<?xi64>}}
  %s = attn.scores %q, %k cu_seqlens_q %cu cu_seqlens_k %cu : tensor<1x4x?x16xf16>, tensor<1x2x?x16xf16>, tensor<?xi64>, tensor<?xi64> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op attn.scores cu_seqlens_q must be tensor<?xi32> (cumulative sequence lengths), got tensor<?xi64>

// -----

// packed scores count sequences, not batch rows
func.func @f(%q: tensor<1x4x?x16xf16>, %k: tensor<1x2x?x16xf16>, %cu: tensor<?xi32>) {
  // expected-error @+1 {{packed scores have dynamic batch, q_len and kv_len dims (one [len_q, len_k] block per sequence)}}
  %s = attn.scores %q, %k cu_seqlens_q %cu cu_seqlens_k %cu : tensor<1x4x?x16xf16>, tensor<1x2x?x16xf16>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<1x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op packed scores have dynamic batch, q_len and kv_len dims (one [len_q, len_k] block per sequence)

// -----

// a paged KV cache needs the block table and the lengths
func.func @f(%q: tensor<?x4x?x16xf16>, %k: tensor<?x2x8x16xf16>, %bt: tensor<?x?xi32>) {
  // expected-error @+1 {{a paged KV cache (block_table) needs kv_lens}}
  %s = attn.scores %q, %k block_table %bt : tensor<?x4x?x16xf16>, tensor<?x2x8x16xf16>, tensor<?x?xi32> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op a paged KV cache (block_table) needs kv_lens

// -----

// the lengths of a contiguous cache: int32, one per sequence of q
func.func @f(%q: tensor<2x4x?x16xf16>, %k: tensor<2x2x?x16xf16>, %n: tensor<3xi32>) {
  // expected-error @+1 {{kv_lens [3] has one entry per sequence of q (batch [2])}}
  %s = attn.scores %q, %k kv_lens %n : tensor<2x4x?x16xf16>, tensor<2x2x?x16xf16>, tensor<3xi32> -> !attn.scores<2x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op kv_lens [3] has one entry per sequence of q (batch [2])

// -----

func.func @f(%q: tensor<?x4x?x16xf16>, %k: tensor<?x2x?x16xf16>, %n: tensor<?xi64>) {
  // expected-error @+1 {{attn.scores kv_lens must be an int32 [batch] tensor, got tensor<?xi64>}}
  %s = attn.scores %q, %k kv_lens %n : tensor<?x4x?x16xf16>, tensor<?x2x?x16xf16>, tensor<?xi64> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op attn.scores kv_lens must be an int32 [batch] tensor, got tensor<?xi64>

// -----

func.func @f(%q: tensor<1x4x?x16xf16>, %k: tensor<1x2x?x16xf16>, %cu: tensor<?xi32>, %n: tensor<?xi32>) {
  // expected-error @+1 {{a KV cache with kv_lens and a packed batch (cu_seqlens) do not combine}}
  %s = attn.scores %q, %k cu_seqlens_q %cu cu_seqlens_k %cu kv_lens %n : tensor<1x4x?x16xf16>, tensor<1x2x?x16xf16>, tensor<?xi32>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op a KV cache with kv_lens and a packed batch (cu_seqlens) do not combine

// -----

// a page pool has a static page size
func.func @f(%q: tensor<?x4x?x16xf16>, %k: tensor<?x2x?x16xf16>, %bt: tensor<?x?xi32>, %n: tensor<?xi32>) {
  // expected-error @+1 {{attn.scores k page pool needs a static page size (dim 2), got [?, 2, ?, 16]}}
  %s = attn.scores %q, %k block_table %bt kv_lens %n : tensor<?x4x?x16xf16>, tensor<?x2x?x16xf16>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op attn.scores k page pool needs a static page size (dim 2), got [?, 2, ?, 16]

// -----

// a page pool has a dynamic page count
func.func @f(%q: tensor<?x4x?x16xf16>, %k: tensor<64x2x8x16xf16>, %bt: tensor<?x?xi32>, %n: tensor<?xi32>) {
  // expected-error @+1 {{attn.scores k page pool has a dynamic page count ([?, heads, page_size, head_dim]), got [64, 2, 8, 16]}}
  %s = attn.scores %q, %k block_table %bt kv_lens %n : tensor<?x4x?x16xf16>, tensor<64x2x8x16xf16>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op attn.scores k page pool has a dynamic page count ([?, heads, page_size, head_dim]), got [64, 2, 8, 16]

// -----

// the block table is an int32 matrix
func.func @f(%q: tensor<?x4x?x16xf16>, %k: tensor<?x2x8x16xf16>, %bt: tensor<?xi32>, %n: tensor<?xi32>) {
  // expected-error @+1 {{attn.scores block_table must be an int32 [batch, max_pages] tensor, got tensor<?xi32>}}
  %s = attn.scores %q, %k block_table %bt kv_lens %n : tensor<?x4x?x16xf16>, tensor<?x2x8x16xf16>, tensor<?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op attn.scores block_table must be an int32 [batch, max_pages] tensor, got tensor<?xi32>

// -----

// the lengths are int32
func.func @f(%q: tensor<?x4x?x16xf16>, %k: tensor<?x2x8x16xf16>, %bt: tensor<?x?xi32>, %n: tensor<?xi64>) {
  // expected-error @+1 {{attn.scores kv_lens must be an int32 [batch] tensor, got tensor<?xi64>}}
  %s = attn.scores %q, %k block_table %bt kv_lens %n : tensor<?x4x?x16xf16>, tensor<?x2x8x16xf16>, tensor<?x?xi32>, tensor<?xi64> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op attn.scores kv_lens must be an int32 [batch] tensor, got tensor<?xi64>

// -----

// one block table row and one length per sequence of q
func.func @f(%q: tensor<2x4x?x16xf16>, %k: tensor<?x2x8x16xf16>, %bt: tensor<3x?xi32>, %n: tensor<?xi32>) {
  // expected-error @+1 {{block_table [3, ?] and kv_lens [?] have one row per sequence of q (batch [2])}}
  %s = attn.scores %q, %k block_table %bt kv_lens %n : tensor<2x4x?x16xf16>, tensor<?x2x8x16xf16>, tensor<3x?xi32>, tensor<?xi32> -> !attn.scores<2x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op block_table [3, ?] and kv_lens [?] have one row per sequence of q (batch [2])

// -----

// paged scores have one key count per sequence
func.func @f(%q: tensor<?x4x?x16xf16>, %k: tensor<?x2x8x16xf16>, %bt: tensor<?x?xi32>, %n: tensor<?xi32>) {
  // expected-error @+1 {{paged scores have a dynamic kv_len dim (kv_lens[b] keys per sequence)}}
  %s = attn.scores %q, %k block_table %bt kv_lens %n : tensor<?x4x?x16xf16>, tensor<?x2x8x16xf16>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x8xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op paged scores have a dynamic kv_len dim (kv_lens[b] keys per sequence)

// -----

// a paged cache and a packed batch do not combine
func.func @f(%q: tensor<1x4x?x16xf16>, %k: tensor<?x2x8x16xf16>, %bt: tensor<?x?xi32>, %n: tensor<?xi32>) {
  // expected-error @+1 {{a paged KV cache (block_table) and a packed batch (cu_seqlens) do not combine}}
  %s = attn.scores %q, %k cu_seqlens_q %n cu_seqlens_k %n block_table %bt kv_lens %n : tensor<1x4x?x16xf16>, tensor<?x2x8x16xf16>, tensor<?xi32>, tensor<?xi32>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  func.return
}

// CHECK:      attn_invalid.mlir:{{[0-9]+}}:8: error: 'attn.scores' op a paged KV cache (block_table) and a packed batch (cu_seqlens) do not combine
