"""Probe (sessions 43+, not run yet): the persistent split kernel's thresholds against the
wide kernel, decode at Sq = 1 on Llama-3-8B heads (32 / 8, D = 128, bf16), CUDA graphs.

Each variant sets `split_host`'s constants and compiles `bench/decode.py`'s contiguous,
paged (pages of 16) and lengths programs afresh in a process of its own with an empty
`ATTNFUSE_CACHE_DIR` (the constants live in the compiled host code, which the disk cache
keys by source only). Per shape it records SDPA's time, each program's time, its max
difference to SDPA and which kernels its launch plan runs.

* `wide`: no persistent kernel (`PERSISTENT_MIN_PROGRAMS_PER_SM` out of reach);
* `pers`: the committed constants (2 programs per SM, more than 2 per SM, 16 blocks);
* `p1`, `p3`: 1 or 3 programs per SM;
* `max32`, `max64`: pairs of up to 32 / 64 blocks of 64 keys (2048 / 4096 keys);
* `min1`: calls of more than one program per SM.

    python bench/prototypes/persistent_rule.py --out DIR [--variants wide,pers] \
        [--batches 32,48,64,96,128] [--kv 1024,2048,4096]   # DIR/persistent_rule.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, int]] = {
    "wide": {"PERSISTENT_MIN_PROGRAMS_PER_SM": 10**9},
    "pers": {},
    "p1": {"PERSISTENT_PROGRAMS_PER_SM": 1},
    "p3": {"PERSISTENT_PROGRAMS_PER_SM": 3},
    "max32": {"PERSISTENT_MAX_BLOCKS": 32},
    "max64": {"PERSISTENT_MAX_BLOCKS": 64},
    "min1": {"PERSISTENT_MIN_PROGRAMS_PER_SM": 1},
}


def measure(variant: str, batches: list[int], kv_lens: list[int], out: Path) -> None:
    """The rows of one variant (run in a process of its own, see the module docstring),
    written to `out` after each shape (a run stopped at its time limit keeps them)."""
    import torch

    import attnfuse
    from attnfuse.lowering import split_host

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import decode

    for name, value in VARIANTS[variant].items():
        setattr(split_host, name, value)
    programs = {"contig": attnfuse.compile(decode.PROGRAM),
                "paged": attnfuse.compile(decode.PAGED_PROGRAM, params={"page": 16}),
                "lens": attnfuse.compile(decode.LENS_PROGRAM)}

    def graph_us(fn: Any) -> float:
        return 1e3 * decode._graph_ms(fn)  # noqa: SLF001

    rows = []
    for kv_len in kv_lens:
        for batch in batches:
            gen = torch.Generator(device="cuda").manual_seed(kv_len + batch)
            q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            k = torch.randn(batch, 8, kv_len, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            v = torch.randn_like(k)
            lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
            args = {"contig": [q, k, v], "paged": [q, *decode.page_cache(k, v, 16, gen)], "lens": [q, k, v, lens]}
            want = decode.sdpa_lower_right(q, k, v)
            row: dict[str, Any] = {"variant": variant, "batch": batch, "kv_len": kv_len,
                                   "sdpa_us": graph_us(lambda: decode.sdpa_lower_right(q, k, v))}
            for name, fn in programs.items():
                a = args[name]
                try:
                    row[f"{name}_max_diff_vs_sdpa"] = float((fn(*a).float() - want.float()).abs().max())
                    row[f"{name}_us"] = graph_us(lambda: fn(*a))
                    row[f"{name}_kernels"] = decode.launched(fn, a)
                except Exception as exc:  # reported, never hidden
                    row[f"{name}_error"] = decode._error_text(exc)  # noqa: SLF001
            rows.append(row)
            print(json.dumps(row), flush=True)
            out.write_text(json.dumps(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--variants", default="wide,pers,p1,max64")
    parser.add_argument("--batches", default="32,48,64,96,128")
    parser.add_argument("--kv", default="1024,2048,4096")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a variant's own process
    args = parser.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    kv_lens = [int(x) for x in args.kv.split(",")]
    if args.one is not None:
        measure(args.one, batches, kv_lens, args.out)
        return
    variants = args.variants.split(",")
    for variant in variants:
        if variant not in VARIANTS:
            parser.error(f"--variants: unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
    import torch

    if not torch.cuda.is_available():
        parser.error("needs CUDA (it times kernels on the GPU)")
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for variant in variants:
        with tempfile.TemporaryDirectory() as cache, tempfile.NamedTemporaryFile(suffix=".json") as part:
            env = dict(os.environ, ATTNFUSE_CACHE_DIR=cache)
            done = subprocess.run([sys.executable, __file__, "--one", variant, "--out", part.name,
                                   "--batches", args.batches, "--kv", args.kv], env=env, check=False)
            written = Path(part.name).read_text()
            rows.extend(json.loads(written) if written else [])
            if done.returncode != 0:
                rows.append({"variant": variant, "error": f"exit status {done.returncode}"})
        (args.out / "persistent_rule.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
