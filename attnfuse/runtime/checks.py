"""Argument checks at the boundary between a call and its kernels.

`ArgumentChecker.check` validates a call against the program's signature (count,
kinds, layouts, dtypes, devices, dynamic dims) the first time a shape class is seen;
`ArgumentChecker.scalars` converts and range-checks the integer scalars (seeds) of every
call; `ArgumentChecker.segment_values` checks the cu_seqlens of a packed batch on every
call; `check_int32_layout` guards the 32-bit indexing of kernels. Every failure is an
`AttnfuseArgumentError` naming the argument and what was expected.

A paged KV cache's block table and kv_lens are checked for shapes and dtypes on the
first call of a shape class, like every argument (no synchronisation); their values
(`page_values`: lengths within the block table, pages within the pool) only when
`check_pages` is set, since that reads them back to the host. Without it, the kernels
clamp lengths and page numbers so that bad values give wrong numbers, never reads
outside the tensors. The kv_lens of a contiguous cache with lengths are checked the
same way (`page_values`: every length within the cache's capacity, dim 2 of k).

A packed batch's cu_seqlens must be `N + 1` int32 entries rising from 0 to the token
count of their side, with as many sequences for q as for k. The entry counts are shape
checks (always); the values are checked on every call on a host copy (`segment_values`:
on a GPU, one small device-to-host copy per call, a synchronisation) unless
`check_segments` is off, and never while a CUDA graph is being captured (a copy to the
host cannot be captured). The kernels clamp every sequence to the tokens of its side,
so unchecked bad entries give wrong numbers, never accesses outside the tensors.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    IntegerType,
    TensorType,
)
from xdsl.ir import Attribute

INT32_MAX = 2**31 - 1


class AttnfuseArgumentError(ValueError):
    """A call whose arguments do not match the program's signature."""


def torch_dtype(element_type: Attribute) -> torch.dtype:
    if isinstance(element_type, BFloat16Type):
        return torch.bfloat16
    if isinstance(element_type, Float16Type):
        return torch.float16
    if isinstance(element_type, Float32Type):
        return torch.float32
    if isinstance(element_type, Float64Type):
        return torch.float64
    if isinstance(element_type, IntegerType):
        return {1: torch.bool, 8: torch.int8, 32: torch.int32, 64: torch.int64}[element_type.width.data]
    raise TypeError(f"no torch dtype for {element_type}")


@dataclass(frozen=True)
class Parameter:
    """One argument of an attention program, as declared in its signature."""

    index: int
    name: str
    type: Any

    def describe(self) -> str:
        if isinstance(self.type, TensorType):
            dims = ", ".join("?" if d < 0 else str(d) for d in self.type.get_shape())
            return f"[{dims}] {torch_dtype(self.type.element_type)}"
        return str(self.type)


def element_span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """How far past its first element a view's last element lies, in elements."""
    return sum((size - 1) * abs(stride) for size, stride in zip(shape, strides) if size > 1)


def check_int32_layout(tensor: torch.Tensor, where: str) -> None:
    """Kernels take i32 strides and index within a [batch, head] slice in 32 bits."""
    shape, strides = tensor.shape, tensor.stride()
    for dim, (size, stride) in enumerate(zip(shape, strides)):
        if size > 1 and abs(stride) > INT32_MAX:
            raise AttnfuseArgumentError(
                f"{where}: stride {stride} of dim {dim} exceeds the kernels' 32-bit strides "
                f"(at most {INT32_MAX}); pass a contiguous copy (.contiguous())"
            )
    leading = {4: 2, 3: 1, 2: 1}.get(len(shape), 0)
    span = element_span(shape[leading:], strides[leading:])
    if span > INT32_MAX:
        raise AttnfuseArgumentError(
            f"{where}: shape {tuple(shape)} with strides {strides} spans {span} elements within "
            f"one batch/head slice, more than the kernels' 32-bit offsets address ({INT32_MAX})"
        )


def _integer(param: Parameter, value: Any) -> int:
    where = f"argument {param.index} '{param.name}'"
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise AttnfuseArgumentError(
                f"{where}: expected a scalar {param.type}, got a tensor of shape {tuple(value.shape)}"
            )
        if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            raise AttnfuseArgumentError(f"{where}: expected an integer, got a {value.dtype} tensor")
        if value.device.type == "meta":
            raise AttnfuseArgumentError(f"{where}: a meta tensor has no value")
        value = value.item()
    if isinstance(value, bool):
        raise AttnfuseArgumentError(f"{where}: expected an integer, got bool")
    try:
        number = operator.index(value)  # int, numpy integers, anything integer-like
    except TypeError:
        raise AttnfuseArgumentError(f"{where}: expected an integer, got {type(value).__name__}") from None
    width = param.type.width.data
    low, high = -(2 ** (width - 1)), 2 ** (width - 1) - 1
    if not low <= number <= high:
        raise AttnfuseArgumentError(f"{where}: {number} does not fit in {param.type} ([{low}, {high}])")
    return number


def _check_lengths(param: Parameter, lens: torch.Tensor, capacity: int, why: str) -> None:
    """Raise naming `param` unless every `kv_lens[b]` (a host copy) is in `[0, capacity]`
    (`why`: where the capacity comes from)."""
    bad = ((lens < 0) | (lens > capacity)).nonzero()
    if bad.numel():
        b = int(bad[0])
        raise AttnfuseArgumentError(
            f"argument {param.index} '{param.name}': kv_lens[{b}] = {int(lens[b])} is not in [0, {capacity}] ({why})")


class ArgumentChecker:
    """The checks of one program's calls (see the module docstring)."""

    def __init__(self, name: str, parameters: Sequence[Parameter], symbolic: dict[int, tuple[str | int, ...]],
                 shared_length: int | None, qkv: tuple[int, int, int],
                 segments: Sequence[tuple[int, str]] = (), pages: tuple[int, int] | None = None,
                 lengths: int | None = None) -> None:
        self.name = name
        self.parameters = list(parameters)
        self.symbolic = symbolic
        self.shared_length = shared_length
        self.qkv = qkv
        self.segments = [(self.parameters[index], side) for index, side in segments]
        """The cu_seqlens of a packed batch and the length they cut (`Sq` or `Skv`)."""
        self.pages = pages
        """(block table, kv_lens) argument indices of a paged KV cache."""
        self.lengths = lengths
        """The kv_lens argument index of a contiguous cache with lengths."""
        self.check_pages = False
        """Check the block table's and kv_lens' values on every call (`page_values`)."""
        self.check_segments = True
        """Check the cu_seqlens values on every call (`segment_values`)."""
        self.scalar_params = [p for p in self.parameters if not isinstance(p.type, TensorType)]

    def scalars(self, args: Sequence[Any]) -> Sequence[Any]:
        """`args` with integer scalars as checked Python ints (every call)."""
        if len(args) != len(self.parameters):
            names = ", ".join(p.name for p in self.parameters)
            raise AttnfuseArgumentError(
                f"@{self.name} takes {len(self.parameters)} arguments ({names}), got {len(args)}"
            )
        if not self.scalar_params:
            return args
        converted = list(args)
        for param in self.scalar_params:
            if isinstance(param.type, IntegerType):
                converted[param.index] = _integer(param, args[param.index])
        return converted

    def check(self, args: Sequence[Any], fake: bool = False) -> torch.device:
        """Check tensors against the signature; the device the call runs on. `fake`:
        the check of shape propagation (meta or fake tensors, possibly symbolic sizes),
        which leaves out what only data can have (a meta device, 32-bit layouts)."""
        device: torch.device | None = None
        for param, arg in zip(self.parameters, args):
            if not isinstance(param.type, TensorType):
                continue
            where = f"argument {param.index} '{param.name}'"
            if not isinstance(arg, torch.Tensor):
                raise AttnfuseArgumentError(f"{where}: expected a tensor {param.describe()}, got {type(arg).__name__}")
            if arg.layout != torch.strided:
                raise AttnfuseArgumentError(f"{where}: expected a dense (strided) tensor, got layout {arg.layout}; "
                                            "convert it with .to_dense()")
            shape = param.type.get_shape()
            if arg.dim() != len(shape) or any(d >= 0 and d != s for d, s in zip(shape, arg.shape)):
                raise AttnfuseArgumentError(
                    f"{where}: expected shape {param.describe()}, got {tuple(arg.shape)} {arg.dtype}"
                )
            expected = torch_dtype(param.type.element_type)
            if arg.dtype != expected:
                raise AttnfuseArgumentError(f"{where}: expected dtype {expected}, got {arg.dtype}")
            if device is None:
                device = arg.device
            elif arg.device != device:
                raise AttnfuseArgumentError(f"{where}: on {arg.device}, but earlier arguments are on {device}")
            if fake:
                continue
            if arg.device.type == "meta":
                raise AttnfuseArgumentError(f"{where}: a meta tensor has no data to run kernels on")
            check_int32_layout(arg, where)
        if device is None:
            raise AttnfuseArgumentError("no tensor arguments")
        self._check_consistent(args)
        self._check_segment_shapes(args)
        return device

    def segment_values(self, args: Sequence[Any]) -> None:
        """Every cu_seqlens rises from 0 to its side's token count (see the module docstring)."""
        if not self.segments or not self.check_segments:
            return
        if args[self.segments[0][0].index].is_cuda and torch.cuda.is_current_stream_capturing():
            return
        sizes = self.sizes(args)
        read: dict[int, torch.Tensor] = {}  # one copy to the host per tensor (q's and k's may be one)
        for param, side in self.segments:
            cu = args[param.index]
            values = read.setdefault(id(cu), cu.cpu())
            if _bad_segments(values, sizes[side]):
                raise AttnfuseArgumentError(_segments_problem(param, values.tolist(), side, sizes[side]))

    def page_values(self, args: Sequence[Any]) -> None:
        """With `check_pages`: every `kv_lens[b]` in `[0, max_pages * page_size]`, and the
        pages holding its keys within the pool (one host copy of each tensor); on a
        contiguous cache with lengths, every `kv_lens[b]` in `[0, capacity]` (k's dim 2)."""
        if not self.check_pages:
            return
        k = args[self.qkv[1]]
        if self.lengths is not None:
            _check_lengths(self.parameters[self.lengths], args[self.lengths].cpu().long(), k.shape[2],
                           f"the cache's capacity, dim 2 of argument {self.qkv[1]}")
        if self.pages is None:
            return
        table_param, lens_param = (self.parameters[i] for i in self.pages)
        table, lens = args[table_param.index].cpu().long(), args[lens_param.index].cpu().long()
        _check_lengths(lens_param, lens, table.shape[1] * k.shape[2],
                       f"max_pages {table.shape[1]} x page_size {k.shape[2]}")
        used = torch.arange(table.shape[1]).view(1, -1) * k.shape[2] < lens.view(-1, 1)
        bad = (used & ((table < 0) | (table >= k.shape[0]))).nonzero()
        if bad.numel():
            b, p = (int(i) for i in bad[0])
            raise AttnfuseArgumentError(
                f"argument {table_param.index} '{table_param.name}': block_table[{b}, {p}] = {int(table[b, p])} "
                f"is not a page of the pool (0 <= page < {k.shape[0]}, dim 0 of argument {self.qkv[1]})")

    def sizes(self, args: Sequence[Any]) -> dict[str, Any]:
        """The batch `B` and lengths `Sq`, `Skv` of a call, read off q and k (with a
        paged KV cache, the page count `pages` and the block table's `max_pages`)."""
        q_index, k_index, _ = self.qkv
        q, k = args[q_index], args[k_index]
        found = {"B": q.shape[0], "Sq": q.shape[2], "Skv": k.shape[2]}
        if self.pages is not None:
            found["pages"], found["max_pages"] = k.shape[0], args[self.pages[0]].shape[1]
        return found

    def expected_shape(self, index: int, args: Sequence[Any]) -> tuple[Any, ...]:
        """The shape argument `index` has with the sizes of this call, before any
        broadcast (the shape of its gradient)."""
        symbols = self.symbolic.get(index)
        if symbols is None:
            return tuple(args[index].shape)
        sizes = self.sizes(args)
        return tuple(sizes[s] if isinstance(s, str) else s for s in symbols)

    def _check_segment_shapes(self, args: Sequence[Any]) -> None:
        """At least one entry each, and as many sequences for q as for k."""
        first: tuple[Parameter, int] | None = None
        for param, _ in self.segments:
            entries = args[param.index].shape[0]
            if entries == 0:
                raise AttnfuseArgumentError(f"argument {param.index} '{param.name}': cu_seqlens needs N + 1 "
                                            "entries for N sequences, got none")
            if first is None:
                first = (param, entries)
            elif entries != first[1]:
                other, count = first
                raise AttnfuseArgumentError(
                    f"argument {param.index} '{param.name}': {entries} entries ({_sequences(entries)}), but "
                    f"argument {other.index} '{other.name}' has {count} ({_sequences(count)}): queries and "
                    "keys pack the same sequences")

    def _check_consistent(self, args: Sequence[Any]) -> None:
        """Dynamic dims must agree: batch `B` and lengths `Sq` / `Skv` are read off q and
        k, then every tensor argument is checked against its expected shape."""
        sizes = self.sizes(args)
        if self.shared_length is not None and sizes["Sq"] != sizes["Skv"]:
            param = self.parameters[self.shared_length]
            raise AttnfuseArgumentError(
                f"argument {param.index} '{param.name}' serves both queries and keys, so q and k "
                f"must have the same length, got {sizes['Sq']} and {sizes['Skv']}"
            )
        for index, symbols in sorted(self.symbolic.items()):
            arg = args[index]
            want = [sizes[s] if isinstance(s, str) else s for s in symbols]
            got = list(arg.shape)
            if (index not in self.qkv and index not in (self.pages or ()) and len(got) == len(want) and symbols
                    and symbols[0] == "B" and got[0] == 1):
                want[0] = 1  # an extra operand may broadcast over the batch (read with stride 0)
            if got != want:
                shown = ", ".join(f"{s}={sizes[s]}" if isinstance(s, str) else str(s) for s in symbols)
                param = self.parameters[index]
                raise AttnfuseArgumentError(
                    f"argument {index} '{param.name}': expected shape [{shown}], got {tuple(arg.shape)}"
                )
        if self.pages is not None and sizes["pages"] == 0:
            param = self.parameters[self.qkv[1]]
            raise AttnfuseArgumentError(f"argument {param.index} '{param.name}': a page pool needs at least one page")


_TOKENS = {"Sq": "query tokens (dim 2 of q)", "Skv": "key tokens (dim 2 of k)"}


def _sequences(entries: int) -> str:
    return "1 sequence" if entries == 2 else f"{entries - 1} sequences"


def _bad_segments(cu: torch.Tensor, total: int) -> bool:
    return bool(cu[0] != 0) or bool(cu[-1] != total) or bool((cu[1:] < cu[:-1]).any())


def _segments_problem(param: Parameter, values: list[int], side: str, total: int) -> str:
    where = f"argument {param.index} '{param.name}'"
    if values[0] != 0:
        return f"{where}: cu_seqlens must start at 0, got {values[0]}"
    drop = next((i for i in range(1, len(values)) if values[i] < values[i - 1]), None)
    if drop is not None:
        return (f"{where}: cu_seqlens must not decrease, got {values[drop - 1]} then {values[drop]} "
                f"(entries {drop - 1} and {drop})")
    return f"{where}: cu_seqlens must end at the {total} {_TOKENS[side]}, got {values[-1]}"
