"""`#attn.split_kv`: its text form round-trips, bad clauses and values are rejected."""

from __future__ import annotations

import pytest
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError, VerifyException

from attnfuse.dialects.attn_split_kv import AUTO, SplitKVAttr
from attnfuse.pass_manager import make_context


def parse(text: str) -> SplitKVAttr:
    attr = Parser(make_context(), text).parse_attribute()
    assert isinstance(attr, SplitKVAttr)
    return attr


@pytest.mark.parametrize("text", [
    "#attn.split_kv<64x64, group 4, splits auto, waves 1, min_blocks 1>",
    "#attn.split_kv<16x16, group 1, splits 3, waves 2, min_blocks 2, merge 1>",
    "#attn.split_kv<64x64, group 4, splits auto, waves 1, min_blocks 1, merge 1, persistent 1>",
    "#attn.split_kv<64x64, group 4, splits auto, waves 1, min_blocks 1, persistent 1>",
])
def test_round_trip(text: str) -> None:
    assert str(parse(text)) == text


def test_clauses_default_and_come_in_any_order() -> None:
    attr = parse("#attn.split_kv<32x16, persistent 1, group 2>")
    assert (attr.group.data, attr.splits.data, attr.waves.data, attr.min_blocks.data) == (2, AUTO, 1, 1)
    assert (attr.merge.data, attr.persistent.data) == (0, 1)
    assert attr == SplitKVAttr(32, 16, group=2, persistent=True)


@pytest.mark.parametrize(("text", "error"), [
    ("#attn.split_kv<64x64, group 4, persistent 2>", "persistent must be 0 or 1, got 2"),
    ("#attn.split_kv<64x64, group 4, merge 3>", "merge must be 0 or 1, got 3"),
    ("#attn.split_kv<48x64, group 4>", "rows must be a power of two >= 16, got 48"),
])
def test_bad_values(text: str, error: str) -> None:
    with pytest.raises(VerifyException, match=error):
        parse(text)


@pytest.mark.parametrize(("text", "error"), [
    ("#attn.split_kv<64x64, group 4, persistent 1, persistent 1>", "'persistent' given twice"),
    ("#attn.split_kv<64x64, splits 2>", "needs a 'group' clause"),
    ("#attn.split_kv<64x64, group 4, flatten 1>", "persistent"),  # the error lists the clauses
])
def test_bad_clauses(text: str, error: str) -> None:
    with pytest.raises(ParseError, match=error):
        parse(text)
