"""Uncertainty on the end-of-trial numbers: bootstrap CIs of the test metrics, selective
classification (AURC/AUGRC, risk–coverage curves), refinement NLL, and the compact per-sample
test predictions that ``calibtune report --baseline`` pairs across trials.

Called by `calibtune.training.evaluate_final` with every scored (split, method) pair's
probabilities; method ``""`` is the uncalibrated model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from calibtune import metrics as M
from calibtune.metrics import keys as K
from calibtune.posthoc import refinement_nll

__all__ = [
    "BOOTSTRAP_SEED",
    "Uncertainty",
    "prediction_name",
    "selective_metrics",
    "uncertainty_metrics",
]

#: resample indices are drawn with this seed in every trial: trials on the same test set resample
#: the same samples, so their CIs are comparable (and pairable)
BOOTSTRAP_SEED = 0
CURVE_POINTS = 201  # risk–coverage points kept in risk_coverage.json


@dataclass
class Uncertainty:
    metrics: dict[str, float] = field(default_factory=dict)
    curves: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # method -> curve
    predictions: dict[str, np.ndarray] = field(default_factory=dict)  # test_predictions.npz


def prediction_name(what: str, method: str = "") -> str:
    """Array name in ``test_predictions.npz``: ``conf``/``correct``, ``@<method>`` after one."""
    return f"{what}@{method}" if method else what


def _thin_curve(curve: Mapping[str, Tensor]) -> dict[str, list[float]]:
    n = curve["coverage"].numel()
    grid = torch.linspace(0, n - 1, min(n, CURVE_POINTS), device=curve["coverage"].device)
    idx = torch.unique(grid.round().long())
    return {k: v[idx].tolist() for k, v in curve.items()}


def selective_metrics(
    probs: Tensor, labels: Tensor, split: str, method: str = "", *, logits: Tensor | None = None
) -> dict:
    """``<split>/{aurc,augrc,refinement_nll}[@<method>]`` of probs (N, K) (`K.FINAL_ONLY_KEYS`;
    the refinement NLL refits TS on log p, which equals TS on the ``logits`` that gave ``probs``
    by softmax, used as they are when given: no log, no clamp)."""
    out = M.selective_report(probs, labels, validate_args=False)
    if logits is None:
        logits = torch.log(probs.double().clamp_min(torch.finfo(torch.float64).tiny))
    out["refinement_nll"] = refinement_nll(logits, labels, validate_args=False)
    return {K.key(split, m, method): v for m, v in out.items()}


def uncertainty_metrics(
    scored: Mapping[tuple[str, str], Tensor],
    labels: Mapping[str, Tensor],
    *,
    n_bins: int = 15,
    bootstrap: int = 0,
) -> Uncertainty:
    """For every (split, method) -> probs (N, K): ``<split>/{aurc,augrc,refinement_nll}[@m]``;
    for the test split also the risk–coverage curve, the top-label confidence and correctness
    (float64, bool) and, with ``bootstrap`` resamples, ``test/<m>[@method]_ci_{low,high}`` of
    `K.BOOTSTRAP_KEYS` (95% percentile intervals, the same indices for every method)."""
    out = Uncertainty()
    idx = None
    if bootstrap and "test" in labels:
        n = labels["test"].numel()
        idx = M.bootstrap_indices(n, bootstrap, BOOTSTRAP_SEED)
    for (split, method), probs in scored.items():
        y = labels[split]
        out.metrics.update(selective_metrics(probs, y, split, method))
        if split != "test":
            continue
        curve = M.risk_coverage(probs, y, validate_args=False)
        out.curves[method or "uncalibrated"] = _thin_curve(curve)
        conf, pred = probs.max(dim=1)
        out.predictions[prediction_name("conf", method)] = conf.double().cpu().numpy()
        out.predictions[prediction_name("correct", method)] = (pred == y).cpu().numpy()
        if idx is not None:
            values = M.bootstrap_values(
                probs=probs, labels=y, n_bins=n_bins, indices=idx, metrics=K.BOOTSTRAP_KEYS
            )
            for m, v in values.items():
                low, high = K.ci_keys(K.key(split, m, method))
                out.metrics[low], out.metrics[high] = M.percentile_ci(v)
    return out
