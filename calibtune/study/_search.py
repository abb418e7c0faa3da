"""Run a study: Ray Tune + Optuna over the trial engine, logging to MLflow, resumably.

Objectives are validation metrics; every epoch report of the trial engine carries them (post-hoc
objectives such as ``val/ece@ts`` are evaluated each epoch through ``eval.epoch_posthoc``), which
OptunaSearch and ASHA require. A trial stopped early by ASHA reaches the sampler as COMPLETE with
the value of its last epoch (Ray's OptunaSearch does not mark it PRUNED), the persisted Optuna
study (`optuna_storage_url`) as PRUNED; its MLflow run is marked ``stopped``. A failed trial
reaches Optuna as FAIL and MLflow as ``failed`` with its reason.

The driver holds the study directory's lock for the whole run, so a second driver on the same
study refuses at once. SIGINT and SIGTERM stop the study the way Tune stops on Ctrl-C (state
saved, resumable with `resume_study`); a storage folder running out of space does the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibtune.cluster import check_cluster, concurrency_limiter, init_ray
from calibtune.readers import grid_ends, mark_feasibility, refresh_summary
from calibtune.record import (
    TAG_HASH,
    TAG_T_GRID_ENDS,
    bind_study,
    child_statuses,
    conditional_grid,
    define_by_run,
    finish_run,
    git_sha,
    log_metrics,
    make_sampler,
    open_study_run,
    optuna_copy_callbacks,
    optuna_storage_url,
    pull_optuna_copy,
    push_optuna_copy,
    resolve_tracking_uri,
    retries_note,
    run_metrics,
    store_created_meanwhile,
    store_full_errors,
    versions,
    watch_retries,
)
from calibtune.storage import check_nodes_see
from calibtune.study._budget import budget_callbacks, budget_message, budget_note
from calibtune.study._constrained import ConstrainedOptunaSearch
from calibtune.study._extend import (
    added_samples,
    check_extendable,
    extended_study,
    optuna_history,
)
from calibtune.study._progress import drain_summaries, guard_message, study_callbacks
from calibtune.study._scheduling import make_scheduler
from calibtune.study._trainable import StudyPayload, make_trainable
from calibtune.study._tunelog import ResultJsonLogger
from calibtune.studyfile import (
    STUDY_COPY,
    StudyConfig,
    StudyDir,
    StudyDirError,
    StudyState,
    load_study,
    silence_disk_full_logs,
    stop_reason,
    storage_full,
    tolerate_full_store,
)
from calibtune.trial import check_data_files

__all__ = ["StudyOutcome", "extend_study", "resume_study", "run_study", "study_dir"]

SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}
STORAGE_FULL_EXIT = 75  # sysexits.h EX_TEMPFAIL: free space, then `calibtune resume`


@dataclass
class StudyOutcome:
    name: str
    storage: Path
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    results: Any  # ray.tune.ResultGrid
    counts: dict[str, int] = field(default_factory=dict)  # MLflow's view: status -> trials
    stopped_by: str | None = None  # "SIGINT", "SIGTERM" or the storage guard's message
    storage_full: bool = False  # stopped because the storage filled up (`_diskfull`)
    budget_note: str | None = None  # `search.time_budget` spent: what was not run (`_budget`)


def study_dir(study: StudyConfig, storage: str | Path | None = None) -> StudyDir:
    return StudyDir.at(study.name, storage or study.storage)


def _tracking_uri(study: StudyConfig, sd: StudyDir, tracking_uri: str | None) -> str:
    """Where the study's runs go: the command line's URI, else where its parent run already is,
    else the study file's."""
    existing = sd.read_state() if sd.state_file.is_file() else None
    recorded = existing.tracking_uri if existing else None
    return resolve_tracking_uri(tracking_uri or recorded or study.tracking.uri)


def _final_feasibility(study: StudyConfig, payload: StudyPayload) -> str | None:
    """Every finished trial's ``calibtune.feasible`` tag as judged at the study's end (None), or
    the one-line warning of a store that refused it."""
    ids = (payload.tracking_uri, payload.experiment_id, payload.parent_run_id)
    try:
        mark_feasibility(study.search.constraints, *ids)
    except Exception as exc:
        return f"[calibtune] warning: feasibility tags not updated ({exc!r:.200})"
    return None


def _open_parent(study: StudyConfig, sd: StudyDir, uri: str) -> StudyPayload:
    """Open (or reopen) the parent run in the store ``uri`` (`_tracking_uri`) and record the
    study's state atomically."""
    existing = sd.read_state() if sd.state_file.is_file() else None
    shared = optuna_storage_url(study, sd) if study.search.optuna_storage else None
    study_id = bind_study(study, shared, existing)  # refused if it is another folder's study
    artifacts = [Path(study.path)] if study.path else []
    artifacts += sorted({Path(c.loss.path) for c in study.losses if c.loss.path})
    with store_full_errors(uri):  # a new store's tables are made here
        parent = open_study_run(
            uri,
            study.experiment,
            study.name,
            tags={TAG_HASH: study.file_hash, "calibtune.git_sha": git_sha()}
            | {f"version.{k}": v for k, v in versions().items()}
            | {TAG_T_GRID_ENDS: json.dumps(grid_ends(study.base_config().eval.posthoc))},
            artifacts=artifacts,
            existing_run_id=existing.parent_run_id if existing else None,
        )
    study_path = str(Path(study.path).resolve()) if study.path else None
    if existing is not None and study_path is None:
        study_path = existing.study_path
    sd.write_study(study)
    sd.write_state(StudyState(uri, parent.experiment_id, parent.run_id, study_path, study_id))
    return StudyPayload(study, uri, parent.experiment_id, parent.run_id, str(sd.trials_dir))


def _searcher(study: StudyConfig, history: list[Any]) -> Any:
    objs = study.search.objectives
    metric: Any = objs[0].metric if len(objs) == 1 else [o.metric for o in objs]
    mode: Any = objs[0].mode if len(objs) == 1 else [o.mode for o in objs]
    searcher = ConstrainedOptunaSearch(
        constraints=study.search.constraints,
        history=history,
        space=define_by_run(study),
        metric=metric,
        mode=mode,
        sampler=make_sampler(study),
        points_to_evaluate=conditional_grid(study) if study.search.sampler == "grid" else None,
        study_name=study.name,
        seed=None,
    )
    return concurrency_limiter(study, searcher)  # max_concurrent: auto follows the cluster


def _tuner(
    study: StudyConfig,
    sd: StudyDir,
    payload: StudyPayload,
    callbacks: list,
    verbose: int,
    more: tuple[int, list[Any]] | None = None,
):
    """Tune over the study's trials, or (``more``: trials to add and the Optuna history they
    continue, `extend_study`) over that many more."""
    from ray import tune

    objs = study.search.objectives
    single = len(objs) == 1
    return tune.Tuner(
        make_trainable(study, payload),
        tune_config=tune.TuneConfig(
            search_alg=_searcher(study, more[1] if more else []),
            scheduler=make_scheduler(study),
            num_samples=more[0] if more else study.search.num_samples,
            reuse_actors=study.search.reuse_actors,
            metric=objs[0].metric if single else None,
            mode=objs[0].mode if single else None,
        ),
        run_config=tune.RunConfig(
            name=study.name,
            storage_path=sd.root.ray_args()[0],
            failure_config=tune.FailureConfig(max_failures=study.search.max_failures),
            callbacks=[*callbacks, *_result_log()],  # Tune appends its loggers to this list
            verbose=verbose,
            storage_filesystem=sd.root.ray_args()[1],  # Tune's state where calibtune's is
        ),
    )


def _result_log() -> list[Any]:
    """Tune's per-trial ``result.json`` (what `ResultGrid`'s ``metrics_dataframe`` reads; not its
    ``params.*``: `ResultJsonLogger`) and, by `_json_log_only`, neither of its other default
    loggers (``progress.csv`` and TensorBoard events: the ≈ 200 metrics of every report written
    twice more, and every file of every trial copied again to the storage at each of Tune's
    state saves, issue 29)."""
    return [ResultJsonLogger()]


@contextlib.contextmanager
def _json_log_only(tuner: Any) -> Iterator[None]:
    """Tune's default loggers off while ``tuner`` runs, when its callbacks log ``result.json``
    (`_result_log`): a study that Tune pickled before then keeps the defaults on resume."""
    from ray.tune.logger import JsonLoggerCallback

    local = getattr(tuner, "_local_tuner", None)
    callbacks = local.get_run_config().callbacks if local is not None else None
    if not any(isinstance(c, JsonLoggerCallback) for c in callbacks or ()):
        yield
        return
    old = os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS")
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", None)
        else:
            os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = old


def run_study(
    study: StudyConfig | str | Path,
    *,
    address: str | None = None,
    tracking_uri: str | None = None,
    storage: str | Path | None = None,
    verbose: int = 1,
    more: int = 0,
    wait_for_resources: float | None = None,
) -> StudyOutcome:
    """Run (or, if its storage already holds it, continue) a study and return its results;
    ``more`` (or a ``search.num_samples`` raised since the study ran, nothing else changed):
    add that many trials to the finished study (`extend_study`). ``wait_for_resources``:
    seconds to wait for a cluster that grows to hold a trial (`check_cluster`)."""
    if not isinstance(study, StudyConfig):
        study = load_study(study)
    sd = study_dir(study, storage)
    if more and not sd.has_tune_state():
        raise StudyDirError(
            f"study {study.name}: expected a study that has run in {sd.path} (--more adds trials "
            "to one), found none; run it without --more first"
        )
    if not more and sd.has_tune_state() and (sd.path / STUDY_COPY).is_file():
        more = added_samples(study, sd.read_study())  # num_samples raised in the study file
    if more:
        return extend_study(
            sd.path, more, address=address, verbose=verbose, wait_for_resources=wait_for_resources
        )
    if sd.has_tune_state():
        return resume_study(
            sd.path, address=address, verbose=verbose, wait_for_resources=wait_for_resources
        )
    _check_files(study)  # bad input stops here, before anything is written or started
    with sd.lock():
        pull_optuna_copy(study, sd)  # a study in a bucket: its Optuna SQLite on this disk
        uri = _tracking_uri(study, sd, tracking_uri)
        with store_created_meanwhile(uri):
            init_ray(address, verbose=verbose > 0)
            check_cluster(study, wait_for_resources)
            check_nodes_share(sd, address)
        payload = _open_parent(study, sd, uri)
        callbacks = _callbacks(study, sd, payload)
        return _fit(_tuner(study, sd, payload, callbacks, verbose), study, sd, payload)


def check_nodes_share(sd: StudyDir, address: str | None) -> None:
    """Refuse, before the first trial, a cluster with a node that cannot read and write the
    study's storage (`calibtune.storage.check_nodes_see`): its trials, local-mode ones too,
    would write where no other node and no `resume` finds them. A local Ray (no ``address``)
    is this machine's one node, which wrote the study's folder already."""
    if address and address != "local":
        check_nodes_see(sd.path, "storage")


def _callbacks(study: StudyConfig, sd: StudyDir, payload: StudyPayload) -> list[Any]:
    optuna_storage = optuna_storage_url(study, sd)
    return (
        study_callbacks(study, payload, sd.path, optuna_storage)
        + budget_callbacks(study.search.time_budget, sd.path)
        + optuna_copy_callbacks(study, sd)  # its copy in a bucket at each of Tune's saves
    )


def extend_study(
    path_or_name: str | Path,
    more: int,
    *,
    address: str | None = None,
    storage: str | Path | None = None,
    verbose: int = 1,
    wait_for_resources: float | None = None,
) -> StudyOutcome:
    """Add ``more`` trials to a study whose trials have all ended: a new Tune round in its
    folder, continuing its Optuna history and MLflow parent run (`calibtune.study._extend`)."""
    sd = StudyDir.find(path_or_name, storage)
    with sd.lock():
        sd.check_restorable()  # a folder Tune wrote completely: its rounds stay restorable
        base = sd.read_study()
        pull_optuna_copy(base, sd)  # the history the new round's sampler continues
        check_extendable(base, sd, sd.read_state(), more)
        study = extended_study(base, more)
        history = optuna_history(study, optuna_storage_url(study, sd))
        init_ray(address, verbose=verbose > 0)
        check_cluster(study, wait_for_resources)
        check_nodes_share(sd, address)
        payload = _open_parent(study, sd, _tracking_uri(study, sd, None))
        tuner = _tuner(study, sd, payload, _callbacks(study, sd, payload), verbose, (more, history))
        return _fit(tuner, study, sd, payload)


def resume_study(
    path_or_name: str | Path,
    *,
    address: str | None = None,
    storage: str | Path | None = None,
    verbose: int = 1,
    wait_for_resources: float | None = None,
) -> StudyOutcome:
    """``Tuner.restore`` a study from its folder (or its name under ``storage``), finishing
    unfinished and errored trials, logging to the same MLflow parent and child runs.

    Only resume study folders you trust: Ray Tune's state files are pickles."""
    from ray import tune

    sd = StudyDir.find(path_or_name, storage)
    if sd.never_started() and (sd.path / STUDY_COPY).is_file():  # nothing to restore (issue 41)
        study = sd.read_study()
        if study.name == sd.name:  # `run_study` finds the folder by the study's name
            return run_study(study, address=address, storage=sd.root, verbose=verbose,
                             wait_for_resources=wait_for_resources)  # fmt: skip
    with sd.lock():
        sd.check_restorable()  # before Ray unpickles anything
        study = sd.read_study()
        pull_optuna_copy(study, sd)  # on any machine: the copy saved with Tune's state
        init_ray(address, verbose=verbose > 0)
        check_cluster(study, wait_for_resources)
        check_nodes_share(sd, address)
        payload = _open_parent(study, sd, _tracking_uri(study, sd, None))
        try:
            path, fs = sd.path.ray_args()
            tuner = tune.Tuner.restore(
                path,
                trainable=make_trainable(study, payload),
                resume_unfinished=True,
                resume_errored=True,
                storage_filesystem=fs,
            )
        except Exception as exc:  # e.g. a state written by another Ray version
            finish_run(payload.tracking_uri, payload.parent_run_id, "KILLED")
            raise StudyDirError(
                f"{sd.path}: expected a Ray Tune state this Ray can restore, got "
                f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            ) from None
        return _fit(tuner, study, sd, payload)


@contextlib.contextmanager
def _graceful_signals() -> Iterator[dict[str, str]]:
    """SIGINT/SIGTERM -> Tune's graceful stop (SIGUSR1); a second signal stops at once."""
    caught: dict[str, str] = {}
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def handler(signum: int, frame: Any) -> None:
        if caught:
            raise KeyboardInterrupt
        caught["signal"] = signal.Signals(signum).name
        os.kill(os.getpid(), signal.SIGUSR1)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    old_env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # ours forwards to Tune's SIGUSR1 handler
    for s in previous:
        signal.signal(s, handler)
    try:
        yield caught
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if old_env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = old_env


def _fit(tuner: Any, study: StudyConfig, sd: StudyDir, payload: StudyPayload) -> StudyOutcome:
    t0 = time.time()
    retries_note(sd.local_scratch(), payload.tracking_uri, 0)  # forget an earlier session's
    watch_retries(sd.local_scratch())  # one line at the end, not urllib3's per retried request
    silence_disk_full_logs()
    results, caught = _tune(tuner, sd, payload)
    drain_summaries()  # the per-trial refreshes, before the last one
    full = stop_reason(sd.path) or guard_message(sd.path)
    stopped_by = caught.get("signal") or full
    counts = _counts(payload, study)
    note = _budget_note(study, sd, counts, stopped_by)
    status = "KILLED" if stopped_by else "FAILED" if counts["finished"] == 0 else "FINISHED"
    status = "KILLED" if note and counts["finished"] == 0 else status  # a budget, not a failure
    totals = {f"study/trials_{k}": v for k, v in counts.items()}
    totals |= _wall_times(payload, time.time() - t0)
    with tolerate_full_store(full is not None):  # an MLflow store on the full disk
        log_metrics(payload.tracking_uri, payload.parent_run_id, totals)
    # an interrupted study's trials resume (the budget's too)
    ended = [] if stopped_by or note else _ended(results)
    warning = refresh_summary(
        study,
        payload.tracking_uri,
        payload.experiment_id,
        payload.parent_run_id,
        optuna_storage_url(study, sd),
        ended=ended,
    )
    if full is None:  # the per-trial refreshes write these at most every few seconds
        warning = warning or _final_feasibility(study, payload)
    copied = push_optuna_copy(study, sd)  # the records of the session's end, in a bucket
    for line in (
        warning,
        copied,
        retries_note(sd.local_scratch(), payload.tracking_uri, counts["failed"]),
    ):
        if line:
            print(line, flush=True)
    with tolerate_full_store(full is not None):
        finish_run(payload.tracking_uri, payload.parent_run_id, status)
    return StudyOutcome(
        study.name,
        sd.path,
        payload.tracking_uri,
        payload.experiment_id,
        payload.parent_run_id,
        results,
        counts,
        stopped_by,
        storage_full=full is not None and stopped_by == full,
        budget_note=note,
    )


def _tune(tuner: Any, sd: StudyDir, payload: StudyPayload) -> tuple[Any, dict[str, str]]:
    """``tuner.fit()`` under graceful signal handling: its results (None when the storage filled
    up under Tune) and the signal caught, if any; the parent run is KILLED on anything else."""
    with _graceful_signals() as caught, _json_log_only(tuner):
        try:
            return tuner.fit(), caught
        except Exception:
            if not storage_full(sd.path):
                finish_run(payload.tracking_uri, payload.parent_run_id, status="KILLED")
                raise
            return None, caught  # e.g. an error file Tune could not write: the study stops
        except BaseException:
            finish_run(payload.tracking_uri, payload.parent_run_id, status="KILLED")
            raise


def _wall_times(payload: StudyPayload, took: float) -> dict[str, float]:
    """``study/wall_time_s``: the driver's time over every session of the study (a resume adds
    its own to the total, never replaces it: resuming a finished study takes a second);
    ``study/session_wall_time_s``: this session's; ``study/sessions``: how many there were."""
    before = run_metrics(payload.tracking_uri, payload.parent_run_id)
    return {
        "study/wall_time_s": before.get("study/wall_time_s", 0.0) + took,
        "study/session_wall_time_s": took,
        "study/sessions": before.get("study/sessions", 0.0) + 1,
    }


def _budget_note(
    study: StudyConfig, sd: StudyDir, counts: dict[str, int], stopped_by: str | None
) -> str | None:
    """What a spent ``search.time_budget`` left unrun (None: no budget spent, a signal or the
    storage guard stopped the study first, or nothing was left)."""
    budget = budget_message(sd.path)  # read in any case: a later session starts without it
    if budget is None or stopped_by or counts["unfinished"] <= 0:
        return None
    return budget_note(study.name, budget, counts["unfinished"], study.search.num_samples, sd.path)


def _ended(results: Any) -> list[tuple[str, dict, dict | None, bool]]:
    """Every trial of a study that ran to its end, as `persist_ended` takes them (catches the
    ones a driver killed between Tune's end of a trial and its Optuna record)."""
    out = []
    for r in results:
        metrics = dict(r.metrics or {})
        if "trial_id" in metrics:
            out.append(
                (str(metrics["trial_id"]), dict(r.config or {}), metrics, r.error is not None)
            )
    return out


def _counts(payload: StudyPayload, study: StudyConfig) -> dict[str, int]:
    """Trials per status as MLflow records them (the counters the parent run carries)."""
    statuses = list(
        child_statuses(payload.tracking_uri, payload.experiment_id, payload.parent_run_id).values()
    )
    counts = {s: statuses.count(s) for s in ("finished", "failed", "stopped")}
    counts["unfinished"] = study.search.num_samples - sum(counts.values())
    return counts


def _check_files(study: StudyConfig) -> None:
    """Fail before any trial starts when the dataset's or an OOD set's files are missing."""
    check_data_files(study.base_config(), True)
