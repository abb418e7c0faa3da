"""Learning curves for optuna-dashboard: a trial's per-epoch objective, read back from its MLflow
child run, becomes the intermediate values of its Optuna trial (what ``trial.report(value,
step=epoch)`` would have stored).

The trials report to Tune, not to an Optuna trial (Ray's OptunaSearch keeps its own in-memory
study), so the persisted Optuna trial is written once, when the Tune trial ends
(`calibtune.record._optuna.record_trial`); its curve comes from MLflow, where every epoch is logged
exactly once across restores (`calibtune.record._tracking.MlflowTrialCallback`). A curve is a
mapping ``epoch -> value``: an epoch appears once however often the trial was resumed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from calibtune.metrics import keys as K
from calibtune.record._tracking import PARENT, TAG_KIND, TAG_TRIAL, _client, find_runs

__all__ = ["curve", "objective_curves"]


def curve(history: Iterable[Any]) -> dict[int, float]:
    """An MLflow metric history (objects with ``step`` and ``value``) as ``{epoch: value}``:
    one value per step (the last logged), non-finite values left out (Optuna refuses NaN
    intermediate values in some storages and the dashboard cannot draw them).

    >>> from types import SimpleNamespace as M
    >>> curve([M(step=1, value=0.3), M(step=0, value=0.5), M(step=1, value=0.2)])
    {0: 0.5, 1: 0.2}
    >>> curve([M(step=0, value=float("nan"))])
    {}
    """
    out: dict[int, float] = {}
    for m in history:
        out[int(m.step)] = float(m.value)
    return {s: v for s, v in sorted(out.items()) if math.isfinite(v)}


def objective_curves(
    uri: str, exp_id: str, parent_run_id: str, metric: str, trial_ids: Iterable[str]
) -> dict[str, dict[int, float]]:
    """``{Tune trial id: curve of metric}`` for the child runs of ``parent_run_id`` among
    ``trial_ids`` (a trial without a run or without the metric is absent). A trial trained on
    several seeds logs its epochs in its seed runs: its curve is their mean, per epoch that
    every seed reached (`mean_curve`). Only those trials' runs are read (one search per trial
    and per trial's seeds): the driver calls this for the trials that just ended, at a cost
    that does not grow with the runs the study already has."""
    client, name = _client(uri), K.to_mlflow(metric)
    out: dict[str, dict[int, float]] = {}
    for trial_id in dict.fromkeys(trial_ids):
        query = f"tags.`{PARENT}` = '{parent_run_id}' and tags.`{TAG_TRIAL}` = '{trial_id}'"
        runs = [r for r in find_runs(uri, exp_id, query) if r.data.tags.get(TAG_KIND) != "seed"]
        for run in runs[:1]:
            seeds = find_runs(
                uri, exp_id, f"tags.`{TAG_KIND}` = 'seed' and tags.`{PARENT}` = '{run.info.run_id}'"
            )
            ids = [r.info.run_id for r in seeds] or [run.info.run_id]
            values = mean_curve([curve(client.get_metric_history(i, name)) for i in ids])
            if values:
                out[trial_id] = values
    return out


def mean_curve(curves: list[dict[int, float]]) -> dict[int, float]:
    """The per-epoch mean of several seeds' curves, over the epochs all of them have.

    >>> mean_curve([{0: 0.5, 1: 0.3}, {0: 0.3}])
    {0: 0.4}
    """
    common = set.intersection(*(set(c) for c in curves)) if curves else set()
    return {s: sum(c[s] for c in curves) / len(curves) for s in sorted(common)}
