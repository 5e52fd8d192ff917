"""`attnfuse.rng` against Philox known answers and Triton's own `tl.rand` (interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from attnfuse import rng

SEEDS = [0, 1, 12345, 2**31 - 1, 2**31, 2**32 + 7, 2**40 + 123, -5, 2**63 - 1]

# Random123 kat_vectors, philox4x32 with 10 rounds: (counter, key, expected output).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_philox_known_answers(counter, key, expected):
    c = [torch.tensor([w], dtype=torch.int64) for w in counter]
    out = rng.philox(key[0], key[1], *c)
    assert tuple(int(w) for w in out) == expected


def test_split_seed_and_uniform_range():
    assert rng.split_seed(2**32 + 7) == (7, 1)
    assert rng.split_seed(-1) == (0xFFFFFFFF, 0xFFFFFFFF)
    u = rng.rand(42, torch.arange(1 << 16))
    assert u.dtype == torch.float32 and 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.double().mean()) - 0.5) < 0.01
    words = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1], dtype=torch.int64)
    assert rng.uniform_from_uint32(words).tolist() == pytest.approx(
        [0.0, 4.6566e-10, 1.0, 1.0, 0.0], abs=1e-7
    )


def test_dropout_keep_shape_rate_and_per_head_streams():
    keep = rng.dropout_keep(7, 2, 3, 33, 65, 0.25)
    assert keep.shape == (2, 3, 33, 65) and keep.dtype == torch.bool
    assert abs(float(keep.double().mean()) - 0.75) < 0.02
    assert not torch.equal(keep[0, 0], keep[0, 1])
    assert torch.equal(keep[1, 2].flatten(), rng.rand(7 + (5 << 32), torch.arange(33 * 65)) >= 0.25)


TRITON_SCRIPT = textwrap.dedent(
    """
    import os, sys
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import torch, triton, triton.language as tl

    @triton.jit
    def rand_kernel(out, offsets, seed, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(out + i, tl.rand(seed, tl.load(offsets + i)))

    @triton.jit
    def keep_kernel(out, seed, p, H: tl.constexpr, SQ: tl.constexpr, SKV: tl.constexpr):
        bh = tl.program_id(0)
        key = seed + (bh.to(tl.int64) << 32)
        q = tl.arange(0, SQ)[:, None]
        kv = tl.arange(0, SKV)[None, :]
        u = tl.rand(key, q * SKV + kv)
        tl.store(out + bh * SQ * SKV + q * SKV + kv, (u >= p).to(tl.int8))

    seeds = [int(s) for s in sys.argv[2].split(",")]
    results = {}
    for seed in seeds:
        for name, offsets in (("int32", torch.arange(256, dtype=torch.int32) * 7919),
                              ("int64", torch.arange(256, dtype=torch.int64) * 3 + (5 << 32))):
            out = torch.empty(256, dtype=torch.float32)
            rand_kernel[(1,)](out, offsets, seed, N=256)
            results[(seed, name)] = (offsets, out)
        keep = torch.empty(2 * 3, 16, 32, dtype=torch.int8)
        keep_kernel[(6,)](keep, seed, 0.3, H=3, SQ=16, SKV=32)
        results[(seed, "keep")] = keep.view(2, 3, 16, 32).bool()
    torch.save(results, sys.argv[1])
    """
)


@pytest.fixture(scope="module")
def triton_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("triton") / "rand.pt"
    script = tmp_path_factory.getbasetemp() / "triton_rand.py"
    script.write_text(TRITON_SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, str(script), str(out), ",".join(str(s) for s in SEEDS)],
        check=False, env=env, capture_output=True, text=True, timeout=240, cwd=Path(__file__).parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("offsets", ["int32", "int64"])
def test_rand_is_bit_exact_with_triton(triton_results, seed, offsets):
    offs, expected = triton_results[(seed, offsets)]
    got = rng.rand(seed, offs.to(torch.int64))
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("seed", SEEDS)
def test_dropout_keep_matches_a_triton_kernel(triton_results, seed):
    assert torch.equal(rng.dropout_keep(seed, 2, 3, 16, 32, 0.3), triton_results[(seed, "keep")])
