"""The cost model: GPU targets and the predicted time of each RoPE placement.

:mod:`~attnfuse.cost.target` describes GPUs, :mod:`~attnfuse.cost.model` predicts
placement times and crossovers, :mod:`~attnfuse.cost.fit` fits and scores the model
on measured sweeps, :mod:`~attnfuse.cost.report` formats ``--cost-report``.
docs/cost-model.md derives the model.
"""

from __future__ import annotations

from attnfuse.cost.model import AttentionShape, choose, crossover, predict
from attnfuse.cost.target import TARGETS, Target, UnknownTargetError, get_target, known_targets

__all__ = [
    "TARGETS",
    "AttentionShape",
    "Target",
    "UnknownTargetError",
    "choose",
    "crossover",
    "get_target",
    "known_targets",
    "predict",
]
