"""``calibtune report STUDY --baseline LOSS``: each loss (its best trial by the study objective)
against the baseline loss's best trial, after the same post-hoc method, with a paired bootstrap.

Every trial saves its test set's top-label confidence and correctness per method
(``test_predictions.npz``). For each metric m ∈ {ECE, AdaECE, error} and seed s present in both
trials, d_s(b) = m(loss, s, resample b) − m(baseline, s, resample b) on the *same* resampled
test indices (pairing removes the test-set noise the two share). With S paired seeds the seeds are
resampled too: resample b averages d over S seeds drawn with replacement, so the interval covers
test-sample and seed variation. The point estimate is the mean over seeds of the full-test-set
difference; the interval is the percentile interval of the B resampled means; a difference is
*resolved* when the interval excludes 0. Values are percentage points (loss − baseline: negative
means the loss is better for these lower-is-better metrics).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from calibtune.metrics import bootstrap_indices, bootstrap_top_label, percentile_ci
from calibtune.readers._results import StudyRef, trials_frame
from calibtune.record import PARENT, check_same_data, find_runs, mlflow_client
from calibtune.training import prediction_name

__all__ = ["PAIRED_METRICS", "paired_table"]

PAIRED_METRICS = ("ece", "adaece", "error")
PREDICTIONS = "test_predictions.npz"


def _best_runs(ref: StudyRef, trials: pd.DataFrame | None = None) -> dict[str, pd.Series]:
    """loss label -> its best finished trial by the study's first objective (``trials``: the
    study's `trials_frame` if already read, unfinished ones included or not)."""
    df = trials_frame(ref) if trials is None else trials[trials["status"] == "finished"]
    objective, mode = ref.objectives[0]
    if objective in df:
        df = df[df[objective].notna()].sort_values(objective, ascending=(mode == "min"))
    return {label: g.iloc[0] for label, g in df.groupby("loss_label", sort=False)}


def _seed_predictions(ref: StudyRef, trial: pd.Series) -> dict[str, dict[str, np.ndarray]]:
    """seed -> the arrays of ``test_predictions.npz`` of each seed run of ``trial`` (the trial
    run itself when the study has one seed)."""
    seed_runs = find_runs(
        ref.tracking_uri, ref.experiment_id, f"tags.`{PARENT}` = '{trial['run_id']}'"
    )
    runs = [(r.data.params.get("seed", str(i)), r.info.run_id) for i, r in enumerate(seed_runs)]
    runs = sorted(runs) or [("0", trial["run_id"])]
    client, out = mlflow_client(ref.tracking_uri), {}
    for seed, run_id in runs:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                local = client.download_artifacts(run_id, PREDICTIONS, tmp)
            except Exception:
                raise ValueError(
                    f"trial {trial['trial_id']}: expected a {PREDICTIONS} artifact (logged by "
                    "trials since the paired comparison exists), found none"
                ) from None
            with np.load(Path(local)) as z:
                out[seed] = {k: z[k] for k in z.files}
    return out


def _resampled(
    by_seed: Mapping[str, Mapping[str, np.ndarray]], indices: torch.Tensor, n_bins: int
) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
    """seed -> method -> {metric: (1 + B,)}: the full test set first, then every resample."""
    full = torch.cat([torch.arange(indices.shape[1])[None], indices])
    out: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for seed, preds in by_seed.items():
        methods = sorted(k.partition("@")[2] for k in preds if k.startswith("conf"))
        out[seed] = {}
        for method in methods:
            conf = torch.from_numpy(preds[prediction_name("conf", method)])
            correct = torch.from_numpy(preds[prediction_name("correct", method)])
            if correct.numel() != indices.shape[1]:
                raise ValueError(
                    f"--baseline: expected trials scored on the same {indices.shape[1]} test "
                    f"samples, got one with {correct.numel()}"
                )
            out[seed][method] = bootstrap_top_label(conf, correct, full, n_bins, PAIRED_METRICS)
    return out


def _paired_rows(
    label: str,
    runs: Mapping[str, Mapping[str, Mapping[str, torch.Tensor]]],
    base: Mapping[str, Mapping[str, Mapping[str, torch.Tensor]]],
    level: float,
) -> list[dict[str, Any]]:
    """Rows of one loss: seeds paired by value (in order when the two share none)."""
    common = sorted(set(runs) & set(base))
    pairs = [(s, s) for s in common] or list(zip(sorted(runs), sorted(base), strict=False))
    methods = sorted(set.intersection(*(set(runs[a]) & set(base[b]) for a, b in pairs)))
    n_boot = next(iter(next(iter(base.values())).values()))["ece"].numel() - 1
    pick = torch.randint(
        0, len(pairs), (n_boot, len(pairs)), generator=torch.Generator().manual_seed(1)
    )
    rows = []
    for method in methods:
        for m in PAIRED_METRICS:
            # (S, 1 + B) in percentage points
            d = 100 * torch.stack([runs[a][method][m] - base[b][method][m] for a, b in pairs])
            boot = d[:, 1:].gather(0, pick.T).mean(0) if len(pairs) > 1 else d[0, 1:]
            low, high = percentile_ci(boot, level)
            rows.append(
                {
                    "loss": label,
                    "method": method or "none",
                    "metric": m,
                    "diff": float(d[:, 0].mean()),
                    "ci_low": low,
                    "ci_high": high,
                    "seeds": len(pairs),
                    "resolved": "yes" if low > 0 or high < 0 else "no",
                }
            )
    return rows


def paired_table(
    ref: StudyRef,
    baseline: str,
    *,
    n_resamples: int = 1000,
    level: float = 0.95,
    n_bins: int = 15,
    trials: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per (loss ≠ baseline, post-hoc method, metric): the difference to the baseline in
    percentage points, its paired-bootstrap CI, the number of paired seeds and whether it is
    resolved. ``baseline``: a loss label of the study (else ValueError listing them).
    ``trials``: the study's `trials_frame` when the caller has read it (one MLflow query)."""
    best = _best_runs(ref, trials)
    if baseline not in best:
        raise ValueError(
            f"--baseline: expected one of the study's losses ({', '.join(sorted(best))}), "
            f"got {baseline!r}"
        )
    if len(best) < 2:
        raise ValueError(
            f"--baseline: expected a study with a loss besides {baseline!r}, got only that one"
        )
    for label, trial in best.items():  # a pairing needs the same test samples, seeds' data too
        check_same_data(label, trial, best[baseline])
    base = _seed_predictions(ref, best[baseline])
    n = len(next(iter(next(iter(base.values())).values())))
    indices = bootstrap_indices(n, n_resamples, seed=0)
    base_values = _resampled(base, indices, n_bins)
    rows: list[dict[str, Any]] = []
    for label, trial in best.items():
        if label != baseline:
            values = _resampled(_seed_predictions(ref, trial), indices, n_bins)
            rows += _paired_rows(label, values, base_values, level)
    return pd.DataFrame(rows)
