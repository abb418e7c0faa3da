"""Which epoch's model a trial evaluates at its end (``eval.select_epoch``).

``last``: the last epoch's. ``best``: the epoch whose ``eval.select_metric`` (a validation key
every epoch reports) is best in its direction (`calibtune.metrics.keys.direction`), the earliest
on ties; a non-finite value is never best. The trial checkpoints every new best epoch; the
checkpoints kept are the ``train.keep_checkpoints`` best-scoring and the latest (Ray Train's rule
with ``CheckpointConfig(checkpoint_score_attribute=…)`` in worker mode, `keep_local` in local
mode), so the best epoch's state is always there, also after a resume.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from calibtune.metrics import keys as K

__all__ = ["best_epoch", "keep_local", "score"]


def score(metrics: Mapping[str, Any], metric: str) -> float:
    """The epoch's value of ``metric`` oriented so that smaller is better (inf if missing or
    non-finite).

    >>> score({"val/nll": 0.3}, "val/nll"), score({"val/nll": float("nan")}, "val/nll")
    (0.3, inf)
    """
    v = metrics.get(metric)
    if not isinstance(v, int | float) or not math.isfinite(v):
        return math.inf
    return -float(v) if K.direction(metric) == "max" else float(v)


def best_epoch(history: Sequence[Mapping[str, Any]], metric: str) -> int | None:
    """The epoch (1-based, from each report's ``epoch``) with the best ``metric``; the earliest
    on ties; None if no epoch has a finite value.

    >>> best_epoch([{"epoch": 1, "val/nll": 0.5}, {"epoch": 2, "val/nll": 0.4},
    ...             {"epoch": 3, "val/nll": 0.4}], "val/nll")
    2
    """
    scored = [(score(h, metric), int(h["epoch"])) for h in history]
    finite = [s for s in scored if math.isfinite(s[0])]
    return min(finite)[1] if finite else None


def is_new_best(history: Sequence[Mapping[str, Any]], metric: str) -> bool:
    """Whether the last report of ``history`` is strictly better than every earlier one."""
    if not history:
        return False
    last = score(history[-1], metric)
    return math.isfinite(last) and all(last < score(h, metric) for h in history[:-1])


def keep_local(epochs: Sequence[int], keep: int, scores: Mapping[int, float]) -> set[int]:
    """The local checkpoints to keep: the ``keep`` best-scoring (smaller is better, earlier on
    ties) and the latest, as Ray Train keeps its own.

    >>> sorted(keep_local([1, 2, 3, 4], 1, {1: 0.2, 2: 0.1, 3: 0.5, 4: 0.4}))
    [2, 4]
    """
    ranked = sorted(epochs, key=lambda e: (scores.get(e, math.inf), e))
    return set(ranked[:keep]) | ({max(epochs)} if epochs else set())
