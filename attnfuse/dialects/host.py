"""The `host` dialect: the launch sequence that runs a lowered attention program.

After `lower-to-tile`, an attention function's body is host code: it reads sizes off its
tensor arguments, allocates outputs and scratch buffers, and launches `tile.kernel`s.
Host tensors are buffers: a kernel writes into the tensors passed to it, which is how
outputs and intermediates (pre-rotated K, block maps, lse) come into being.

A tensor operand of `host.launch` reaches the kernel as a pointer followed by one i32
stride per dimension (in elements); scalar operands pass as they are.

Launches, allocations, conversions and reductions may be guarded (`when %c`, negated by
`unless`): they run only on one of two paths. `%c` depends on the shape class of a call
only (`host.tma_ready`), so a launch plan holds one path; `arith.select %c, %a, %b` on
tensors joins the two paths' results.

```mlir
func.func @llama3(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %b = host.dim %q[0] : tensor<?x32x?x128xbf16>
  %sq = host.dim %q[2] : tensor<?x32x?x128xbf16>
  %o = host.alloc %b, %sq : tensor<?x32x?x128xbf16>
  host.launch @llama3_fwd[%g0, %g1, %c1] (%q, %k, %v, %o, %b, %sq) : tensor<?x32x?x128xbf16>, ...
  func.return %o : tensor<?x32x?x128xbf16>
}
```
"""

from __future__ import annotations

from xdsl.dialects.builtin import I64, DenseArrayBase, IntegerAttr, SymbolRefAttr, TensorType, UnitAttr, i1, i32
from xdsl.ir import Dialect
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParsePropInAttrDict,
    opt_operand_def,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    var_operand_def,
)
from xdsl.utils.exceptions import VerifyException

TOP_LEFT_BAND = "attnfuse.top_left_band"
"""Attribute of a lowered function whose causal / window band is aligned top-left:
`[q argument index, k argument index]`. The runtime warns when a call has fewer queries
than keys (decoding against a cache), where top-left alignment lets query i see only
keys <= i."""


def _verify_guard(op: IRDLOperation) -> None:
    """`unless` negates a `when` condition: it needs one."""
    if op.unless is not None and op.cond is None:  # type: ignore[attr-defined]
        raise VerifyException(f"{op.name}: 'unless' needs a 'when' condition")


@irdl_op_definition
class DimOp(IRDLOperation):
    """The size of one dimension of a host tensor, as i32.

    ```mlir
    %sq = host.dim %q[2] : tensor<?x32x?x128xbf16>
    ```
    """

    name = "host.dim"
    source = operand_def(TensorType)
    index = prop_def(IntegerAttr[I64])
    result = result_def(i32)
    assembly_format = "$source `[` $index `]` attr-dict `:` type($source)"

    def __init__(self, source: object, index: int) -> None:
        super().__init__(
            operands=[source], result_types=[i32], properties={"index": IntegerAttr(index, 64)}
        )

    def verify_(self) -> None:
        assert isinstance(self.source.type, TensorType)
        if not 0 <= self.index.value.data < len(self.source.type.get_shape()):
            raise VerifyException(f"host.dim: index {self.index.value.data} out of range")


@irdl_op_definition
class SmCountOp(IRDLOperation):
    """The number of streaming multiprocessors of the device a call runs on, as i32
    (132 on an H100 / H200). Launch plans size grids with it (split-KV decoding); on the
    CPU, where kernels run in the Triton interpreter, it is that of an H200, so CPU runs
    take the launch decisions a Hopper GPU would.

    ```mlir
    %sms = host.sm_count : i32
    ```
    """

    name = "host.sm_count"
    result = result_def(i32)
    assembly_format = "attr-dict `:` type($result)"

    def __init__(self) -> None:
        super().__init__(result_types=[i32])


@irdl_op_definition
class FitsI32Op(IRDLOperation):
    """Whether i32 element offsets from its first element reach every element of each
    operand: `sum((size - 1) * stride) < 2**31` over its dims (an empty tensor: true).
    It depends only on the shape class of a call (shapes and strides), so a launch plan
    holds it; kernels built with i32 offsets into large operands (a paged program's page
    pools) are launched under it.

    ```mlir
    %fits = host.fits_i32 %k_cache, %v_cache : tensor<?x8x16x128xbf16>, tensor<?x8x16x128xbf16>
    ```
    """

    name = "host.fits_i32"
    tensors = var_operand_def(TensorType)
    result = result_def(i1)
    assembly_format = "$tensors attr-dict `:` type($tensors)"

    def __init__(self, tensors: list[object]) -> None:
        super().__init__(operands=[tensors], result_types=[i1])


@irdl_op_definition
class KeepsResultsOp(IRDLOperation):
    """1 when the call keeps every result of the host function, 0 when it keeps only
    the first (eager inference: `out` without lse or saved transforms), as i32. Set per
    call, not per plan: kernels skip work that only the dropped results need (the
    forward's store of the rotated Q for the backward).

    ```mlir
    %keeps = host.keeps_results : i32
    ```
    """

    name = "host.keeps_results"
    result = result_def(i32)
    assembly_format = "attr-dict `:` type($result)"

    def __init__(self) -> None:
        super().__init__(result_types=[i32])


@irdl_op_definition
class AllocOp(IRDLOperation):
    """A new buffer on the inputs' device; one i32 operand per dynamic dim. `order`
    gives the dims from outermost to innermost in memory (default: row-major), e.g.
    `[B, H, S, D]` stored as `[B, S, H, D]`:

    `zero restored`: a zero buffer that every launch using it leaves zero (counters that
    the last program to count resets), so a launch plan may keep one per stream, and a
    call captured into a CUDA graph may take one zeroed before the capture.

    With `when %c` (`unless`: when it does not hold) the buffer exists only on that path
    of a guarded launch sequence; only ops on the same path, and `arith.select` on `%c`,
    may use it.

    ```mlir
    %lse = host.alloc %b, %sq zero : tensor<?x32x?xf32>
    %out = host.alloc %b, %sq {order = array<i64: 0, 2, 1, 3>} : tensor<?x32x?x128xbf16>
    %d_q_f32 = host.alloc %b, %sq when %ok : tensor<?x32x?x128xf32>
    %counts = host.alloc %bh zero restored : tensor<?xi32>
    ```
    """

    name = "host.alloc"
    sizes = var_operand_def(i32)
    cond = opt_operand_def(i1)
    zero = opt_prop_def(UnitAttr)
    restored = opt_prop_def(UnitAttr)
    unless = opt_prop_def(UnitAttr)
    order = opt_prop_def(DenseArrayBase)
    result = result_def(TensorType)
    irdl_options = (AttrSizedOperandSegments(), ParsePropInAttrDict())
    assembly_format = ("$sizes (`zero` $zero^)? (`restored` $restored^)? (`when` $cond^)? (`unless` $unless^)? "
                       "attr-dict `:` type($result)")

    def verify_(self) -> None:
        _verify_guard(self)
        if self.restored is not None and self.zero is None:
            raise VerifyException("host.alloc: `restored` applies to a `zero` buffer")
        assert isinstance(self.result.type, TensorType)
        dynamic = sum(1 for d in self.result.type.get_shape() if d < 0)
        if dynamic != len(self.sizes):
            raise VerifyException(
                f"host.alloc: {dynamic} dynamic dims need {dynamic} size operands, got {len(self.sizes)}"
            )
        if self.order is not None:
            rank = self.result.type.get_num_dims()
            order = tuple(self.order.get_values())
            if sorted(order) != list(range(rank)):
                raise VerifyException(f"host.alloc: order {list(order)} is not a permutation of the {rank} dims")

    def dim_order(self) -> tuple[int, ...] | None:
        """The memory order of the dims, None for row-major."""
        if self.order is None:
            return None
        order = tuple(int(d) for d in self.order.get_values())
        return None if order == tuple(range(len(order))) else order


@irdl_op_definition
class LaunchOp(IRDLOperation):
    """Launch `@kernel` on a 3-D grid of programs with the given arguments; with
    `when %c` only if `%c` holds (`unless` negates it: the fallback of a guarded launch).

    ```mlir
    host.launch @attn_fwd[%g0, %g1, %c1] (%q, %o, %sq) : tensor<?x8x?x64xf16>, tensor<?x8x?x64xf16>, i32
    host.launch @attn_fwd_ws[%g0, %g1, %c1] (%k, %v, %o, %sq) when %ok : ...
    host.launch @attn_fwd[%g0, %g1, %c1] (%q, %o, %sq) when %ok unless : ...
    ```
    """

    name = "host.launch"
    kernel = prop_def(SymbolRefAttr)
    grid_x = operand_def(i32)
    grid_y = operand_def(i32)
    grid_z = operand_def(i32)
    args = var_operand_def()
    cond = opt_operand_def(i1)
    unless = opt_prop_def(UnitAttr)
    irdl_options = (AttrSizedOperandSegments(),)
    assembly_format = (
        "$kernel `[` $grid_x `,` $grid_y `,` $grid_z `]` ` ` `(` $args `)` (`when` $cond^)? (`unless` $unless^)? "
        "attr-dict `:` type($args)"
    )

    def verify_(self) -> None:
        _verify_guard(self)


@irdl_op_definition
class TmaReadyOp(IRDLOperation):
    """Whether a call may use TMA kernels: the device has compute capability `arch`.x and
    every operand is contiguous, 16-byte aligned, with dim 2 a multiple of `rows`. It
    depends only on the shape class of a call (shapes, strides, device, alignment).

    ```mlir
    %ok = host.tma_ready %q, %k, %v, %out {arch = 9 : i64, rows = 128 : i64} : tensor<?x32x?x128xbf16>, ...
    ```
    """

    name = "host.tma_ready"
    tensors = var_operand_def(TensorType)
    arch = prop_def(IntegerAttr[I64])
    rows = prop_def(IntegerAttr[I64])
    result = result_def(i1)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$tensors attr-dict `:` type($tensors)"

    def __init__(self, tensors: list[object], arch: int, rows: int) -> None:
        super().__init__(operands=[tensors], result_types=[i1],
                         properties={"arch": IntegerAttr(arch, 64), "rows": IntegerAttr(rows, 64)})


@irdl_op_definition
class ReduceSumOp(IRDLOperation):
    """Sum a host tensor over `dims` (kept as size 1 with `keepdim`), in fp32.

    Used to finish deterministic gradient reductions (per-program partial sums).

    ```mlir
    %d_sinks = host.reduce_sum %partials {dims = array<i64: 0, 2>} : tensor<?x64x?xf32> -> tensor<64xf32>
    ```
    """

    name = "host.reduce_sum"
    input = operand_def(TensorType)
    cond = opt_operand_def(i1)
    dims = prop_def(DenseArrayBase)
    keepdim = opt_prop_def(UnitAttr)
    unless = opt_prop_def(UnitAttr)
    result = result_def(TensorType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input (`when` $cond^)? (`unless` $unless^)? attr-dict `:` type($input) `->` type($result)"

    def verify_(self) -> None:
        _verify_guard(self)


@irdl_op_definition
class ConvertOp(IRDLOperation):
    """Convert a host tensor to another element type (same shape); `order`: the result's
    memory order, as `host.alloc`'s (default: the input's strides).

    ```mlir
    %dw = host.convert %dw32 : tensor<128xf32> -> tensor<128xbf16>
    %d_q = host.convert %d_q_f32 when %ok : tensor<?x32x?x128xf32> -> tensor<?x32x?x128xbf16>
    %d_q = host.convert %d_q_f32 {order = array<i64: 0, 2, 1, 3>} : tensor<?x32x?x128xf32> -> tensor<?x32x?x128xbf16>
    ```
    """

    name = "host.convert"
    input = operand_def(TensorType)
    cond = opt_operand_def(i1)
    unless = opt_prop_def(UnitAttr)
    order = opt_prop_def(DenseArrayBase)
    result = result_def(TensorType)
    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input (`when` $cond^)? (`unless` $unless^)? attr-dict `:` type($input) `->` type($result)"

    def verify_(self) -> None:
        _verify_guard(self)
        if self.order is not None:
            rank = self.result.type.get_num_dims()
            order = tuple(self.order.get_values())
            if sorted(order) != list(range(rank)):
                raise VerifyException(f"host.convert: order {list(order)} is not a permutation of the {rank} dims")

    def dim_order(self) -> tuple[int, ...] | None:
        """The result's memory order, None for the input's."""
        return None if self.order is None else tuple(int(d) for d in self.order.get_values())


Host = Dialect("host", [DimOp, SmCountOp, FitsI32Op, KeepsResultsOp, AllocOp, LaunchOp, TmaReadyOp, ReduceSumOp, ConvertOp], [])
