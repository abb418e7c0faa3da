"""The parent run as the study's summary: fixed settings as params, the best value and trial,
the comparison and report tables, and study-level figures; refreshed as trials end (the tables
and best trial at most every few seconds, the figures less often:
`calibtune.study._progress.FigureThrottle`) and at the end of `run`/`resume` (always, figures
too).

Everything is read back from MLflow (the child runs) and, for importances, from the study's
Optuna storage, so a refresh after a restore sees every trial of every session.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna

from calibtune.metrics import keys as K
from calibtune.plots import _study as P
from calibtune.plots import drawing, save_png
from calibtune.readers._results import (
    StudyRef,
    compare_table,
    feasibility,
    format_table,
    pareto_mask,
    report_table,
    trials_frame,
)
from calibtune.record import (
    log_metrics,
    mlflow_client,
    objective_curves,
    open_optuna_study,
    persist_ended,
    quiet_optuna,
    recorded_ids,
)
from calibtune.studyfile import StudyConfig

__all__ = ["TAG_BEST", "best_key", "refresh_summary", "study_params", "summarize_study"]

TAG_BEST = "calibtune.best_trial"
TAG_BEST_RUN = "calibtune.best_run_id"
ECE_SERIES = ("val/ece", "val/ece@ts")
COMPARE_METRICS = (
    "val/ece",
    "test/error",
    "test/ece",
    "test/ece@ts",
)  # ECE before/after TS against each hyperparameter


def best_key(objective: str) -> str:
    """The parent run's key for the best value of ``objective``:
    ``val/ece@ts`` -> ``study/best_val_ece@ts`` (MLflow: ``study/best_val_ece.ts``)."""
    return K.best_key(objective)


def study_params(study: StudyConfig) -> dict[str, str]:
    """The study's fixed settings (what every trial shares), as MLflow params."""
    base = study.base_config()
    s = study.search
    return {
        "data": base.data.name,
        "model": base.model.name,
        "optimizer": base.optimizer.name,
        "epochs": str(base.train.epochs),
        "batch_size": str(base.train.batch_size),
        "losses": ",".join(c.label for c in study.losses),
        "searched": ",".join(sorted(study.space.dists)) or "-",
        "sampler": s.sampler,
        "sampler_seed": str(s.sampler_seed),
        "num_samples": str(s.num_samples),
        "max_concurrent": str(s.max_concurrent),
        "objectives": ",".join(f"{o.metric}:{o.mode}" for o in s.objectives),
        "scheduler": s.scheduler,
        "seeds": json.dumps(list(s.seeds)),
    }


def _ref(study: StudyConfig, uri: str, exp_id: str, parent_run_id: str) -> StudyRef:
    objectives = tuple((o.metric, o.mode) for o in study.search.objectives)
    return StudyRef(study.name, uri, exp_id, parent_run_id, objectives, study.search.constraints)


def summarize_study(
    study: StudyConfig,
    uri: str,
    exp_id: str,
    parent_run_id: str,
    optuna_study: Any | None = None,
    figures: bool = True,
) -> list[str]:
    """Refresh the parent run's summary; returns the notes on what was skipped and why.

    ``figures=False`` writes the tables, best-trial tags and metric but leaves the study figures
    (``summary/figures/*``) as the last drawing logged them: MLflow's ``log_artifacts`` adds and
    overwrites files, it never removes any, so they stay in place until the next drawing."""
    from mlflow.entities import Param

    client = mlflow_client(uri)
    params = [Param(k, v[:6000]) for k, v in study_params(study).items()]
    have = client.get_run(parent_run_id).data.params
    if any(p.key not in have for p in params):
        client.log_batch(parent_run_id, params=[p for p in params if p.key not in have])
    ref = _ref(study, uri, exp_id, parent_run_id)
    df = trials_frame(ref, include_unfinished=True)
    if df.empty:
        return ["no trial has ended yet"]
    _log_best(client, ref, df)
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        wanted = [m for m, _ in ref.objectives] + list(COMPARE_METRICS)
        shown = [m for m in dict.fromkeys(wanted) if m in df.columns]  # what the trials logged
        tables = (
            ("compare", compare_table(ref, shown, trials=df)),
            ("report", report_table(ref, trials=df)),
        )
        for stem, table in tables:
            (out / f"{stem}.md").write_text(format_table(table, "markdown"))
            (out / f"{stem}.csv").write_text(format_table(table, "csv"))
        if figures:
            (out / "figures").mkdir()
            notes += _figures(study, ref, df, optuna_study, out / "figures")
        client.log_artifacts(parent_run_id, str(out), artifact_path="summary")
    if notes:
        client.set_tag(parent_run_id, "calibtune.summary_notes", "; ".join(notes)[:5000])
    return notes


def _log_best(client: Any, ref: StudyRef, df: Any) -> None:
    """The best finished trial by the first objective, among those that meet the study's
    constraints (as `export` chooses)."""
    objective, mode = ref.objectives[0]
    done = df[df["status"] == "finished"]
    if ref.constraints:
        done = done[feasibility(ref.constraints, df)[done.index] == True]  # noqa: E712 (object)
    if objective not in done or done[objective].notna().sum() == 0:
        return
    done = done[done[objective].notna()]
    best = done.sort_values(objective, ascending=(mode == "min"), kind="stable").iloc[0]
    log_metrics(ref.tracking_uri, ref.parent_run_id, {best_key(objective): best[objective]})
    client.set_tag(ref.parent_run_id, TAG_BEST, str(best["trial_id"]))
    client.set_tag(ref.parent_run_id, TAG_BEST_RUN, str(best["run_id"]))


def _figures(
    study: StudyConfig, ref: StudyRef, df: Any, optuna_study: Any | None, out: Path
) -> list[str]:

    notes: list[str] = []
    df = df[df["status"] != "running"].sort_values("start_time", kind="stable")
    objective, mode = ref.objectives[0]
    params = {c[len("param:") :]: df[c].tolist() for c in df.columns if c.startswith("param:")}
    series = {m: df[m].tolist() for m in ECE_SERIES if m in df}
    importances, why = param_importances(optuna_study)
    with drawing():  # unhinted text, the garbage collector paused (`calibtune.plots._render`)
        if objective in df:
            fig = P.plot_objective_history(df[objective].tolist(), objective, mode)
            save_png(fig, out / "objective.png")
        if series:
            save_png(P.plot_metric_vs_params(params, series), out / "ece_vs_params.png")
        if len(ref.objectives) > 1 and all(m in df for m, _ in ref.objectives):
            values = df[[m for m, _ in ref.objectives]].to_numpy(float)
            mask = pareto_mask(values, [d for _, d in ref.objectives])
            fig = P.plot_pareto(values, mask, [m for m, _ in ref.objectives])
            save_png(fig, out / "pareto.png")
        if importances:
            save_png(P.plot_importances(importances), out / "importances.png")
        else:
            notes.append(f"no importances: {why}")
    return notes


def param_importances(optuna_study: Any | None) -> tuple[Mapping[str, float], str]:
    """Optuna's parameter importances of the first objective over COMPLETE trials, or ``{}`` and
    why not (no persisted study, fewer than 2 finished trials, no parameter varies)."""
    if optuna_study is None:
        return {}, "no Optuna storage"
    complete = optuna_study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 2:
        return {}, f"{len(complete)} finished trial(s) in Optuna, 2 needed"
    try:
        target = (lambda t: t.values[0]) if len(optuna_study.directions) > 1 else None
        with warnings.catch_warnings():  # "few trials per regime": the figure says what it is
            warnings.simplefilter("ignore", UserWarning)
            imp = optuna.importance.get_param_importances(optuna_study, target=target)
    except (ValueError, RuntimeError) as exc:  # e.g. a single distinct value per parameter
        return {}, " ".join(str(exc).split())[:200]
    imp = {k: float(v) for k, v in imp.items() if math.isfinite(float(v))}
    return (imp, "") if imp else ({}, "no parameter varied across finished trials")


def refresh_summary(
    study: StudyConfig,
    uri: str,
    exp_id: str,
    parent_run_id: str,
    optuna_storage: str | None = None,
    ended: Sequence[tuple[str, dict[str, Any], dict[str, Any] | None, bool]] = (),
    figures: bool = True,
    tables: bool = True,
) -> str | None:
    """Record ``ended`` Tune trials in the Optuna storage (`persist_ended`, with their learning
    curves: `calibtune.record._curves`; both read only those trials), then, with ``tables``,
    `summarize_study` (which reads every trial run: the driver does it now and then,
    `calibtune.study._progress`; ``figures``: redraw the study figures; the end of
    `run`/`resume` always does both). For the driver: a summary that cannot be written (a store
    briefly unavailable) never stops the study; returns a one-line warning instead."""
    try:
        storage = rdb_storage(optuna_storage) if optuna_storage else None
        if storage is not None and ended:
            known = recorded_ids(open_optuna_study(study, storage))
            new = [e for e in ended if e[0] not in known]  # the end of a run passes them all
            metric, ids = study.search.objectives[0].metric, [e[0] for e in new]
            curves = objective_curves(uri, exp_id, parent_run_id, metric, ids) if ids else {}
            persist_ended(study, storage, new, curves)
        if not tables:
            return None
        # only the importances figure reads the Optuna study
        load = storage is not None and figures
        optuna_study = load_optuna_study(study.name, storage) if load else None
        summarize_study(study, uri, exp_id, parent_run_id, optuna_study, figures=figures)
    except Exception as exc:
        return f"[calibtune] warning: parent-run summary not updated ({type(exc).__name__}: " + (
            " ".join(str(exc).split())[:200] + ")"
        )
    return None


def rdb_storage(url: str) -> Any:
    """One Optuna `RDBStorage` per URL for the driver's refreshes, which open the study at every
    trial's end: from its URL (a new engine, the schema check) that took 25 ms of CPU, on an open
    storage 2.9 ms (bench/README.md, "Driver CPU per trial in a study"). A SQLite file replaced
    since (a study folder removed and run again in this process) gets a storage of its own: an
    engine's pooled connection would still point at the removed file."""
    identity = None
    if url.startswith("sqlite:///"):
        with contextlib.suppress(OSError):  # no file yet: Optuna creates it
            st = Path(url[len("sqlite:///") :]).stat()
            identity = (st.st_dev, st.st_ino)
    return _rdb_storage(url, identity)


@functools.lru_cache(maxsize=8)
def _rdb_storage(url: str, identity: tuple[int, int] | None) -> Any:
    with quiet_optuna():
        return optuna.storages.RDBStorage(url)


def load_optuna_study(name: str, storage: Any) -> Any | None:
    """The study's Optuna study from its RDB storage (a URL or an `RDBStorage`), or None when it
    has none yet."""
    try:
        with quiet_optuna():
            return optuna.load_study(study_name=name, storage=storage)
    except KeyError:  # no study of that name in the storage (yet)
        return None
