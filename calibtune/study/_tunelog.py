"""Tune's per-trial log as calibtune keeps it: ``result.json`` alone (issue 29).

Ray Tune's JSON logger also writes each trial's config as ``params.json`` and ``params.pkl``.
Nothing reads them (a trial's config is in Tune's experiment state, its MLflow run and the
study's start records), but every file of every trial folder is copied again to the study's
storage at each of Tune's state saves: at 1,000 trials 3,000 files per save instead of 1,000.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ray.air.constants import EXPR_RESULT_FILE
from ray.tune.logger import JsonLoggerCallback

__all__ = ["ResultJsonLogger"]


class ResultJsonLogger(JsonLoggerCallback):
    """`JsonLoggerCallback` without ``params.json`` / ``params.pkl``: each trial's reports as
    JSON lines in its ``result.json`` (what `ResultGrid`'s ``metrics_dataframe`` reads)."""

    _SAVED_FILE_TEMPLATES: ClassVar[list[str]] = [EXPR_RESULT_FILE]

    def update_config(self, trial: Any, config: dict[str, Any]) -> None:
        self._trial_configs[trial] = config
