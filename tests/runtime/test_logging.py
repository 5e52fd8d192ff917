"""Debug records of the `attnfuse` logger: compile, cache, kernel loading, launch plans,
torch ops; nothing printed by default."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import attnfuse

PROGRAM = """
func.func @logged(%q: tensor<?x2x?x16xf32>, %k: tensor<?x2x?x16xf32>, %v: tensor<?x2x?x16xf32>) -> tensor<?x2x?x16xf32> {
  %s = attn.scores %q, %k : tensor<?x2x?x16xf32>, tensor<?x2x?x16xf32> -> !attn.scores<?x2x?x?xf32>
  %p = attn.softmax %s : !attn.scores<?x2x?x?xf32> -> !attn.probs<?x2x?x?xf32>
  %o = attn.weighted_sum %p, %v : !attn.probs<?x2x?x?xf32>, tensor<?x2x?x16xf32> -> tensor<?x2x?x16xf32>
  func.return %o : tensor<?x2x?x16xf32>
}
"""


def test_debug_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path))
    q = torch.randn(1, 2, 5, 16)
    with caplog.at_level(logging.DEBUG, logger="attnfuse"):
        fn = attnfuse.compile(PROGRAM.replace("@logged", "@logged_once"))
        fn(q, q, q)
        attnfuse.compile(PROGRAM.replace("@logged", "@logged_once"))
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("attnfuse")]
    expected = ["disk cache miss", "ran attn-canonicalize", "stored cache entry", "registered torch op attnfuse::logged_once_",
                "built a launch plan", "disk cache hit"]
    for text in expected:
        assert any(text in m for m in messages), (text, messages)


def test_silent_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("attnfuse").handlers)
    q = torch.randn(1, 2, 5, 16)
    attnfuse.compile(PROGRAM.replace("@logged", "@logged_once"))(q, q, q)
    assert capsys.readouterr() == ("", "")
