"""Out-of-distribution detection scores and threshold-free detection metrics.

OOD is the positive class throughout; every score returned by `ood_score` is oriented so that
higher means "more out-of-distribution":

* ``entropy``: −Σ_k p_k log p_k (Mukhoti et al. 2020 use softmax entropy for CIFAR-10 → SVHN /
  CIFAR-10-C);
* ``msp``: the negated maximum softmax probability (Hendrycks & Gimpel 2017);
* ``energy``: E(x) = −logsumexp_k z_k from logits (Liu et al. 2020).

The metrics are vectorised rank statistics that equal scikit-learn's ``roc_auc_score``,
``average_precision_score`` and ``roc_curve`` (with ``drop_intermediate=False``) on the same scores.
Every function checks its inputs unless ``validate_args=False`` (for arrays already checked, e.g.
the same calibrated probabilities scored by several measures).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from .validation import ArrayLike, as_tensor, scores_matrix

_F64 = torch.float64
SCORES = ("entropy", "msp", "energy")
T = TypeVar("T")


def entropy(probs: ArrayLike, *, validate_args: bool = True) -> torch.Tensor:
    """Softmax entropy H(p) = −Σ_k p_k log p_k per row (N,), with 0·log 0 = 0; higher = more OOD."""
    p = scores_matrix(probs, "probs", validate_args=validate_args)
    return -torch.special.xlogy(p, p).sum(1)


def msp(probs: ArrayLike, *, validate_args: bool = True) -> torch.Tensor:
    """Maximum softmax probability max_k p_k per row (N,); *lower* = more OOD."""
    return scores_matrix(probs, "probs", validate_args=validate_args).max(1).values


def energy(logits: ArrayLike, *, validate_args: bool = True) -> torch.Tensor:
    """Energy score E(z) = −logsumexp_k z_k per row (N,) at temperature 1; higher = more OOD."""
    return -torch.logsumexp(scores_matrix(logits, "logits", validate_args=validate_args), dim=1)


def ood_score(
    probs: ArrayLike | None = None,
    logits: ArrayLike | None = None,
    score: str = "entropy",
    *,
    validate_args: bool = True,
) -> torch.Tensor:
    """OOD score (N,) oriented so that higher = more OOD; ``energy`` needs ``logits``.

    >>> ood_score([[0.5, 0.5], [1.0, 0.0]], score="msp").tolist()
    [-0.5, -1.0]
    """
    v = validate_args
    if v and score not in SCORES:
        raise ValueError(f"score: expected one of {', '.join(SCORES)}, got {score!r}")
    if score == "energy":
        if logits is None:
            raise ValueError("score 'energy': expected logits=, got probs only")
        return energy(logits, validate_args=v)
    if probs is None:
        if logits is None:
            raise ValueError(f"score {score!r}: expected probs= or logits=, got neither")
        probs = torch.softmax(scores_matrix(logits, "logits", validate_args=v).to(_F64), dim=1)
        v = False  # a softmax of checked logits
    return entropy(probs, validate_args=v) if score == "entropy" else -msp(probs, validate_args=v)


def _scores_1d(x: ArrayLike, name: str, validate_args: bool = True) -> torch.Tensor:
    t = as_tensor(x, name)
    if not validate_args:
        return t.to(_F64)
    if t.ndim != 1 or t.numel() == 0:
        raise ValueError(
            f"{name}: expected a non-empty 1-D array of scores, got shape {tuple(t.shape)}"
        )
    t = t.to(_F64)
    if not torch.isfinite(t).all():
        raise ValueError(f"{name}: expected finite scores, got NaN/inf")
    return t


def _curve(in_scores: torch.Tensor, out_scores: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Cumulative (fps, tps) at each distinct threshold, descending, and the thresholds."""
    s = torch.cat([out_scores, in_scores.to(out_scores.device)])
    pos = torch.cat(
        [
            torch.ones_like(out_scores, dtype=_F64),
            torch.zeros(in_scores.numel(), dtype=_F64, device=s.device),
        ]
    )
    order = torch.sort(s, descending=True, stable=True).indices
    s, pos = s[order], pos[order]
    tps = torch.cumsum(pos, 0)
    fps = torch.arange(1, s.numel() + 1, dtype=_F64, device=s.device) - tps
    last = torch.ones_like(s, dtype=torch.bool)
    last[:-1] = s[1:] != s[:-1]  # keep the last index of each run of equal scores
    return fps[last], tps[last], s[last]


def roc_from_scores(
    in_scores: ArrayLike, out_scores: ArrayLike, *, validate_args: bool = True
) -> tuple[np.ndarray, ...]:
    """ROC points (fpr, tpr, thresholds) with OOD (``out_scores``) positive; starts at (0, 0)."""
    i = _scores_1d(in_scores, "in_scores", validate_args)
    o = _scores_1d(out_scores, "out_scores", validate_args)
    fps, tps, thr = _curve(i, o)
    z = torch.zeros(1, dtype=_F64, device=fps.device)
    fpr = torch.cat([z, fps]) / i.numel()
    tpr = torch.cat([z, tps]) / o.numel()
    thr = torch.cat([torch.full_like(z, float("inf")), thr])
    return fpr.cpu().numpy(), tpr.cpu().numpy(), thr.cpu().numpy()


def auroc_from_scores(
    in_scores: ArrayLike, out_scores: ArrayLike, *, validate_args: bool = True
) -> float:
    """Area under the ROC curve (trapezoidal, ties handled as sklearn does)."""
    fpr, tpr, _ = roc_from_scores(in_scores, out_scores, validate_args=validate_args)
    return float(np.trapezoid(tpr, fpr))


def aupr_from_scores(
    in_scores: ArrayLike, out_scores: ArrayLike, *, validate_args: bool = True
) -> float:
    """Average precision AP = Σ_n (R_n − R_{n−1}) P_n over descending thresholds (OOD positive)."""
    i = _scores_1d(in_scores, "in_scores", validate_args)
    o = _scores_1d(out_scores, "out_scores", validate_args)
    fps, tps, _ = _curve(i, o)
    precision = tps / (tps + fps)
    recall = tps / o.numel()
    d_recall = torch.diff(recall, prepend=torch.zeros(1, dtype=_F64, device=recall.device))
    return float((d_recall * precision).sum())


def fpr95_from_scores(
    in_scores: ArrayLike, out_scores: ArrayLike, *, validate_args: bool = True
) -> float:
    """FPR at the first ROC point (descending threshold) whose TPR reaches 0.95."""
    fpr, tpr, _ = roc_from_scores(in_scores, out_scores, validate_args=validate_args)
    return float(fpr[np.searchsorted(tpr, 0.95, side="left")])


def _on_probs(from_scores: Callable[..., T], name: str, doc: str) -> Callable[..., T]:
    """``from_scores`` lifted from two score vectors to two sets of probabilities (or logits):
    both sets are scored by `ood_score` (``score``, default ``entropy``) first. Shapes: in
    (N_in, K), out (N_out, K)."""

    def measure(
        in_probs: ArrayLike | None = None,
        out_probs: ArrayLike | None = None,
        score: str = "entropy",
        *,
        in_logits: ArrayLike | None = None,
        out_logits: ArrayLike | None = None,
        validate_args: bool = True,
    ) -> T:
        i = ood_score(in_probs, in_logits, score, validate_args=validate_args)
        o = ood_score(out_probs, out_logits, score, validate_args=validate_args)
        return from_scores(i, o, validate_args=validate_args)

    measure.__name__ = measure.__qualname__ = name
    measure.__doc__ = doc
    return measure


ood_auroc = _on_probs(
    auroc_from_scores,
    "ood_auroc",
    """AUROC of separating OOD (positive) from in-distribution samples by ``score``.

    Equals ``sklearn.metrics.roc_auc_score(1{OOD}, scores)``. Shapes: (N_in, K), (N_out, K).
    """,
)
ood_aupr = _on_probs(
    aupr_from_scores,
    "ood_aupr",
    """Average precision with OOD positive (AUPR-Out); equals ``average_precision_score``.""",
)
fpr_at_95_tpr = _on_probs(
    fpr95_from_scores,
    "fpr_at_95_tpr",
    """False-positive rate (in-distribution flagged as OOD) when 95% of OOD samples are caught.""",
)
roc_curve_points = _on_probs(
    roc_from_scores,
    "roc_curve_points",
    """ROC curve (fpr, tpr, thresholds) for plotting; equals sklearn ``roc_curve(...,
    drop_intermediate=False)`` (whose first threshold is also +inf).""",
)
