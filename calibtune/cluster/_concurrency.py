"""``search.max_concurrent: auto``: as many trials at a time as the cluster holds, re-read as
nodes come and go.

A *slot* is what one seed of a trial takes (`seed_footprint`): in local mode its process's CPU
and GPU, with Ray Train workers ``num_workers`` worker bundles. The cluster holds
``slots = min over resources r of floor(total[r] / seed[r])`` (`cluster_slots`), and a trial
takes one slot per seed (its seeds train at the same time, `calibtune.study._trainable`). Auto
runs ``ceil(slots / seeds) + 1`` trials (`auto_limit`): every slot is busy when the seeds do
not divide the slots, and one trial more waits in Ray's queue, so that a slot freed by a
trial's last seed goes to the next seed at once instead of idling through the start and the end
of a trial (its MLflow runs, Tune's bookkeeping); with no slot yet, one trial is let through so
that an autoscaler sees its demand.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import ray
from ray.tune.search import ConcurrencyLimiter

from calibtune.studyfile import StudyConfig
from calibtune.trial import worker_bundle

# Ray at import: `calibtune.study._search` imports this module only when a study runs.

__all__ = [
    "AutoConcurrency",
    "auto_limit",
    "cluster_slots",
    "concurrency_limiter",
    "seed_footprint",
    "slot_usage",
]

#: seconds between two reads of the cluster's resources
REFRESH_S = 5.0


def seed_footprint(study: StudyConfig) -> dict[str, float]:
    """The Ray resources one seed of a trial holds: its worker bundle (`worker_bundle`) once in
    local mode, ``num_workers`` times with Train workers.

    >>> from calibtune.studyfile._config import study_from_text
    >>> seed_footprint(study_from_text("name: s\\nlosses: [cross_entropy]", "s"))
    {'CPU': 1.0}
    """
    s = study.base_config().scaling
    n = max(s.num_workers, 1)
    return {k: v * n for k, v in worker_bundle(s).items() if v > 0}


def cluster_slots(total: Mapping[str, float], seed: Mapping[str, float]) -> int:
    """How many seeds ``total`` (a cluster's resources) holds at once:
    ``min_r floor(total[r] / seed[r])``.

    >>> cluster_slots({"CPU": 16.0, "GPU": 4.0}, {"CPU": 1.0, "GPU": 1.0})
    4
    """
    counts = [math.floor(float(total.get(r, 0.0)) / v + 1e-9) for r, v in seed.items() if v > 0]
    return max(min(counts), 0) if counts else 0


def auto_limit(slots: int, seeds: int, cap: int | None = None) -> int:
    """Trials at a time: ``ceil(slots / seeds) + 1`` (one queued), 1 without slots, at most
    ``cap``.

    >>> auto_limit(4, 3), auto_limit(0, 3), auto_limit(8, 1, cap=2)
    (3, 1, 2)
    """
    n = math.ceil(slots / max(seeds, 1)) + 1 if slots > 0 else 1
    return min(n, cap) if cap else n


def slot_usage(study: StudyConfig) -> tuple[int, int]:
    """``(used, available)``: the slots of the connected cluster its jobs hold now and the
    slots it has (for the progress line)."""
    seed = seed_footprint(study)
    total = ray.cluster_resources()
    free = ray.available_resources()
    have = cluster_slots(total, seed)
    return have - min(cluster_slots(free, seed), have), have


def concurrency_limiter(study: StudyConfig, searcher: Any) -> ConcurrencyLimiter:
    """Ray's ConcurrencyLimiter over ``searcher``: the study's ``max_concurrent`` as is, or for
    ``auto`` one whose limit follows the cluster (`AutoConcurrency`)."""
    n = study.search.max_concurrent
    if n != "auto":
        return ConcurrencyLimiter(searcher, max_concurrent=int(n))
    return AutoConcurrency(searcher, seed_footprint(study), len(study.search.seeds))


class AutoConcurrency(ConcurrencyLimiter):
    """A ConcurrencyLimiter whose ``max_concurrent`` is `auto_limit` of the cluster's slots,
    re-read at most every `REFRESH_S` seconds when Tune asks for a trial."""

    def __init__(self, searcher: Any, seed: Mapping[str, float], seeds: int) -> None:
        super().__init__(searcher, max_concurrent=1)
        self.seed = dict(seed)
        self.seeds = seeds
        self.read_at = -math.inf
        self.refresh()

    def refresh(self) -> None:
        now = time.monotonic()
        if now - self.read_at < REFRESH_S or not ray.is_initialized():
            return
        self.read_at = now
        self.max_concurrent = auto_limit(
            cluster_slots(ray.cluster_resources(), self.seed), self.seeds
        )

    def suggest(self, trial_id: str) -> Any:
        self.refresh()
        return super().suggest(trial_id)

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        self.read_at = -math.inf  # another process's clock: read the cluster again
