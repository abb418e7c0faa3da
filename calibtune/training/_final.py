"""End-of-trial evaluation on cached logits: post-hoc calibration and OOD detection.

Every post-hoc method is fitted on *validation* logits only (tuning T on the test split is one of
the seed-code traps) and scored on the test logits; OOD AUROC/AUPR/FPR95 use entropy and MSP
scores of the test set (in-distribution, negative) vs each OOD set (positive), before and after
temperature scaling. Returns flat metrics plus JSON-ready artifact data for the plots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from calibtune import metrics as M
from calibtune.metrics import calibration_report, reliability_table
from calibtune.metrics import keys as K
from calibtune.posthoc import build_posthoc, fitted_values
from calibtune.training._shift import ShiftLogits, shift_metrics
from calibtune.training._uncertainty import selective_metrics, uncertainty_metrics

__all__ = ["FinalEvaluation", "OODLogits", "evaluate_final", "posthoc_val_metrics"]

OOD_SCORES = K.OOD_SCORES


@dataclass(frozen=True)
class OODLogits:
    """Logits of one OOD set (or one severity of it); ``key`` is e.g. ``svhn`` or ``noise/s5``."""

    key: str
    logits: Tensor


@dataclass
class FinalEvaluation:
    metrics: dict[str, float] = field(default_factory=dict)
    posthoc_params: dict[str, dict[str, float]] = field(default_factory=dict)
    reliability: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    roc: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    shift: dict[str, Any] = field(default_factory=dict)  # figure data of `shift_metrics`
    risk_coverage: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    predictions: dict[str, np.ndarray] = field(default_factory=dict)  # test conf/correct


def _table(probs: Tensor, labels: Tensor, n_bins: int) -> dict[str, list[float]]:
    t = reliability_table(probs, labels, n_bins=n_bins, binning="width")
    return {k: np.asarray(v, dtype=float).tolist() for k, v in t.items()}


def _report(
    probs: Tensor, labels: Tensor, n_bins: int, method: str, split: str = "test"
) -> dict[str, float]:
    rep = calibration_report(probs=probs, labels=labels, n_bins=n_bins)
    return {K.key(split, k, method): float(v) for k, v in rep.items() if np.isscalar(v)}


def _probs(method: Any, logits: Tensor) -> Tensor:
    # calibrate() may return a NumPy array (host) or a tensor (on the logits' device)
    return torch.as_tensor(method.calibrate(logits), dtype=torch.float64, device=logits.device)


def posthoc_val_metrics(
    val_logits: Tensor,
    val_labels: Tensor,
    posthoc: Mapping[str, Mapping[str, Any]],
    n_bins: int = 15,
    *,
    selective: bool = False,
) -> dict[str, float]:
    """``val/<m>@<method>``: each post-hoc method fitted on the validation logits and scored on
    them — the selection criterion of the seeds (e.g. T chosen by validation ECE). Test data is
    never touched, so studies may optimise these. ``selective``: also
    ``val/{aurc,augrc,refinement_nll}@<method>`` (`K.FINAL_ONLY_KEYS`)."""
    out: dict[str, float] = {}
    for name, params in posthoc.items():
        method = build_posthoc(name, **dict(params)).fit(val_logits, val_labels)
        probs = _probs(method, val_logits)
        out.update(_report(probs, val_labels, n_bins, name, "val"))
        if selective:
            out.update(selective_metrics(probs, val_labels, "val", name))
    return out


def evaluate_final(
    val_logits: Tensor,
    val_labels: Tensor,
    test_logits: Tensor,
    test_labels: Tensor,
    *,
    posthoc: Mapping[str, Mapping[str, Any]],
    ood: list[OODLogits] = (),  # type: ignore[assignment]
    shift: Sequence[ShiftLogits] = (),
    n_bins: int = 15,
    roc_points: int = 201,
    bootstrap: int = 0,
) -> FinalEvaluation:
    """Post-hoc methods fitted on validation, test metrics before/after, OOD before/after TS.

    Metric names: ``test/<m>`` (uncalibrated, from logits), ``test/<m>@<method>``,
    ``val/<m>@<method>`` (fitted and scored on validation: what a study may select on),
    ``posthoc/<method>/<param>`` (with ``T_at_edge`` where T was searched in a bounded range:
    `calibtune.posthoc.fitted_values`); ``ood/<key>/{auroc,aupr,fpr95}`` (entropy score),
    ``ood/<key>/{auroc,aupr,fpr95}_msp``, each also with ``@ts`` after temperature scaling;
    ``[val_]shift/<set>[/s<k>]/<m>[@<method>]`` for ``shift`` (`calibtune.training._shift`);
    ``{val,test}/{aurc,augrc,refinement_nll}[@<method>]`` and, with ``bootstrap`` resamples,
    ``test/<m>[@<method>]_ci_{low,high}`` (`calibtune.training._uncertainty`).
    """
    out = FinalEvaluation()
    test_probs = torch.softmax(test_logits.double(), dim=1)
    rep = M.calibration_report(logits=test_logits, labels=test_labels, n_bins=n_bins)
    out.metrics.update({K.key("test", k): float(v) for k, v in rep.items() if np.isscalar(v)})
    out.reliability["uncalibrated"] = _table(test_probs, test_labels, n_bins)

    calibrated: dict[str, Any] = {}
    scored = {("test", ""): test_probs, ("val", ""): torch.softmax(val_logits.double(), dim=1)}
    test_calibrated: dict[str, Tensor] = {"": test_probs}  # reused by the OOD scores
    for name, params in posthoc.items():
        method = build_posthoc(name, **dict(params)).fit(val_logits, val_labels)
        calibrated[name] = method
        test_calibrated[name] = _ood_probs(method, test_logits)
        probs = test_calibrated[name].to(torch.float64)
        out.metrics.update(_report(probs, test_labels, n_bins, name))
        scored[("test", name)], scored[("val", name)] = probs, _probs(method, val_logits)
        out.metrics.update(_report(scored[("val", name)], val_labels, n_bins, name, "val"))
        fitted = fitted_values(method)
        out.posthoc_params[name] = fitted
        out.metrics.update({K.posthoc_key(name, k): v for k, v in fitted.items()})
        out.reliability[name] = _table(probs, test_labels, n_bins)
    labels = {"test": test_labels, "val": val_labels}
    unc = uncertainty_metrics(scored, labels, n_bins=n_bins, bootstrap=bootstrap)
    out.metrics.update(unc.metrics)
    out.risk_coverage, out.predictions = unc.curves, unc.predictions

    if shift:
        shifted, out.shift = shift_metrics(shift, calibrated, n_bins)
        out.metrics.update(shifted)
    if ood:
        _ood_metrics(
            out, val_logits, val_labels, test_logits, ood, calibrated, roc_points, test_calibrated
        )
    return out


def _ood_metrics(
    out: FinalEvaluation,
    val_logits: Tensor,
    val_labels: Tensor,
    test_logits: Tensor,
    ood: list[OODLogits],
    calibrated: Mapping[str, Any],
    roc_points: int,
    test_probs: Mapping[str, Tensor] | None = None,
) -> None:
    """``ood/<source>/<measure>[_msp][@ts]`` and ROC points, before and after each of
    ``K.OOD_METHODS`` (temperature scaling, reused when ``posthoc`` already fitted it). The
    in-distribution probabilities of each method are computed once (``test_probs`` holds those
    `evaluate_final` already has, keyed like ``K.OOD_METHODS``, ``""`` = uncalibrated)."""
    fitted = {
        m: calibrated.get(m) or build_posthoc(m).fit(val_logits, val_labels)
        for m in K.OOD_METHODS
        if m
    }
    known = dict(test_probs or {})
    p_ins = {
        m: known[m] if m in known else _ood_probs(fitted.get(m), test_logits) for m in K.OOD_METHODS
    }
    measures = {"auroc": M.ood_auroc, "aupr": M.ood_aupr, "fpr95": M.fpr_at_95_tpr}
    for item in ood:
        for method_name in K.OOD_METHODS:
            p_in = p_ins[method_name]
            p_out = _ood_probs(fitted.get(method_name), item.logits)
            for score in OOD_SCORES:
                for measure in K.OOD_MEASURES:
                    name = K.ood_key(item.key, measure, score, method_name)
                    # softmax/calibrate outputs are valid probabilities by construction
                    out.metrics[name] = measures[measure](p_in, p_out, score, validate_args=False)
                fpr, tpr, _ = M.roc_curve_points(p_in, p_out, score, validate_args=False)
                suffix = f"@{method_name}" if method_name else ""
                out.roc[f"{item.key}/{score}{suffix}"] = _thin(fpr, tpr, roc_points)


def _ood_probs(method: Any, logits: Tensor) -> Tensor:
    """Softmax in float64 (``method`` None) or the fitted method's probabilities in its own
    dtype (float32 for float32 logits)."""
    if method is None:
        return torch.softmax(logits.double(), 1)
    return torch.as_tensor(method.calibrate(logits), device=logits.device)


def _thin(fpr: np.ndarray, tpr: np.ndarray, k: int) -> dict[str, list[float]]:
    """At most ``k`` ROC points (evenly spaced indices, ends kept) so artifacts stay small."""
    fpr, tpr = np.asarray(fpr, float), np.asarray(tpr, float)
    if len(fpr) > k:
        idx = np.unique(np.linspace(0, len(fpr) - 1, k).round().astype(int))
        fpr, tpr = fpr[idx], tpr[idx]
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist()}
