"""Compile time needs no tensor library: parsing, every shipped pass and the driver run
without importing torch or triton (they are run-time dependencies, `attnfuse/runtime`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_lowering_a_program_imports_neither_torch_nor_triton() -> None:
    script = f"""
import sys
from pathlib import Path
from attnfuse.diagnostics import parse_module_with_locations
from attnfuse.pass_manager import PassManager, make_context
from attnfuse.passes import DEFAULT_PIPELINE
import attnfuse.driver
for name in ("llama3", "llama3_1", "gemma2", "qwen3", "document"):
    path = Path({str(ROOT)!r}) / "examples" / f"{{name}}.attn"
    ctx = make_context()
    module, locations = parse_module_with_locations(ctx, path.read_text(), str(path))
    PassManager(DEFAULT_PIPELINE).run(module, ctx, locations=locations)
loaded = sorted(m for m in ("torch", "triton") if m in sys.modules)
print(",".join(loaded) or "none")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    assert result.stdout.strip() == "none", result.stdout + result.stderr
