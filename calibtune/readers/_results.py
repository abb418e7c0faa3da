"""Reading a study back from MLflow: comparison tables, the papers' report table, export.

MLflow is the source of truth: a study's trials are the child runs of its parent run (found
through the study's state file, or by the ``calibtune.study`` tag). Metric names come back in
calibtune's form (``test/ece@ts``), params as logged (``loss``, ``loss.gamma``...).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from calibtune._provenance import LIBRARIES, installed_versions, provenance_comment
from calibtune.metrics import keys as K
from calibtune.record import (
    PARENT,
    TAG_ERROR,
    TAG_KIND,
    TAG_STATUS,
    TAG_T_GRID_ENDS,
    TAG_TRIAL,
    data_columns,
    find_run_values,
    find_runs,
    mlflow_client,
    mlflow_metric_name,
    resolve_tracking_uri,
)
from calibtune.studyfile import TAG_FEASIBLE, Constraint, StudyDir, StudyDirError, judge, load_study


def _engine() -> types.SimpleNamespace:
    """The trial engine and the post-hoc registry (``.trial``, ``.posthoc``), for the readers
    that rebuild a config or a method's T grid."""
    # deferred: torch; compare/report/export read a study without it
    from calibtune import posthoc, trial

    return types.SimpleNamespace(posthoc=posthoc, trial=trial)


class StudyNotFoundError(ValueError):
    """No such study in the storage directory or the tracking store."""


@dataclass(frozen=True)
class StudyRef:
    name: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    objectives: tuple[tuple[str, str], ...]  # (metric, mode)
    constraints: tuple[Constraint, ...] = ()  # search.constraints


def locate_study(
    study: str | Path, storage: str | Path | None = None, tracking_uri: str | None = None
) -> StudyRef:
    """Find a study by its YAML file, its storage directory (a path or URI), or its name."""
    study = getattr(study, "uri", study)  # a `Storage` (e.g. `StudyOutcome.storage`)
    p = Path(study)
    try:
        if p.is_file() and p.suffix in (".yaml", ".yml"):
            cfg = load_study(p)
            sd = StudyDir.find(cfg.name, storage or cfg.storage)
        else:
            sd = StudyDir.find(study, storage)
    except StudyDirError as exc:
        raise StudyNotFoundError(str(exc)) from None
    state = sd.read_state()
    name, objectives, constraints = sd.read_head()  # read_study() would import torch
    return StudyRef(
        name,
        resolve_tracking_uri(tracking_uri) if tracking_uri else state.tracking_uri,
        state.experiment_id,
        state.parent_run_id,
        tuple((o.metric, o.mode) for o in objectives),
        constraints,
    )


def trials_frame(ref: StudyRef, include_unfinished: bool = False) -> pd.DataFrame:
    """One row per trial (child run): ids, status, loss, params and final metrics."""
    tags = {PARENT: ref.parent_run_id, TAG_KIND: "trial"}
    runs = find_run_values(ref.tracking_uri, ref.experiment_id, tags)
    rows = []
    for r in runs:
        status = r.tags.get(TAG_STATUS, "unknown")
        if not include_unfinished and status != "finished":
            continue
        row: dict[str, Any] = {
            "trial_id": r.tags.get(TAG_TRIAL),
            "run_id": r.run_id,
            "status": status,
            "reason": r.tags.get(TAG_ERROR, ""),
            "start_time": r.start_time,  # ms since the epoch (trial order)
            "run_name": r.run_name,
            "tag:feasible": r.tags.get(TAG_FEASIBLE, ""),
        }
        for k, v in r.params.items():
            row[k if k in ("loss", "loss_label") else f"param:{k}"] = _parse_param(v)
        for k, v in r.metrics.items():
            row[K.from_mlflow(k)] = v
        row.update(data_columns(r))  # data lineage: `data:<context>`
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    lead = ["trial_id", "loss_label", "loss", "status", "reason", "run_id", "start_time"]
    lead += ["run_name", "tag:feasible"]
    params = sorted(c for c in df.columns if c.startswith("param:"))
    metrics = sorted(c for c in df.columns if c not in lead and c not in params)
    return df[[c for c in lead if c in df.columns] + params + metrics]


def _finished(trials: pd.DataFrame) -> pd.DataFrame:
    """The finished rows of a `trials_frame` that includes unfinished trials."""
    return trials if trials.empty else trials[trials["status"] == "finished"]


def feasibility(constraints: Sequence[Constraint], df: pd.DataFrame) -> pd.Series:
    """Whether each finished trial of `trials_frame` meets every constraint (None for trials
    that did not finish), relative bounds from all finished trials (`_constraints.judge`)."""
    done = df["status"] == "finished"
    rows = [(r.get("loss_label"), r) for _, r in df[done].iterrows()]
    out = pd.Series(None, index=df.index, dtype=object)
    out[done] = judge(constraints, rows)
    return out


INFEASIBLE = " [infeasible]"  # run-name suffix of a trial that misses a constraint


def mark_feasibility(
    constraints: Sequence[Constraint], tracking_uri: str, experiment_id: str, parent_run_id: str
) -> None:
    """Tag every finished trial run ``calibtune.feasible = yes|no`` and suffix the names of
    infeasible ones with `INFEASIBLE`, as judged now (relative bounds move as baseline trials
    finish, so the driver calls this each time a trial ends); only changed runs are written."""
    if not constraints:
        return
    ref = StudyRef("", tracking_uri, experiment_id, parent_run_id, (), tuple(constraints))
    df = trials_frame(ref)
    if df.empty:
        return
    client = mlflow_client(tracking_uri)
    for run_id, ok, name, tag in zip(
        df["run_id"], feasibility(constraints, df), df["run_name"], df["tag:feasible"], strict=True
    ):
        base = name.removesuffix(INFEASIBLE)
        want = "yes" if ok else "no"
        if tag != want:
            client.set_tag(run_id, TAG_FEASIBLE, want)
        if name != (new := base if ok else base + INFEASIBLE):
            client.set_tag(run_id, "mlflow.runName", new)


def _parse_param(v: str) -> Any:
    try:
        return json.loads(v)
    except (ValueError, TypeError):
        return v


def pareto_mask(values: Any, modes: Sequence[str]) -> Any:
    """Boolean mask (n,) of the rows of ``values`` (n, m) that no other row dominates
    (at least as good in every objective, strictly better in one); NaN rows are never optimal."""
    v = np.asarray(values, dtype=float).copy()
    for j, mode in enumerate(modes):
        if mode == "max":
            v[:, j] = -v[:, j]  # minimise everything
    ok = ~np.isnan(v).any(1)
    le = (v[:, None, :] <= v[None, :, :]).all(2)  # le[i, k]: i at least as good as k
    lt = (v[:, None, :] < v[None, :, :]).any(2)
    dominated = ((le & lt) & ok[:, None]).any(0)
    return ok & ~dominated


def compare_table(
    ref: StudyRef,
    metrics: Sequence[str] | None = None,
    sort: str | None = None,
    *,
    trials: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Every ended trial with its status, params and the chosen metrics, sorted by ``sort``
    (default: the first objective, best first); failed and stopped trials are listed too (their
    missing metrics last), with the failure's reason. ``trials``: the study's
    ``trials_frame(ref, include_unfinished=True)`` when the caller has read it already (one
    MLflow query per command)."""
    df = trials_frame(ref, include_unfinished=True) if trials is None else trials
    if df.empty:
        return df
    df = df[df["status"] != "running"]
    objective, mode = ref.objectives[0]
    if metrics is None:  # the objectives, constrained metrics, the usual logged columns
        usual = [c.metric for c in ref.constraints] + ["val/ece", "test/error", "test/ece"]
        metrics = [m for m, _ in ref.objectives]
        metrics += [m for m in dict.fromkeys([*usual, "test/ece@ts"]) if m not in metrics]
        metrics = [m for m in metrics if m in dict(ref.objectives) or m in df.columns]
    missing = [m for m in metrics if m not in df.columns]
    known = sorted(c for c in df.columns if "/" in c)
    if missing and (df["status"] == "finished").any():
        raise ValueError(
            f"--metrics: expected metrics the trials logged (e.g. {', '.join(known[:8])}), "
            f"got {', '.join(missing)}"
        )
    df = df.assign(**{m: float("nan") for m in missing})
    params = [c for c in df.columns if c.startswith("param:")]
    reason = ["reason"] if (df["reason"] != "").any() else []
    out = df[["trial_id", "loss_label", "status", *params, *metrics, *reason]]
    if ref.constraints:  # met every search.constraints (judged now); empty if not finished
        out = out.copy()
        out.insert(3, "feasible", feasibility(ref.constraints, df))
    key = sort or objective
    if key not in out.columns:
        if sort is None:  # the objective was not asked for (or no trial logged it): ended order
            return out.reset_index(drop=True)
        raise ValueError(f"--sort: expected one of the table's columns, got {key!r}")
    if len(ref.objectives) > 1:  # multi-objective: mark the Pareto front
        out = out.copy()
        out.insert(
            3,
            "pareto",
            pareto_mask(df[[m for m, _ in ref.objectives]], [d for _, d in ref.objectives]),
        )
    ascending = True if key != objective else mode == "min"
    return out.sort_values(key, ascending=ascending, kind="stable").reset_index(drop=True)


def best_trials(
    ref: StudyRef,
    metric: str | None = None,
    top: int = 1,
    *,
    trials: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The ``top`` finished trials by a validation metric (default: the study's objective);
    ``trials`` as in `compare_table`."""
    df = trials_frame(ref) if trials is None else _finished(trials)
    objective, mode = ref.objectives[0]
    metric = metric or objective
    if not K.is_selectable(metric):
        raise ValueError(
            "--metric: expected a validation metric (val/...; never select on test data), "
            f"got {metric!r}"
        )
    if df.empty or metric not in df.columns or df[metric].isna().all():
        raise ValueError(f"--metric: expected a metric the finished trials logged, got {metric!r}")
    if metric != objective:
        try:
            mode = K.direction(metric)
        except ValueError:
            raise ValueError(
                f"--metric: expected a metric with a direction (e.g. val/ece), got {metric!r}"
            ) from None
    if ref.constraints:  # judged among all finished trials (the baseline's best included)
        df = df[feasibility(ref.constraints, df).astype(bool)]
        if df[metric].notna().sum() == 0:
            rules = "; ".join(str(c) for c in ref.constraints)
            raise ValueError(
                f"search.constraints: expected a finished trial that meets them ({rules}), "
                "got none: nothing to export"
            )
    df = df[df[metric].notna()]
    return df.sort_values(metric, ascending=(mode == "min"), kind="stable").head(top)


REPORT_COLUMNS = [
    ("Error", "test/error", None),
    ("ECE", "test/ece", "test/ece@ts"),
    ("AdaECE", "test/adaece", "test/adaece@ts"),
    ("Classwise ECE", "test/classwise_ece", "test/classwise_ece@ts"),
]


def _pct(v: Any) -> float:
    return float("nan") if v is None or (isinstance(v, float) and math.isnan(v)) else 100 * float(v)


def report_table(
    ref: StudyRef,
    *,
    trials: pd.DataFrame | None = None,
    grids: dict[str, tuple[float, float]] | None = None,
) -> pd.DataFrame:
    """The seeds' table: per loss (its best trial by the objective) test error, ECE, AdaECE and
    classwise ECE before and after temperature scaling (optimal T in brackets), after focal
    temperature scaling, and OOD AUROC; values in %. A fitted T at either end of its grid is
    marked ``⚠`` (a bound, not a fitted value: read no confidence from it); ``grids`` maps a
    post-hoc method to its grid's (first, last) T, by default `t_grid_ends` of the study. Failed
    trials are counted per loss with the first reason; a loss whose trials all failed gets a
    row with its reason only. ``trials`` as in `compare_table`."""
    df = trials_frame(ref, include_unfinished=True) if trials is None else trials
    if df.empty:
        return df
    ends = t_grid_ends(ref) if grids is None else grids
    objective, mode = ref.objectives[0]
    rows = []
    for label, group in df.groupby("loss_label", sort=False):
        done = group[group["status"] == "finished"]
        if objective in done:
            done = done[done[objective].notna()]
        failed = group[group["status"] == "failed"]
        row: dict[str, Any] = {"loss": label}
        if objective in done:
            done = done.sort_values(objective, ascending=(mode == "min"), kind="stable")
        if not done.empty:
            row.update(_report_row(done.iloc[0], ends))
        if len(failed):
            row["failed"] = len(failed)
            row["failure"] = failed["reason"].iloc[0]
        rows.append(row)
    return pd.DataFrame(rows)


def t_grid_ends(ref: StudyRef) -> dict[str, tuple[float, float]]:
    """(first, last) T of the grid each post-hoc method of the study fits T on, by method name,
    read from the study file its parent run holds (the ``study/`` artifact, validated as a trial
    section); {} when the run holds no readable study file (then no T is marked)."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(ref.tracking_uri)
    try:
        recorded = client.get_run(ref.parent_run_id).data.tags.get(TAG_T_GRID_ENDS)
        if recorded:  # written when the study started: read without torch
            return {k: (float(a), float(b)) for k, (a, b) in json.loads(recorded).items()}
        files = [f.path for f in client.list_artifacts(ref.parent_run_id, "study")]
        with tempfile.TemporaryDirectory() as tmp:
            for name in files:
                if not name.endswith((".yaml", ".yml")):
                    continue
                raw = yaml.safe_load(
                    Path(client.download_artifacts(ref.parent_run_id, name, tmp)).read_text()
                )
                if isinstance(raw, dict) and "losses" in raw:  # the study, not a loss space
                    config_from_dict = _engine().trial.config_from_dict

                    trial = {**dict(raw.get("trial") or {}), "loss": {"name": "cross_entropy"}}
                    return grid_ends(config_from_dict(trial).eval.posthoc)
    except (MlflowException, OSError, ValueError, yaml.YAMLError):
        pass
    return {}


def grid_ends(posthoc: Any) -> dict[str, tuple[float, float]]:
    """(lowest, highest) T each post-hoc method of a trial's ``eval.posthoc`` can choose
    (`calibtune.posthoc.t_range`: a grid's ends, the continuous NLL search's bounds).

    >>> grid_ends({"ts": {"criterion": "ece"}, "focal_ts": {}, "spline": {}})
    {'ts': (0.1, 10.0), 'focal_ts': (0.01, 5.0)}
    """
    build_posthoc, t_range = _engine().posthoc.build_posthoc, _engine().posthoc.t_range

    out = {}
    for name, params in posthoc.items():
        ends = t_range(build_posthoc(name, **dict(params or {})))
        if ends is not None:
            out[name] = ends
    return out


def _edge_mark(
    method: str, t: Any, ends: dict[str, tuple[float, float]], row: pd.Series | None = None
) -> str:
    """The mark "⚠" when the fitted ``t`` of ``method`` is at an end of its search range, else "".

    The trial's own ``posthoc/<method>/T_at_edge`` decides where it was logged (a multi-seed
    trial logs the share of its seeds at an edge: any share > 0 is marked); runs from before
    that metric fall back to comparing ``t`` with ``ends`` (the study's ``t_grid_ends`` tag)."""
    flag = None if row is None else row.get(K.posthoc_key(method, K.T_AT_EDGE))
    if flag is not None and not _missing(flag):
        return "⚠" if float(flag) > 0 else ""
    if method not in ends or _missing(t):
        return ""
    return "⚠" if any(math.isclose(float(t), e, rel_tol=1e-9) for e in ends[method]) else ""


def _report_row(
    best: pd.Series, ends: dict[str, tuple[float, float]] | None = None
) -> dict[str, Any]:
    row: dict[str, Any] = {}
    ends = ends or {}
    t = best.get("posthoc/ts/T")
    for title, pre, post in REPORT_COLUMNS:
        row[title] = _pct(best.get(pre))
        if post:
            val = _pct(best.get(post))
            row[f"{title} (TS)"] = (
                f"{val:.2f} ({t:.1f}{_edge_mark('ts', t, ends, best)})"
                if isinstance(t, float) and not math.isnan(t)
                else f"{val:.2f}"
            )
    row["ECE (focal TS)"] = _pct(best.get(K.key("test", "ece", "focal_ts")))
    row["NLL"] = _num(best.get(K.key("test", "nll")))
    for method in _methods(best):  # equal-mass ECE and NLL after every other method
        key = next((k for k in best.index if k.startswith(f"posthoc/{method}/")), None)
        param = None if key is None else best[key]
        mark = _edge_mark(method, param, ends, best) if key and key.endswith("/T") else ""
        shown = "" if param is None or _missing(param) else f" ({param:.2f}{mark})"
        ada = _pct(best.get(K.key("test", "adaece", method)))
        row[f"AdaECE ({method})"] = f"{ada:.2f}{shown}"
        row[f"NLL ({method})"] = _num(best.get(K.key("test", "nll", method)))
    for col in sorted(best.index):
        k = _key(col)
        if k and k.split == "ood" and k.name == "auroc" and not k.method and not k.stat:
            row[f"AUROC {K.ood_source(k.ood, k.severity)}"] = _pct(best.get(col))
    row["trial"] = best["trial_id"]
    return row


def _key(col: str) -> K.MetricKey | None:
    """`K.parse`, None for a column that is no metric key."""
    try:
        return K.parse(col)
    except ValueError:
        return None


def _num(v: Any) -> float:
    return float("nan") if _missing(v) else float(v)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _methods(best: pd.Series) -> list[str]:
    """Post-hoc methods the trial was scored after, besides TS (which has its own columns)."""
    found = {k.method for c in best.index if (k := _key(c)) and k.split == "test" and k.method}
    return sorted(found - {"ts"})


def format_table(df: pd.DataFrame, fmt: str) -> str:
    if fmt == "csv":
        return df.to_csv(index=False)
    if fmt == "markdown":
        return _markdown(df)
    raise ValueError(f"--format: expected csv or markdown, got {fmt!r}")


def _markdown(df: pd.DataFrame) -> str:
    """A GitHub markdown table (no `tabulate` dependency)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.4g}"
        return str(v)

    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(cell(r[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def export_best(
    ref: StudyRef,
    out_dir: str | Path,
    top: int = 1,
    metric: str | None = None,
    *,
    trials: pd.DataFrame | None = None,
) -> list[Path]:
    """Write the best trials' configs as trial-config YAML files that ``calibtune train`` re-runs.

    The trial's own logged ``config.yaml`` is used (the exact resolved config), with its run name
    and storage reset so that re-training starts fresh instead of resuming the study's trial.
    ``trials`` as in `compare_table`.
    """
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    best = best_trials(ref, metric, top, trials=trials)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    client = mlflow_client(ref.tracking_uri)
    parent_tags = client.get_run(ref.parent_run_id).data.tags
    written = []
    rules = "; ".join(str(c) for c in ref.constraints)
    feasible_note = f" among the trials that meet {rules}" if rules else ""
    for rank, (_, row) in enumerate(best.iterrows(), start=1):
        run_id = row["run_id"]
        cfg = _logged_config(client, ref, row)
        name = f"{ref.name}-{row['loss_label']}-top{rank}"
        cfg["name"] = name
        cfg.pop("storage_path", None)
        target = out / f"{name}.yaml"
        header = (
            f"# exported by `calibtune export` from study {ref.name!r}, trial {row['trial_id']} "
            f"(MLflow run {run_id}), rank {rank} by {metric or ref.objectives[0][0]}"
            f"{feasible_note}\n"
        )
        prov = _provenance(ref, row, metric or ref.objectives[0][0], target, parent_tags)
        tmp_target = target.with_suffix(".yaml.tmp")
        tmp_target.write_text(
            header + provenance_comment(prov) + yaml.safe_dump(cfg, sort_keys=False)
        )
        shutil.move(str(tmp_target), target)
        written.append(target)
    return written


def _logged_config(client: Any, ref: StudyRef, row: pd.Series) -> dict[str, Any]:
    """The trial's logged ``config.yaml`` (its first seed run's when the study has seeds)."""
    from mlflow.artifacts import download_artifacts

    seed_runs = find_runs(
        ref.tracking_uri, ref.experiment_id, f"tags.`{PARENT}` = '{row['run_id']}'"
    )
    source = (
        min(seed_runs, key=lambda r: r.info.start_time)
        if seed_runs
        else client.get_run(row["run_id"])
    )
    with tempfile.TemporaryDirectory() as tmp:
        try:
            # by the run's artifact URI: `client.download_artifacts(run_id, ...)` would look the
            # run up twice more and search it for logged models
            local = download_artifacts(
                f"{source.info.artifact_uri}/config.yaml",
                dst_path=tmp,
                tracking_uri=ref.tracking_uri,
            )
        except Exception as exc:
            raise ValueError(
                f"trial {row['trial_id']}: expected a logged config.yaml artifact, "
                f"found none ({' '.join(str(exc).split())[:400]})"
            ) from None
        return yaml.safe_load(Path(local).read_text())


def _provenance(
    ref: StudyRef, row: pd.Series, metric: str, target: Path, parent_tags: dict[str, str]
) -> dict[str, Any]:
    """What produced an exported trial: the versions and git SHA the study recorded on its parent
    run (installed ones where it recorded none), its source and objective, how to re-run it."""
    # imports torch and Ray only for a version the study did not record
    installed = installed_versions([k for k in LIBRARIES if f"version.{k}" not in parent_tags])
    return {
        "git_sha": parent_tags.get("calibtune.git_sha", "unknown"),
        **{k: installed.get(k) or parent_tags[f"version.{k}"] for k in LIBRARIES},
        "study": ref.name,
        "trial": str(row["trial_id"]),
        "mlflow_run": str(row["run_id"]),
        "tracking_uri": ref.tracking_uri,
        "objective": {"metric": metric, "value": float(row[metric])},
        "rerun": f"calibtune train {target}",
    }


__all__ = [
    "StudyNotFoundError",
    "StudyRef",
    "best_trials",
    "compare_table",
    "export_best",
    "feasibility",
    "format_table",
    "locate_study",
    "mark_feasibility",
    "mlflow_metric_name",
    "report_table",
    "trials_frame",
]
