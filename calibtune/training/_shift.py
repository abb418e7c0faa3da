"""Calibration under dataset shift, on cached logits.

For every shift set (`calibtune.data.list_shift`), side (``shift``: corrupted test split;
``val_shift``: corrupted validation split) and severity, `SHIFT_METRICS` (error, ECE, AdaECE,
NLL) before and after each post-hoc method — the methods fitted on the clean validation logits,
never on shifted data — plus their mean over severities:

    shift/<set>/s<k>/<m>[@<method>]      val_shift/<set>/s<k>/<m>[@<method>]
    shift/<set>/<m>[@<method>] = (1/S) Σ_k shift/<set>/s<k>/<m>[@<method>]

`shift_logits` runs one inference pass per set, side and severity, reusing the OOD pass where
the test side is the same data (``digits_noise``, ``cifar10c`` Gaussian noise);
`shift_metrics` is pure (tensors in, numbers out). Ovadia et al., "Can you trust your model's
uncertainty? Evaluating predictive uncertainty under dataset shift", NeurIPS 2019.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from calibtune import data as D
from calibtune import metrics as M
from calibtune.metrics import keys as K
from calibtune.posthoc import build_posthoc

__all__ = ["UNCALIBRATED", "ShiftLogits", "epoch_val_shift", "shift_logits", "shift_metrics"]

#: the method name of the uncalibrated curve in the figure data
UNCALIBRATED = "uncalibrated"


@dataclass(frozen=True)
class ShiftLogits:
    """Logits ``(N, K)`` and labels ``(N,)`` of one shift set on one side at one severity."""

    side: str  # "shift" (test split) or "val_shift" (validation split), K.SHIFT_SPLITS
    name: str
    severity: int
    logits: Tensor
    labels: Tensor


def _scores(probs: Tensor, labels: Tensor, n_bins: int, log_p: Tensor | None) -> list[float]:
    """`K.SHIFT_METRICS` of one set; NLL from ``log_p`` (exact log-softmax) when given, as
    `calibtune.metrics.calibration_report` does for logits."""
    values = {
        "error": M.error(probs, labels, validate_args=False),
        "ece": M.ece(probs, labels, n_bins, validate_args=False),
        "adaece": M.adaece(probs, labels, n_bins, validate_args=False),
        "nll": (
            float(-log_p.gather(1, labels[:, None]).mean())
            if log_p is not None
            else M.nll(probs, labels, validate_args=False)
        ),
    }
    return [float(values[m]) for m in K.SHIFT_METRICS]


def shift_metrics(
    items: Iterable[ShiftLogits], methods: Mapping[str, Any], n_bins: int = 15
) -> tuple[dict[str, float], dict[str, Any]]:
    """Metrics of every item before and after each fitted method, and the figure data.

    ``methods``: name -> a post-hoc method already fitted on clean validation logits (anything
    with ``calibrate(logits) -> probs``). Returns ``(metrics, curves)``: ``metrics`` keyed by
    `K.shift_key` (per severity and the mean over the severities given), ``curves`` as
    ``{side: {set: {"severities": [k…], metric: {method or "uncalibrated": [value per k]}}}}``.
    """
    per: dict[tuple[str, str], dict[int, dict[str, list[float]]]] = defaultdict(dict)
    for it in items:
        log_p = torch.log_softmax(it.logits.double(), dim=1)
        rows = {UNCALIBRATED: _scores(log_p.exp(), it.labels, n_bins, log_p)}
        for name, method in methods.items():
            probs = torch.as_tensor(
                method.calibrate(it.logits), dtype=torch.float64, device=it.logits.device
            )
            rows[name] = _scores(probs, it.labels, n_bins, None)
        per[(it.side, it.name)][it.severity] = rows
    metrics: dict[str, float] = {}
    curves: dict[str, dict[str, Any]] = defaultdict(dict)
    for (side, name), by_sev in per.items():
        sevs = sorted(by_sev)
        curve: dict[str, Any] = {"severities": sevs}
        for i, m in enumerate(K.SHIFT_METRICS):
            curve[m] = {}
            for method in by_sev[sevs[0]]:
                values = [by_sev[s][method][i] for s in sevs]
                at = "" if method == UNCALIBRATED else method
                for s, v in zip(sevs, values, strict=True):
                    metrics[K.shift_key(side, name, m, at, s)] = v
                metrics[K.shift_key(side, name, m, at)] = float(np.mean(values))
                curve[m][method] = values
        curves[side][name] = curve
    return metrics, dict(curves)


def shift_logits(
    names: Sequence[str],
    splits: Any,
    infer: Callable[[Any], tuple[Tensor, Tensor]],
    *,
    root: Any = None,
    reuse: Iterable[Any] = (),
    sides: Sequence[str] = K.SHIFT_SPLITS,
) -> list[ShiftLogits]:
    """Logits of every side and severity of the shift sets ``names`` (`calibtune.data`).

    ``infer(dataset) -> (logits, labels)`` is the trial's one inference pass; ``reuse``: the
    trial's `OODLogits`, whose pass is taken instead of a second one where the test side is
    the OOD set's default corruption (``digits_noise/s3`` is ``shift/digits_noise/s3``);
    ``sides``: which of `K.SHIFT_SPLITS` to evaluate.
    """
    done = {o.key: o.logits for o in reuse}
    out = []
    for name in names:
        twin = D.ood_twin(name)
        for side, severities in D.shift_severities(name).items():
            for sev in severities if side in sides else ():
                ds = D.load_shift(name, side, sev, splits=splits, root=root)
                cached = done.get(K.ood_source(twin, sev)) if side == "shift" and twin else None
                if cached is not None:
                    logits, labels = cached, D.dataset_labels(ds)
                else:
                    logits, labels = infer(ds)
                out.append(ShiftLogits(side, name, sev, logits, labels))
    return out


def epoch_val_shift(
    names: Sequence[str],
    splits: Any,
    infer: Callable[[Any], tuple[Tensor, Tensor]],
    val_logits: Tensor,
    val_labels: Tensor,
    posthoc: Mapping[str, Mapping[str, Any]],
    n_bins: int = 15,
) -> dict[str, float]:
    """``val_shift/…`` of one epoch (``eval.epoch_shift``): the validation sides of ``names``,
    uncalibrated and after each ``posthoc`` method fitted on this epoch's clean validation
    logits — what a study selecting on a ``val_shift/`` key reads in every report. No test data
    is touched."""
    items = shift_logits(names, splits, infer, sides=("val_shift",))
    fitted = {
        n: build_posthoc(n, **dict(p)).fit(val_logits, val_labels) for n, p in posthoc.items()
    }
    return shift_metrics(items, fitted, n_bins)[0]
