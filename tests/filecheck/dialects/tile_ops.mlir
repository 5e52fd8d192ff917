// RUN: attnfuse-opt %s --print-op-generic | attnfuse-opt | filecheck %s

// Every op of the tile dialect, parsed from custom syntax, printed generic, parsed
// back and printed custom again. Omitted kernel attributes get their defaults.

builtin.module {
  tile.kernel @ops(%x: !tile.ptr<bf16>, %acc_out: !tile.ptr<f32>, %n: i32, %stride: i64, %scale: f32) attributes {num_warps = 8, num_stages = 2, launch = {grid = [4, 1, 1], kernel = "fwd"}} {
    %pid = tile.program_id 0 : i32
    %np = tile.num_programs 1 : i32
    %offs = tile.arange 0, 16 : tensor<16xi32>
    %base = arith.extsi %pid : i32 to i64
    %xb = tile.ptr_add %x, %base : !tile.ptr<bf16>, i64
    %nv = tile.splat %n : i32 -> tensor<16x1xi32>
    %row = tile.expand_dims %offs {axis = 1} : tensor<16xi32> -> tensor<16x1xi32>
    %col = tile.expand_dims %offs {axis = 0} : tensor<16xi32> -> tensor<1x16xi32>
    %rowb = tile.broadcast %row : tensor<16x1xi32> -> tensor<16x16xi32>
    %colb = tile.broadcast %col : tensor<1x16xi32> -> tensor<16x16xi32>
    %c16 = arith.constant dense<16> : tensor<16x16xi32>
    %r16 = arith.muli %rowb, %c16 : tensor<16x16xi32>
    %idx = arith.addi %r16, %colb : tensor<16x16xi32>
    %in = tile.cmp lt, %row, %nv : tensor<16x1xi32> -> tensor<16x1xi1>
    %m = tile.broadcast %in : tensor<16x1xi1> -> tensor<16x16xi1>
    %zero = arith.constant dense<0.000000e+00> : tensor<16x16xbf16>
    %a = tile.load %xb[%idx] mask %m other %zero : !tile.ptr<bf16>, tensor<16x16xi32> -> tensor<16x16xbf16>
    %a2 = tile.load %xb[%idx] mask %m : !tile.ptr<bf16>, tensor<16x16xi32> -> tensor<16x16xbf16>
    %a3 = tile.load %xb[%idx] : !tile.ptr<bf16>, tensor<16x16xi32> -> tensor<16x16xbf16>
    %s = tile.load %xb[%n] : !tile.ptr<bf16>, i32 -> bf16
    %at = tile.trans %a : tensor<16x16xbf16> -> tensor<16x16xbf16>
    %d = tile.dot %a, %at : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
    %d2 = tile.dot %a, %a2, %d : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
    %mx = tile.reduce max %d2 {axis = 1} : tensor<16x16xf32> -> tensor<16xf32>
    %sm = tile.reduce sum %mx {axis = 0} : tensor<16xf32> -> f32
    %mn = tile.reduce min %d2 {axis = 0} : tensor<16x16xf32> -> tensor<16xf32>
    %seed = arith.constant 42 : i64
    %u = tile.rand %seed, %idx : i64, tensor<16x16xi32> -> tensor<16x16xf32>
    %half = arith.constant dense<5.000000e-01> : tensor<16x16xf32>
    %keep = tile.cmp ge, %u, %half : tensor<16x16xf32> -> tensor<16x16xi1>
    %w = tile.where %keep, %d2, %half : tensor<16x16xi1>, tensor<16x16xf32>
    %f = tile.convert %idx : tensor<16x16xi32> -> tensor<16x16xf32>
    %r = tile.reshape %w : tensor<16x16xf32> -> tensor<256xf32>
    %idx2 = tile.reshape %idx : tensor<16x16xi32> -> tensor<256xi32>
    %e = math.exp2 %r : tensor<256xf32>
    tile.store %acc_out[%idx2], %e : !tile.ptr<f32>, tensor<256xi32>, tensor<256xf32>
    tile.atomic_add %acc_out[%idx], %f mask %m : !tile.ptr<f32>, tensor<16x16xi32>, tensor<16x16xf32>
    %lo = arith.constant 0 : i32
    %step = arith.constant 16 : i32
    %res, %res_1 = scf.for %i = %lo to %n step %step iter_args(%acc = %d, %mi = %mx) -> (tensor<16x16xf32>, tensor<16xf32>) : i32 {
      %acc2 = arith.addf %acc, %d : tensor<16x16xf32>
      scf.yield %acc2, %mi : tensor<16x16xf32>, tensor<16xf32>
    }
    %big = arith.cmpi sgt, %n, %lo : i32
    %sel = scf.if %big -> (f32) {
      %one = arith.constant 1.000000e+00 : f32
      scf.yield %one : f32
    } else {
      scf.yield %scale : f32
    }
    %ninf = arith.constant 0xFF800000 : f32
    %ninf_t = tile.splat %ninf : f32 -> tensor<16xf32>
    %bf = arith.truncf %res_1 : tensor<16xf32> to tensor<16xbf16>
    %i8 = tile.convert %offs : tensor<16xi32> -> tensor<16xi8>
    tile.return
  }
  tile.kernel @empty() attributes {launch = {}} {
    tile.return
  }
  tile.kernel @ticket(%count: !tile.ptr<i32>, %i: i32) attributes {launch = {}} {
    %one = arith.constant 1 : i32
    tile.barrier
    %t = tile.atomic_fetch_add %count[%i], %one : !tile.ptr<i32>, i32
    tile.return
  }
}

// CHECK:      builtin.module {
// CHECK-NEXT:   tile.kernel @ops(%x: !tile.ptr<bf16>, %acc_out: !tile.ptr<f32>, %n: i32, %stride: i64, %scale: f32) attributes {num_warps = 8 : i64, num_stages = 2 : i64, launch = {grid = [4 : i64, 1 : i64, 1 : i64], kernel = "fwd"}} {
// CHECK-NEXT:     %pid = tile.program_id 0 : i32
// CHECK-NEXT:     %np = tile.num_programs 1 : i32
// CHECK-NEXT:     %offs = tile.arange 0, 16 : tensor<16xi32>
// CHECK-NEXT:     %base = arith.extsi %pid : i32 to i64
// CHECK-NEXT:     %xb = tile.ptr_add %x, %base : !tile.ptr<bf16>, i64
// CHECK-NEXT:     %nv = tile.splat %n : i32 -> tensor<16x1xi32>
// CHECK-NEXT:     %row = tile.expand_dims %offs {axis = 1 : i64} : tensor<16xi32> -> tensor<16x1xi32>
// CHECK-NEXT:     %col = tile.expand_dims %offs {axis = 0 : i64} : tensor<16xi32> -> tensor<1x16xi32>
// CHECK-NEXT:     %rowb = tile.broadcast %row : tensor<16x1xi32> -> tensor<16x16xi32>
// CHECK-NEXT:     %colb = tile.broadcast %col : tensor<1x16xi32> -> tensor<16x16xi32>
// CHECK-NEXT:     %c16 = arith.constant dense<16> : tensor<16x16xi32>
// CHECK-NEXT:     %r16 = arith.muli %rowb, %c16 : tensor<16x16xi32>
// CHECK-NEXT:     %idx = arith.addi %r16, %colb : tensor<16x16xi32>
// CHECK-NEXT:     %in = tile.cmp lt, %row, %nv : tensor<16x1xi32> -> tensor<16x1xi1>
// CHECK-NEXT:     %m = tile.broadcast %in : tensor<16x1xi1> -> tensor<16x16xi1>
// CHECK-NEXT:     %zero = arith.constant dense<0.000000e+00> : tensor<16x16xbf16>
// CHECK-NEXT:     %a = tile.load %xb[%idx] mask %m other %zero : !tile.ptr<bf16>, tensor<16x16xi32> -> tensor<16x16xbf16>
// CHECK-NEXT:     %a2 = tile.load %xb[%idx] mask %m : !tile.ptr<bf16>, tensor<16x16xi32> -> tensor<16x16xbf16>
// CHECK-NEXT:     %a3 = tile.load %xb[%idx] : !tile.ptr<bf16>, tensor<16x16xi32> -> tensor<16x16xbf16>
// CHECK-NEXT:     %s = tile.load %xb[%n] : !tile.ptr<bf16>, i32 -> bf16
// CHECK-NEXT:     %at = tile.trans %a : tensor<16x16xbf16> -> tensor<16x16xbf16>
// CHECK-NEXT:     %d = tile.dot %a, %at : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
// CHECK-NEXT:     %d2 = tile.dot %a, %a2, %d : tensor<16x16xbf16>, tensor<16x16xbf16> -> tensor<16x16xf32>
// CHECK-NEXT:     %mx = tile.reduce max %d2 {axis = 1 : i64} : tensor<16x16xf32> -> tensor<16xf32>
// CHECK-NEXT:     %sm = tile.reduce sum %mx {axis = 0 : i64} : tensor<16xf32> -> f32
// CHECK-NEXT:     %mn = tile.reduce min %d2 {axis = 0 : i64} : tensor<16x16xf32> -> tensor<16xf32>
// CHECK-NEXT:     %seed = arith.constant 42 : i64
// CHECK-NEXT:     %u = tile.rand %seed, %idx : i64, tensor<16x16xi32> -> tensor<16x16xf32>
// CHECK-NEXT:     %half = arith.constant dense<5.000000e-01> : tensor<16x16xf32>
// CHECK-NEXT:     %keep = tile.cmp ge, %u, %half : tensor<16x16xf32> -> tensor<16x16xi1>
// CHECK-NEXT:     %w = tile.where %keep, %d2, %half : tensor<16x16xi1>, tensor<16x16xf32>
// CHECK-NEXT:     %f = tile.convert %idx : tensor<16x16xi32> -> tensor<16x16xf32>
// CHECK-NEXT:     %r = tile.reshape %w : tensor<16x16xf32> -> tensor<256xf32>
// CHECK-NEXT:     %idx2 = tile.reshape %idx : tensor<16x16xi32> -> tensor<256xi32>
// CHECK-NEXT:     %e = math.exp2 %r : tensor<256xf32>
// CHECK-NEXT:     tile.store %acc_out[%idx2], %e : !tile.ptr<f32>, tensor<256xi32>, tensor<256xf32>
// CHECK-NEXT:     tile.atomic_add %acc_out[%idx], %f mask %m : !tile.ptr<f32>, tensor<16x16xi32>, tensor<16x16xf32>
// CHECK-NEXT:     %lo = arith.constant 0 : i32
// CHECK-NEXT:     %step = arith.constant 16 : i32
// CHECK-NEXT:     %res, %res_1 = scf.for %i = %lo to %n step %step iter_args(%acc = %d, %mi = %mx) -> (tensor<16x16xf32>, tensor<16xf32>) : i32 {
// CHECK-NEXT:       %acc2 = arith.addf %acc, %d : tensor<16x16xf32>
// CHECK-NEXT:       scf.yield %acc2, %mi : tensor<16x16xf32>, tensor<16xf32>
// CHECK-NEXT:     }
// CHECK-NEXT:     %big = arith.cmpi sgt, %n, %lo : i32
// CHECK-NEXT:     %sel = scf.if %big -> (f32) {
// CHECK-NEXT:       %one = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:       scf.yield %one : f32
// CHECK-NEXT:     } else {
// CHECK-NEXT:       scf.yield %scale : f32
// CHECK-NEXT:     }
// CHECK-NEXT:     %ninf = arith.constant 0xff800000 : f32
// CHECK-NEXT:     %ninf_t = tile.splat %ninf : f32 -> tensor<16xf32>
// CHECK-NEXT:     %bf = arith.truncf %res_1 : tensor<16xf32> to tensor<16xbf16>
// CHECK-NEXT:     %i8 = tile.convert %offs : tensor<16xi32> -> tensor<16xi8>
// CHECK-NEXT:     tile.return
// CHECK-NEXT:   }
// CHECK-NEXT:   tile.kernel @empty() attributes {num_warps = 4 : i64, num_stages = 3 : i64, launch = {}} {
// CHECK-NEXT:     tile.return
// CHECK-NEXT:   }
// CHECK-NEXT:   tile.kernel @ticket(%count: !tile.ptr<i32>, %i: i32) attributes {num_warps = 4 : i64, num_stages = 3 : i64, launch = {}} {
// CHECK-NEXT:     %one = arith.constant 1 : i32
// CHECK-NEXT:     tile.barrier
// CHECK-NEXT:     %t = tile.atomic_fetch_add %count[%i], %one : !tile.ptr<i32>, i32
// CHECK-NEXT:     tile.return
// CHECK-NEXT:   }
// CHECK-NEXT: }
