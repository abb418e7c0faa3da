"""Driver-side Tune callbacks: one line per finished or failed trial, MLflow kept in step with
Tune's view of each trial, and a storage guard that stops the study before the disk is full.

The parent run's summary is refreshed off Tune's event loop (`SummaryWorker`), so that a
finished trial's slot is refilled at once; the same thread first draws the figures the ended
trials left to the driver (`render_deferred_figures`), and redraws the study figures only now
and then (`FigureThrottle`). What `run_study` reads back after
``Tuner.fit`` (`drain_summaries`, `guard_message`) is kept per study in this module, not on the
callback objects: on ``resume`` Tune runs the callbacks it unpickled from its own state, not ours.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibtune.cluster import clear_line
from calibtune.readers import mark_feasibility, refresh_summary
from calibtune.record import (
    PARENT,
    TAG_ERROR,
    TAG_STATUS,
    TAG_TRIAL,
    close_run,
    find_runs,
    render_deferred_figures,
    reopen_interrupted,
)
from calibtune.record import record_failure as _record_failure
from calibtune.storage import disk_full_text
from calibtune.study._display import live_display, slots_text, study_slots
from calibtune.study._scheduling import error_line, last_error, retryable
from calibtune.study._trainable import REUSED_KEY, StudyPayload, failure_reason
from calibtune.studyfile import StudyConfig, request_stop, storage_full
from calibtune.studyfile import tolerate_full_store as tolerate
from calibtune.studyfile import trial_error_text as ray_error

__all__ = ["SummaryWorker", "drain_summaries", "guard_message", "min_free_bytes", "study_callbacks"]

Ended = tuple[str, dict, Any, bool]  # (trial id, config, last result, failed): `persist_ended`


class SummaryWorker:
    """Runs ``refresh(batch)`` on one background thread for the trials that ended: a trial that
    ends while a refresh runs joins the next batch (each ended trial is recorded once, the
    summary redrawn as often as the refreshes keep up). `drain` waits until all are done."""

    def __init__(self, refresh: Callable[[list[Ended]], None]) -> None:
        self._refresh = refresh
        self._pending: list[Ended] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, ended: Ended) -> None:
        with self._lock:
            self._pending.append(ended)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                batch, self._pending = self._pending, []
                if not batch:
                    self._thread = None
                    return
            try:
                self._refresh(batch)
            except Exception as exc:  # never a dead thread that `drain` would wait for
                print(f"[calibtune] warning: parent-run summary not updated ({exc!r:.200})")

    def drain(self) -> None:
        while (thread := self._thread) is not None:
            thread.join()


class FigureThrottle:
    """When a per-trial refresh of the parent run redraws the study figures (objective history,
    ECE vs parameters, Pareto front, importances): at the first refresh, then once at least
    ``wait = max(min_wait_s, factor × took)`` seconds have passed since the end of the last
    drawing refresh, ``took`` being how long that refresh ran. The tables are rewritten at every
    refresh; the end of `run`/`resume` always redraws (`calibtune.study._search`).

    Why these defaults: with the figures a refresh took 5× the CPU of the tables alone (0.39 s
    vs 0.07 s for the 8-trial quickstart, at load 2.3; 5.5 s under load before the figures got
    cheaper), redone at every trial's end while the trials need the same cores (issue 13,
    bench/README.md "Driver CPU per trial in a study"). 30 s keeps a running study's figures at
    most half a minute behind its tables (a quickstart's trials take 25–60 s in all: one or two
    drawings before the final one, instead of eight); ``factor = 10`` keeps the drawing under
    ≈ 10 % of the driver's time however slow it gets (many trials, a loaded machine)."""

    def __init__(
        self,
        min_wait_s: float = 30.0,
        factor: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_wait_s, self.factor, self.clock = min_wait_s, factor, clock
        self._last: float | None = None  # clock() at the end of the last drawing refresh
        self._wait = min_wait_s

    def due(self) -> bool:
        return self._last is None or self.clock() - self._last >= self._wait

    def drawn(self, took: float) -> None:
        """Record a drawing refresh that just ended after ``took`` seconds."""
        self._last = self.clock()
        self._wait = max(self.min_wait_s, self.factor * took)


_WORKERS: dict[str, SummaryWorker] = {}  # parent run id -> its study's worker (driver process)
_THROTTLES: dict[str, FigureThrottle] = {}  # parent run id -> when its study figures are due
_TABLES: dict[str, FigureThrottle] = {}  # parent run id -> when its tables are due
_FIGURES: dict[str, Callable[[], None]] = {}  # study name -> render its trials' deferred figures
_GUARD: dict[str, str] = {}  # storage folder -> why the storage guard stopped the study


def _worker(parent_run_id: str, refresh: Callable[[list[Ended]], None]) -> SummaryWorker:
    # A function, not the dict itself, in the callbacks' closures: Tune pickles its callbacks,
    # and cloudpickle would copy a referenced module dict (with its workers' locks) by value.
    return _WORKERS.setdefault(parent_run_id, SummaryWorker(refresh))


def _throttle(parent_run_id: str) -> FigureThrottle:
    return _THROTTLES.setdefault(parent_run_id, FigureThrottle())  # (see `_worker`)


def _tables(parent_run_id: str) -> FigureThrottle:
    """When a refresh rewrites the parent run's tables, best trial and feasibility tags, which
    read every trial run of the study: at most every ``max(5 s, 30 × took)`` (a 1,000-trial
    study's take seconds: every minute or so then). Per trial, their cost grows with the trials
    already run until the factor caps it at ≈ 3 % of the driver's time: with 10, the cap was
    10 %, and the driver's CPU per trial at 1,000 trials was still growing (issue 29,
    bench/README.md). The trials that ended are recorded at every refresh (Optuna, learning
    curves: only their own runs are read); the end of `run`/`resume` rewrites everything."""
    throttle = FigureThrottle(min_wait_s=5.0, factor=30.0)
    return _TABLES.setdefault(parent_run_id, throttle)  # (see `_worker`)


def _register_figures(study_name: str, render: Callable[[], None]) -> None:
    _FIGURES[study_name] = render  # (a function in the closure: see `_worker`)


def drain_summaries() -> None:
    """Wait for every study's summary refreshes in this process (a resumed study's callbacks
    may still name the parent run its first session had), then forget the workers and their
    figure throttles: a later study in this process (a `resume` of the same parent run) gets its
    own. Then render the trial figures still deferred (`render_deferred_figures`; a resumed
    study's too, left by a driver that died first), so that every finished trial's run has them
    when the study ends."""
    while _WORKERS:
        _WORKERS.popitem()[1].drain()
    _THROTTLES.clear()  # the final refresh (after this) redraws in any case
    _TABLES.clear()
    while _FIGURES:
        _FIGURES.popitem()[1]()


def _record_guard(storage: Path, message: str) -> str:
    _GUARD[str(storage)] = message  # (a function in the closure: see `_worker`)
    return message


def guard_message(storage: Path) -> str | None:
    """Why the storage guard stopped the study in ``storage`` in this process, if it did; read
    once (a later run of the same study in this process starts without it)."""
    return _GUARD.pop(str(storage), None)


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
    """Tune's record of a failed trial's error, in one line: Ray 2.60's ``Trial.get_error``
    returns the text of its error file (a traceback), older ones an exception."""
    try:  # Ray's error file may be empty when the disk filled up while writing it
        err = trial.get_error()
    except Exception:
        err = None
    if isinstance(err, BaseException):
        return failure_reason(err)
    if err and str(err).strip():
        return error_line(str(err).split("Failure # ")[-1])
    return "the trial's process failed (no details)"


def _failure(payload: StudyPayload, trial: Any) -> str:
    """A failed trial's reason: the one its run records (what `compare` shows; Tune's copy of
    the error may not be readable yet), else Tune's; its run is closed as failed if the trial
    could not do it (its process died)."""
    child = _child(payload, trial.trial_id)
    tags = child.data.tags if child is not None else {}
    reason = tags.get(TAG_ERROR) or _trial_error(trial)
    if child is not None and tags.get(TAG_STATUS) == "running":
        _record_failure(payload.tracking_uri, child.info.run_id, reason)
    return reason


def _done(result: dict) -> str:
    twin = result.get(REUSED_KEY)
    return f"done (same config as trial {twin}: its result reused)" if twin else "done"


def study_callbacks(
    study: StudyConfig, payload: StudyPayload, storage: Path, optuna_storage: str | None = None
) -> list[Any]:
    """The callbacks `run_study` gives Tune: progress lines with MLflow kept in step (and the
    parent run's summary refreshed when a trial ends), the storage guard, and the live status
    line (their classes are built on call: importing this module does not import Ray)."""
    return [
        _progress(study, payload, optuna_storage, storage),
        _storage_guard(storage),
        live_display(study),
    ]


def _refresher(
    study: StudyConfig, payload: StudyPayload, optuna_storage: str | None
) -> tuple[Callable[[], None], Callable[[list[Ended]], None]]:
    """``(figures, refresh)`` for a study's driver: ``figures()`` draws the trial figures the
    ended trials left to it; ``refresh(batch)`` does that, records the batch in the Optuna
    storage and refreshes the parent run (its study figures when `FigureThrottle` says so)."""
    draws = study.base_config().eval.figures  # else no trial defers any (`_trainable`)

    def figures() -> None:
        if not draws:
            return
        try:
            render_deferred_figures(payload.tracking_uri, payload.experiment_id, study.name)
        except Exception as exc:  # left tagged: the next refresh or the study's end redoes it
            print(f"[calibtune] warning: trial figures not rendered ({exc!r:.200})", flush=True)

    def refresh(batch: list[Ended]) -> None:
        figures()
        ids = (payload.tracking_uri, payload.experiment_id, payload.parent_run_id)
        throttle, tables = _throttle(payload.parent_run_id), _tables(payload.parent_run_id)
        write = tables.due()
        draw, t0 = write and throttle.due(), time.monotonic()
        warning = refresh_summary(
            study, *ids, optuna_storage, ended=batch, figures=draw, tables=write
        )
        if warning is None:  # else the next refresh tries again
            if write:  # a drawing refresh's time is mostly its figures' (the first: imports)
                tables.drawn(0.0 if draw else time.monotonic() - t0)
            if draw:
                throttle.drawn(time.monotonic() - t0)
        if warning:
            print(warning, flush=True)
        if not write:
            return
        try:
            mark_feasibility(study.search.constraints, *ids)  # relative bounds moved
        except Exception as exc:  # a store briefly unavailable: the next refresh redoes it
            print(f"[calibtune] warning: feasibility tags not updated ({exc!r:.200})", flush=True)

    return figures, refresh


def _interrupted_by_full_disk(
    payload: StudyPayload, storage: Path, trial: Any, child: Any | None, reason: str
) -> bool:
    """Whether a trial failed because a disk filled up (its reason, the one its run recorded,
    Tune's local record of its error, or an ENOSPC the driver saw on the storage): then its run
    is reopened for `resume` and the study stops (`calibtune.studyfile._diskfull`)."""
    recorded = child.data.tags.get(TAG_ERROR, "") if child is not None else ""
    texts = (reason, recorded, ray_error(trial))
    if not storage_full(storage) and not any(map(disk_full_text, texts)):
        return False
    if child is not None:
        with tolerate(True):  # an MLflow store on the full disk: `resume` reopens the run
            reopen_interrupted(payload.tracking_uri, child.info.run_id)
    request_stop(storage)
    return True


def _progress(
    study: StudyConfig, payload: StudyPayload, optuna_storage: str | None, storage: Path
) -> Any:
    """The study's Tune callback (`_ProgressLines` as a ``ray.tune.Callback``)."""
    from ray.tune import Callback

    figures, refresh = _refresher(study, payload, optuna_storage)

    def summarize(trial: Any, failed: bool) -> None:
        _worker(payload.parent_run_id, refresh).submit(
            (trial.trial_id, dict(trial.config), trial.last_result, failed)
        )

    class Progress(_ProgressLines, Callback):
        pass

    return Progress(study, payload, storage, summarize, figures)


class _ProgressLines:
    """One line per finished/failed trial; a trial's MLflow run closed as Tune closed it. A
    plain class, made a ``ray.tune.Callback`` by `_progress` (Ray is imported there only)."""

    def __init__(
        self,
        study: StudyConfig,
        payload: StudyPayload,
        storage: Path,
        summarize: Callable[[Any, bool], None],
        figures: Any,
    ) -> None:
        self.study, self.payload, self.storage = study, payload, storage
        self.summarize, self.figures = summarize, figures
        self.objective = study.search.objectives[0]
        self.done = 0
        self.failed = 0
        self.best: float | None = None

    def setup(self, **info):  # type: ignore[no-untyped-def]
        # at every `Tuner.fit`, a resumed one's too: the study's end renders what is left
        _register_figures(self.study.name, self.figures)

    def _running(self, trials: list[Any], trial: Any) -> int:
        return sum(1 for t in trials if t.status == "RUNNING" and t is not trial)

    def _tail(self, trials: list[Any], trial: Any) -> str:
        best = "n/a" if self.best is None else f"{self.best:.4f}"
        if getattr(self, "slots", None) is None:  # set on first use; read every 5 s at most
            self.slots = study_slots(self.study)
        return (
            f"finished {self.done}, failed {self.failed} of {self.study.search.num_samples}, "
            f"running {self._running(trials, trial)} | {slots_text(self.slots())}"
            f"best {self.objective.metric} {best}"
        )

    def on_trial_complete(self, iteration, trials, trial, **info):  # type: ignore[no-untyped-def]
        payload, objective = self.payload, self.objective
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
        self._line(trials, trial, f"{_done(result)}: {objective.metric}={shown}")
        self.summarize(trial, False)

    def on_trial_recover(self, iteration, trials, trial, **info):  # type: ignore[no-untyped-def]
        # neither failed in MLflow nor told to Optuna: the retry continues the same run

        error = last_error(trial)
        if not retryable(error):
            return  # its own error: the scheduler ends it at once (`on_trial_error`'s line)
        why = error_line(error)
        self._line(trials, trial, f"failed ({why}); retried from its last checkpoint")

    def on_trial_error(self, iteration, trials, trial, **info):  # type: ignore[no-untyped-def]
        payload = self.payload
        child = _child(payload, trial.trial_id)
        tags = child.data.tags if child is not None else {}
        reason = tags.get(TAG_ERROR) or _trial_error(trial)
        if _interrupted_by_full_disk(payload, self.storage, trial, child, reason):
            self._line(trials, trial, "interrupted by a full disk (resumed later)")
            return  # neither failed in MLflow nor told to Optuna: `resume` finishes it
        self.failed += 1
        self._line(trials, trial, f"failed: {_failure(payload, trial)}")
        self.summarize(trial, True)

    def _line(self, trials: list[Any], trial: Any, what: str) -> None:
        clear_line()  # the live status line, on a TTY
        loss = trial.config.get("loss")
        print(
            f"[calibtune] trial {trial.trial_id} ({loss}) {what} | {self._tail(trials, trial)}",
            flush=True,
        )


def _on_disk(storage: Any) -> bool:
    """Whether the study's storage is a local disk (a bucket has no free space to guard)."""
    return bool(getattr(storage, "is_local", True))


def _storage_guard(storage: Path) -> Any:
    from ray.tune import Callback

    class StorageGuard(Callback):
        """Stop the study (state saved, resumable) while ``storage`` still has room for it."""

        def __init__(self) -> None:
            self.last = 0.0
            self.message: str | None = None

        def on_step_begin(self, iteration, trials, **info):  # type: ignore[override]
            if storage_full(storage):  # a write of Tune's state failed: stop before a trial starts
                request_stop(storage)
                return
            now = time.monotonic()
            if self.message is not None or now - self.last < 1.0 or not _on_disk(storage):
                return
            self.last = now
            free, need = shutil.disk_usage(storage).free, min_free_bytes()
            if free < need:
                self.message = _record_guard(
                    storage,
                    f"storage {storage}: expected at least {need / 1024**2:.0f} MiB free, found "
                    f"{free / 1024**2:.1f} MiB; the study stopped with its state saved: free "
                    f"space, then `calibtune resume {storage}`",
                )
                os.kill(os.getpid(), signal.SIGUSR1)  # Tune's graceful stop (state saved)

    return StorageGuard()
