"""Context parallelism (`attnfuse.distributed`, `attnfuse.ring_split`) on the CPU.

Two and three gloo processes under torchrun (tests/distributed/ring_worker.py) run each
case's ring attention on zigzag shards; forward and gradients must equal the single-process
run of the same program on the whole sequence and the float64 reference within a bound
set by PyTorch's own error in that dtype (SDPA with the same shapes and mask, against
float64). The program split, the sharding helpers and the argument checks run in process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import attnfuse
from attnfuse.distributed import RingAttention, global_positions, shard
from attnfuse.ring_split import RingSplitError, split_for_ring

REPO = Path(__file__).resolve().parents[2]
CASES = ["causal_gqa", "noncausal_gqa", "causal_mha_softcap", "rope_causal", "causal_lse", "rope_causal_f16",
         "rope_positions_qknorm", "document_rope_positions", "document_separate_noncausal", "sinks_causal_lse"]
THREE_RANKS = ["causal_gqa", "rope_positions_qknorm", "document_rope_positions"]
BOUND = 8.0
"""Allowed error, in units of PyTorch's own largest error (output or gradients) in the case's dtype."""


def _torchrun(nproc: int, *argv: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                    *argv], check=True, env=env, timeout=600, capture_output=True)


def _worker(tmp: Path, nproc: int, cases: list[str]) -> dict[str, Any]:
    _torchrun(nproc, str(REPO / "tests" / "distributed" / "ring_worker.py"), str(tmp), *cases)
    return json.loads((tmp / f"ring_{nproc}.json").read_text())


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _worker(tmp_path_factory.mktemp("ring2"), 2, CASES)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _worker(tmp_path_factory.mktemp("ring3"), 3, THREE_RANKS)


def _check(case: dict[str, Any]) -> None:
    scale = max(case["torch"].values())
    assert {"out", "q", "k", "v"} <= set(case["cp_vs_reference"])
    for against in ("cp_vs_reference", "cp_vs_single"):
        for name, error in case[against].items():
            assert error <= BOUND * scale, f"{against} {name}: {error:.3g} > {BOUND} x PyTorch's {scale:.3g}"


@pytest.mark.parametrize("case", CASES)
def test_two_ranks_match_one_process_and_reference(two_ranks: dict[str, Any], case: str) -> None:
    assert two_ranks["world"] == 2
    _check(two_ranks["cases"][case])


def test_two_ranks_cover_lse_and_replicated_weights(two_ranks: dict[str, Any]) -> None:
    assert "lse" in two_ranks["cases"]["causal_lse"]["cp_vs_reference"]
    assert {"wq", "wk"} <= set(two_ranks["cases"]["rope_positions_qknorm"]["cp_vs_reference"])
    assert {"lse", "sinks"} <= set(two_ranks["cases"]["sinks_causal_lse"]["cp_vs_reference"])


@pytest.mark.parametrize("case", THREE_RANKS)
def test_three_ranks_match_one_process_and_reference(three_ranks: dict[str, Any], case: str) -> None:
    assert three_ranks["world"] == 3
    _check(three_ranks["cases"][case])


def test_unsupported_program_under_torchrun(two_ranks: dict[str, Any]) -> None:
    assert "cannot be split over a sequence ring: 'attn.mask sliding_window'" in two_ranks["error"]


BASE = attnfuse.attention(4, 16, kv_heads=2, dtype="f32")


@pytest.mark.parametrize("builder, message", [
    (BASE.sliding_window(left=3), "'attn.mask sliding_window' depends on global positions"),
    (BASE.prefix_lm(4), "'attn.mask prefix_lm'"),
    (BASE.mask_mod(lambda b, h, q, kv: kv <= q), "'attn.mask custom'"),
    (BASE.alibi(), "'attn.bias' adds a bias indexed by global positions"),
    (BASE.bias(), "'attn.bias'"),
    (BASE.score_mod(lambda s, b, h, q, kv: s * 0.5), "'attn.score_mod' may read q_idx / kv_idx"),
    (BASE.dropout(0.1), "'attn.dropout' draws its random numbers by global position"),
])
def test_split_refuses_position_dependent_ops(builder: Any, message: str) -> None:
    with pytest.raises(RingSplitError, match="cannot be split over a sequence ring") as error:
        split_for_ring(builder)
    assert message in str(error.value)


def test_split_refuses_a_paged_cache() -> None:
    text = """func.func @f(%q: tensor<?x4x?x16xf32>, %kc: tensor<?x2x8x16xf32>, %vc: tensor<?x2x8x16xf32>,
                 %bt: tensor<?x?xi32>, %n: tensor<?xi32>) -> tensor<?x4x?x16xf32> {
  %s = attn.scores %q, %kc block_table %bt kv_lens %n : tensor<?x4x?x16xf32>, tensor<?x2x8x16xf32>, tensor<?x?xi32>, tensor<?xi32> -> !attn.scores<?x4x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x4x?x?xf32> -> !attn.probs<?x4x?x?xf32>
  %o = attn.weighted_sum %p, %vc : !attn.probs<?x4x?x?xf32>, tensor<?x2x8x16xf32> -> tensor<?x4x?x16xf32>
  func.return %o : tensor<?x4x?x16xf32>
}"""
    with pytest.raises(RingSplitError, match="'attn.scores' reads a paged KV cache"):
        split_for_ring(text)
    contiguous = text.replace("tensor<?x2x8x16xf32>", "tensor<?x2x?x16xf32>").replace(" block_table %bt", "").replace(
        "%bt: tensor<?x?xi32>, ", "").replace("tensor<?x?xi32>, tensor<?xi32> ->", "tensor<?xi32> ->")
    with pytest.raises(RingSplitError, match="'attn.scores' reads a KV cache with kv_lens, which decoding reads"):
        split_for_ring(contiguous)


def test_split_variants_of_llama3() -> None:
    split = split_for_ring(REPO / "examples" / "llama3.attn")
    assert split.causal and split.passed == () and split.operands == ()
    assert split.diagonal is not None and "attn.mask causal" in split.diagonal
    assert "attn.mask" not in split.unmasked
    for text in (split.diagonal, split.unmasked):
        assert "attn.rope %q positions %q_pos" in text and "attn.rope %k positions %kv_pos" in text


def test_split_document_of_the_example() -> None:
    split = split_for_ring(REPO / "examples" / "document.attn")
    assert split.operands == ("pos", "doc") and split.passed == () and (split.q_doc, split.kv_doc) == (4, 4)
    assert split.diagonal is not None and "attn.mask causal" in split.diagonal
    for text in (split.diagonal, split.unmasked):
        assert "attn.mask document %" in text and ", %q_doc, %kv_doc :" in text
        assert "%q_pos: tensor<?x?xi32>, %q_doc: tensor<?x?xi32>, %kv_pos: tensor<?x?xi32>, %kv_doc" in text


def test_split_positions_sources() -> None:
    offset = split_for_ring(BASE.rope(offset=5).causal())
    assert offset.q_positions == offset.kv_positions and offset.q_positions.offset == 5
    assert "offset" not in offset.unmasked
    operand = split_for_ring(BASE.qk_norm().rope(positions=True))
    assert not operand.causal and operand.operands == ("wq", "wk", "pos") and operand.passed == (3, 4)
    assert operand.q_positions is not None and operand.q_positions.operand == 5 and operand.q_positions.rank == 2
    sinks = split_for_ring(BASE.causal().sinks())
    assert sinks.sinks == 3 and sinks.passed == () and "sinks" not in sinks.unmasked
    q_only = split_for_ring(BASE.rope(on="q"))
    assert q_only.kv_positions is None and "%kv_pos" not in q_only.unmasked


def test_zigzag_shards() -> None:
    full = torch.arange(24).view(1, 24)
    shards = [shard(full, 1, rank, 3) for rank in range(3)]
    assert shards[0].tolist() == [[0, 1, 2, 3, 20, 21, 22, 23]]
    for rank, part in enumerate(shards):
        assert torch.equal(part[0], global_positions(8, rank, 3))
    assert sorted(torch.cat(shards, dim=1)[0].tolist()) == list(range(24))
    with pytest.raises(ValueError, match=r"must be a multiple of 2 \* world = 6"):
        shard(torch.zeros(1, 20), 1, 0, 3)


def test_import_initialises_nothing() -> None:
    code = ("import os; before = dict(os.environ); import attnfuse.distributed, torch.distributed as d; "
            "assert not d.is_initialized(); assert dict(os.environ) == before")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_needs_a_process_group() -> None:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised")
    with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
        RingAttention(BASE.causal())


@pytest.fixture
def one_rank(tmp_path: Path) -> Any:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_one_rank_is_the_program(one_rank: None) -> None:
    program = BASE.rope(theta=100.0).causal().build()
    ring = RingAttention(program)
    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    torch.testing.assert_close(ring(q, k, v), attnfuse.compile(program)(q, k, v), rtol=1e-5, atol=1e-6)


def test_argument_errors(one_rank: None) -> None:
    ring = RingAttention(BASE.rope(positions=True).causal())
    q, kv, pos = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.zeros(1, 8, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"takes q, k, v and 1 operand\(s\) \(pos\), got 0"):
        ring(q, kv, kv)
    with pytest.raises(ValueError, match=r"k must be this rank's shard \[B, H, S / world, D\], got \(2, 8, 16\)"):
        ring(q, kv[0], kv, pos)
    with pytest.raises(ValueError, match="q, k and v must be shards of one sequence"):
        ring(q, kv[:, :, :4], kv, pos)
    with pytest.raises(ValueError, match=r"local length S / world \(7\) must be even"):
        ring(q[:, :, :7], kv[:, :, :7], kv[:, :, :7], pos[:, :7])
    with pytest.raises(ValueError, match=r"operand 'pos' \(positions or document ids\) must be this rank's shard"):
        ring(q, kv, kv, pos[:, :4])


def test_bench_smoke(tmp_path: Path) -> None:
    _torchrun(2, str(REPO / "bench" / "context_parallel.py"), "--out", str(tmp_path), "--smoke")
    result = json.loads((tmp_path / "context_parallel.json").read_text())
    assert result["world"] == 2 and [row["seq"] for row in result["rows"]] == [32]
    row = result["rows"][0]
    assert {"ring_fwd_ms", "ring_fwd_bwd_ms", "single_fwd_ms", "single_fwd_bwd_ms", "speedup_fwd_bwd"} <= set(row)
    assert all(e["rel_l2"] < 1e-5 for e in row["correctness"]["cp_vs_single"].values())
    assert "| 32 |" in (tmp_path / "context_parallel.md").read_text()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_bench_two_gpus(tmp_path: Path) -> None:
    _torchrun(2, str(REPO / "bench" / "context_parallel.py"), "--out", str(tmp_path), "--seqs", "4096",
              "--warmup", "1", "--iters", "2")
    row = json.loads((tmp_path / "context_parallel.json").read_text())["rows"][0]
    correctness = row["correctness"]
    assert all(e["rel_l2"] < 2e-2 for e in correctness["cp_vs_single"].values())
    for name, error in correctness["cp_vs_f32"].items():
        assert error["rel_l2"] <= 2 * correctness["single_vs_f32"][name]["rel_l2"] + 1e-3
