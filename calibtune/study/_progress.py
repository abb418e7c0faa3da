"""Driver-side Tune callbacks: one line per finished or failed trial, MLflow kept in step with
Tune's view of each trial, and a storage guard that stops the study before the disk is full.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from calibtune.study._config import StudyConfig
from calibtune.study._display import clear_line, live_display
from calibtune.study._results import mark_feasibility
from calibtune.study._summary import refresh_summary
from calibtune.study._tracking import PARENT, TAG_STATUS, TAG_TRIAL, close_run, find_runs
from calibtune.study._tracking import record_failure as _record_failure
from calibtune.study._trainable import StudyPayload, failure_reason

# Lazy: Ray Tune's Callback base class only when a study builds its callbacks, so that
# `calibtune dashboard` (imports `_search`, which imports this module) does not load Ray.

__all__ = ["min_free_bytes", "study_callbacks"]


def min_free_bytes() -> int:
    """Free space a study keeps on its storage (``CALIBTUNE_MIN_FREE_MB``, default 100 MiB)."""
    return int(float(os.environ.get("CALIBTUNE_MIN_FREE_MB", "100")) * 1024**2)


def _child(payload: StudyPayload, trial_id: str) -> Any | None:
    runs = find_runs(
        payload.tracking_uri,
        payload.experiment_id,
        f"tags.`{PARENT}` = '{payload.parent_run_id}' and tags.`{TAG_TRIAL}` = '{trial_id}'",
    )
    return runs[0] if runs else None


def _trial_error(trial: Any) -> str:
    try:  # Ray's pickled error may be empty when the disk filled up while writing it
        err = trial.get_error()
    except Exception:
        err = None
    return failure_reason(err) if err is not None else "the trial's process failed (no details)"


def study_callbacks(
    study: StudyConfig, payload: StudyPayload, storage: Path, optuna_storage: str | None = None
) -> list[Any]:
    """The callbacks `run_study` gives Tune: progress lines with MLflow kept in step (and the
    parent run's summary refreshed when a trial ends), the storage guard, and the live status
    line (their classes are built on call: importing this module does not import Ray)."""
    return [
        _progress(study, payload, optuna_storage),
        _storage_guard(storage),
        live_display(study),
    ]


def _progress(study: StudyConfig, payload: StudyPayload, optuna_storage: str | None) -> Any:
    from ray.tune import Callback

    def summarize(trial: Any, failed: bool) -> None:
        """Record the ended trial in the Optuna storage, then refresh the parent run."""
        warning = refresh_summary(
            study,
            payload.tracking_uri,
            payload.experiment_id,
            payload.parent_run_id,
            optuna_storage,
            ended=[(trial.trial_id, dict(trial.config), trial.last_result, failed)],
        )
        if warning:
            print(warning, flush=True)
        ids = (payload.tracking_uri, payload.experiment_id, payload.parent_run_id)
        mark_feasibility(study.search.constraints, *ids)  # relative bounds moved

    objective = study.search.objectives[0]

    class Progress(Callback):
        """One line per finished/failed trial; a trial's MLflow run closed as Tune closed it."""

        def __init__(self) -> None:
            self.done = 0
            self.failed = 0
            self.best: float | None = None

        def _running(self, trials: list[Any], trial: Any) -> int:
            return sum(1 for t in trials if t.status == "RUNNING" and t is not trial)

        def _tail(self, trials: list[Any], trial: Any) -> str:
            best = "n/a" if self.best is None else f"{self.best:.4f}"
            return (
                f"finished {self.done}, failed {self.failed} of {study.search.num_samples}, "
                f"running {self._running(trials, trial)} | best {objective.metric} {best}"
            )

        def on_trial_complete(self, iteration, trials, trial, **info):  # type: ignore[override]
            result = trial.last_result or {}
            child = None if result.get("calibtune/done") else _child(payload, trial.trial_id)
            if child is not None and child.data.tags.get(TAG_STATUS) == "running":
                close_run(payload.tracking_uri, child.info.run_id, "stopped")  # ASHA stopped it
            self.done += 1
            value = result.get(objective.metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                pick = min if objective.mode == "min" else max
                self.best = float(value) if self.best is None else pick(self.best, float(value))
            shown = "n/a" if value is None else f"{value:.4f}"
            self._line(trials, trial, f"done: {objective.metric}={shown}")
            summarize(trial, False)

        def on_trial_error(self, iteration, trials, trial, **info):  # type: ignore[override]
            self.failed += 1
            reason = _trial_error(trial)
            child = _child(payload, trial.trial_id)
            if child is not None and child.data.tags.get(TAG_STATUS) == "running":
                _record_failure(payload.tracking_uri, child.info.run_id, reason)
            self._line(trials, trial, f"failed: {reason}")
            summarize(trial, True)

        def _line(self, trials: list[Any], trial: Any, what: str) -> None:
            clear_line()  # the live status line, on a TTY
            loss = trial.config.get("loss")
            print(
                f"[calibtune] trial {trial.trial_id} ({loss}) {what} | {self._tail(trials, trial)}",
                flush=True,
            )

    return Progress()


def _storage_guard(storage: Path) -> Any:
    from ray.tune import Callback

    class StorageGuard(Callback):
        """Stop the study (state saved, resumable) while ``storage`` still has room for it."""

        def __init__(self) -> None:
            self.last = 0.0
            self.message: str | None = None

        def on_step_begin(self, iteration, trials, **info):  # type: ignore[override]
            now = time.monotonic()
            if self.message is not None or now - self.last < 1.0:
                return
            self.last = now
            free, need = shutil.disk_usage(storage).free, min_free_bytes()
            if free < need:
                self.message = (
                    f"storage {storage}: expected at least {need / 1024**2:.0f} MiB free, found "
                    f"{free / 1024**2:.1f} MiB; the study stopped with its state saved: free "
                    f"space, then `calibtune resume {storage}`"
                )
                os.kill(os.getpid(), signal.SIGUSR1)  # Tune's graceful stop (state saved)

    return StorageGuard()
