"""`#attn.split_kv`: the split-KV (decode) lowering chosen for an `attn.online_softmax`.

The `split-kv` pass records it when every building block of a program can run split
over the keys; `lower-to-tile` then builds, besides the usual forward kernel, a split
kernel and a combine kernel, and host code that picks between them at run time (see
docs/inference.md):

* `ROWSxBLOCK_N`: one program packs the query rows of a whole GQA group into a tile of
  `rows` rows (row `r` is query `r / group` of head `kv_head * group + r % group`) and
  walks keys in blocks of `block_n`; calls whose `Sq * group` exceeds `rows` run the
  usual forward kernel;
* `group`: query heads per KV head (`Hq / Hkv`), packed into one tile;
* `splits`: `auto` (the host code sizes the split axis from the batch, the KV heads, the
  visited keys and the device's SM count) or a fixed number of splits;
* `waves`, `min_blocks`: the `auto` rule aims at `waves` programs per SM, with at least
  `min_blocks` KV blocks per split;
* `merge 1` (absent: 0): the 16-row split kernels' last program per (batch, KV head)
  merges the splits itself, up to `merge_rows_limit` of them, instead of the combine
  kernel;
* `persistent 1` (absent: 0): a persistent split kernel takes the calls of one split
  with many (batch, KV head) pairs (`split_host.persistent_taken`).

```mlir
#attn.split_kv<64x64, group 4, splits auto, waves 1, min_blocks 1>
#attn.split_kv<16x16, group 1, splits 3, waves 2, min_blocks 2, merge 1>
#attn.split_kv<64x64, group 4, splits auto, waves 1, min_blocks 1, merge 1, persistent 1>
```
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import IntAttr
from xdsl.ir import Attribute, ParametrizedAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

AUTO = 0
"""`splits` value of the `auto` rule."""

_CLAUSES = ("group", "splits", "waves", "min_blocks", "merge", "persistent")


@irdl_attr_definition
class SplitKVAttr(ParametrizedAttribute):
    """The split-KV decode plan of an `attn.online_softmax` (see the module docstring)."""

    name = "attn.split_kv"

    rows: IntAttr
    block_n: IntAttr
    group: IntAttr
    splits: IntAttr
    waves: IntAttr
    min_blocks: IntAttr
    merge: IntAttr
    persistent: IntAttr

    def __init__(self, rows: int, block_n: int, *, group: int, splits: int = AUTO, waves: int = 1,
                 min_blocks: int = 1, merge: bool = False, persistent: bool = False) -> None:
        super().__init__(*(IntAttr(v) for v in (rows, block_n, group, splits, waves, min_blocks, int(merge),
                                                int(persistent))))

    def verify(self) -> None:
        for what, size in (("rows", self.rows.data), ("block_n", self.block_n.data)):
            if size < 16 or size & (size - 1):
                raise VerifyException(f"#attn.split_kv: {what} must be a power of two >= 16, got {size}")
        if not 1 <= self.group.data <= self.rows.data:
            raise VerifyException(f"#attn.split_kv: group must be in [1, rows], got {self.group.data}")
        for what, value in (("waves", self.waves.data), ("min_blocks", self.min_blocks.data)):
            if value < 1:
                raise VerifyException(f"#attn.split_kv: {what} must be >= 1, got {value}")
        for what, flag in (("merge", self.merge.data), ("persistent", self.persistent.data)):
            if flag not in (0, 1):
                raise VerifyException(f"#attn.split_kv: {what} must be 0 or 1, got {flag}")
        if self.splits.data < 0:
            raise VerifyException(f"#attn.split_kv: splits must be auto or >= 1, got {self.splits.data}")

    def is_auto(self) -> bool:
        return self.splits.data == AUTO

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            rows = parser.parse_shape_dimension(allow_dynamic=False)
            parser.parse_shape_delimiter()
            block_n = parser.parse_shape_dimension(allow_dynamic=False)
            values = {"group": 0, "splits": AUTO, "waves": 1, "min_blocks": 1, "merge": 0, "persistent": 0}
            given: set[str] = set()
            while parser.parse_optional_punctuation(",") is not None:
                start = parser.pos
                clause = parser.parse_keyword_in(_CLAUSES, " in #attn.split_kv")
                if clause in given:
                    parser.raise_error(f"'{clause}' given twice", start, parser.pos)
                given.add(clause)
                if clause == "splits" and parser.parse_optional_keyword("auto") is not None:
                    values[clause] = AUTO
                else:
                    values[clause] = parser.parse_integer(allow_boolean=False)
            if "group" not in given:
                parser.raise_error("#attn.split_kv needs a 'group' clause")
        order = (rows, block_n, values["group"], values["splits"], values["waves"], values["min_blocks"],
                 values["merge"], values["persistent"])
        return tuple(IntAttr(v) for v in order)

    def print_parameters(self, printer: Printer) -> None:
        splits = "auto" if self.is_auto() else str(self.splits.data)
        text = (f"{self.rows.data}x{self.block_n.data}, group {self.group.data}, splits {splits}, "
                f"waves {self.waves.data}, min_blocks {self.min_blocks.data}"
                + (f", merge {self.merge.data}" if self.merge.data else "")
                + (f", persistent {self.persistent.data}" if self.persistent.data else ""))
        with printer.in_angle_brackets():
            printer.print_string(text)
