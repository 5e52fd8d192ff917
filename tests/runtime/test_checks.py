"""Host checks at the kernel boundary: 32-bit indexing, seeds, program types, odd tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import attnfuse
from attnfuse import examples
from attnfuse.api import AttnfuseArgumentError

TINY = """
func.func @tiny(%q: tensor<?x2x?x32xf32>, %k: tensor<?x2x?x32xf32>, %v: tensor<?x2x?x32xf32>) -> tensor<?x2x?x32xf32> {
  %s = attn.scores %q, %k : tensor<?x2x?x32xf32>, tensor<?x2x?x32xf32> -> !attn.scores<?x2x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x2x?x?xf32> -> !attn.probs<?x2x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x2x?x?xf32>, tensor<?x2x?x32xf32> -> tensor<?x2x?x32xf32>
  func.return %o : tensor<?x2x?x32xf32>
}
"""


@pytest.fixture(scope="module")
def tiny() -> attnfuse.AttentionFunction:
    return attnfuse.compile(TINY)


@pytest.fixture(scope="module")
def dropout() -> attnfuse.AttentionFunction:
    pipeline = "attn-canonicalize,rope-fusion,online-softmax,mask-tiling,lower-to-tile"
    return attnfuse.compile(examples.path("dropout"), pipeline=pipeline)


def huge_view(tmp_path: Path, shape: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
    """A float32 view whose strides need more than 32 bits, over a sparse file (mapped,
    never touched, so it costs no memory)."""
    elements = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    path = tmp_path / "huge.bin"
    with open(path, "wb") as f:
        f.truncate(elements * 4)
    storage = torch.UntypedStorage.from_file(str(path), shared=True, nbytes=elements * 4)
    return torch.empty(0).set_(storage, 0, shape, stride)


def test_stride_beyond_int32_is_an_argument_error(tiny: attnfuse.AttentionFunction, tmp_path: Path) -> None:
    q = huge_view(tmp_path, (2, 2, 8, 32), (2**31, 256, 32, 1))
    k = torch.randn(2, 2, 8, 32)
    with pytest.raises(AttnfuseArgumentError, match=r"argument 0 'q': stride 2147483648 of dim 0 exceeds"):
        tiny(q, k, k)


def test_offset_beyond_int32_is_an_argument_error(tiny: attnfuse.AttentionFunction, tmp_path: Path) -> None:
    k = huge_view(tmp_path, (1, 2, 40, 32), (2**28, 32, 2**26, 1))
    q = torch.randn(1, 2, 40, 32)
    with pytest.raises(AttnfuseArgumentError, match=r"argument 1 'k': shape \(1, 2, 40, 32\) .* spans"):
        tiny(q, k, k)


@pytest.mark.parametrize(
    ("seed", "message"),
    [
        (True, "expected an integer, got bool"),
        (torch.tensor(True), "expected an integer, got a torch.bool tensor"),
        (torch.tensor(1.5), "expected an integer, got a torch.float32 tensor"),
        (2.0, "expected an integer, got float"),
        (2**63, r"9223372036854775808 does not fit in i64"),
        (-(2**63) - 1, r"-9223372036854775809 does not fit in i64"),
        ("7", "expected an integer, got str"),
    ],
)
def test_bad_seeds(dropout: attnfuse.AttentionFunction, seed: object, message: str) -> None:
    q = torch.randn(1, 12, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(AttnfuseArgumentError, match=f"argument 3 'seed': {message}"):
        dropout(q, q, q, seed)


def test_numpy_and_tensor_seeds(dropout: attnfuse.AttentionFunction) -> None:
    q = torch.randn(1, 12, 8, 64, dtype=torch.bfloat16)
    expected = dropout(q, q, q, 1234)
    for seed in (np.int64(1234), np.int32(1234), torch.tensor(1234), torch.tensor([1234], dtype=torch.int32)):
        assert torch.equal(dropout(q, q, q, seed), expected), type(seed)
    assert not torch.equal(dropout(q, q, q, 2**40 + 1234), expected)  # a 64-bit seed works too


@pytest.mark.parametrize("program", [None, 123, b"func.func", ["x"]])
def test_compile_rejects_non_programs(program: object) -> None:
    with pytest.raises(TypeError, match=r"attnfuse.compile: program must be .* got"):
        attnfuse.compile(program)  # type: ignore[arg-type]


def test_meta_tensors(tiny: attnfuse.AttentionFunction) -> None:
    """Meta tensors go through the op's fake implementation: shapes, no kernels; the
    signature checks still run. Only the host program itself refuses them."""
    q = torch.randn(1, 2, 8, 32, device="meta")
    out, lse = tiny(q, q, q, return_lse=True)
    assert (out.device.type, out.shape, out.dtype) == ("meta", (1, 2, 8, 32), torch.float32)
    assert (lse.shape, lse.dtype) == ((1, 2, 8), torch.float32)
    with pytest.raises(AttnfuseArgumentError, match="argument 1 'k': expected dtype torch.float32"):
        tiny(q, q.half(), q)
    with pytest.raises(AttnfuseArgumentError, match="argument 0 'q': a meta tensor has no data"):
        tiny._forward([q, q, q])


def test_sparse_tensors(tiny: attnfuse.AttentionFunction) -> None:
    q = torch.randn(1, 2, 8, 32)
    with pytest.raises(AttnfuseArgumentError, match=r"argument 1 'k': expected a dense \(strided\) tensor, got layout torch.sparse_coo"):
        tiny(q, q.to_sparse(), q)
