"""Selective classification: risk–coverage curves, AURC and AUGRC; refinement NLL.

A selective classifier accepts the ``k`` most confident of ``N`` samples (confidence = max_k p_k,
correctness = first argmax equals the label). With ``E_k`` the number of errors among them:

* selective risk at coverage k/N: ``E_k / k`` (Geifman & El-Yaniv 2017, "Selective
  Classification for Deep Neural Networks"); AURC = 1/N Σ_{k=1..N} E_k / k
  (Geifman, Uziel & El-Yaniv 2019, "Bias-Reduced Uncertainty Estimation for Deep Neural
  Classifiers").
* generalised risk at coverage k/N: ``E_k / N`` (the joint probability of being accepted *and*
  wrong); AUGRC = 1/N Σ_{k=1..N} E_k / N (Traub et al. 2024, "Overcoming Common Flaws in the
  Evaluation of Selective Classification Systems"). A perfect ranking with error rate e gives
  AUGRC = m(m+1)/(2N²) with m = eN errors (→ e²/2); a random ranking ≈ e/2.

Ties: samples with equal confidence cannot be ordered by the selector, so ``E_k`` inside a group
of tied confidences is its *expectation over the orderings of the group*: the errors before the
group plus (k − samples before the group) × the group's error rate (the curve is linear inside a
tie group). Both areas are right Riemann sums over the N coverages k/N; the values never depend
on the input order.

Refinement (Berta et al. 2025, "Rethinking Early Stopping: Refine, Then Calibrate"): the NLL
after temperature scaling fitted by NLL on the *same* samples, min_T NLL(softmax(z / T)) — the
part of the NLL that re-calibration cannot remove.
"""

from __future__ import annotations

import torch

from .keys import SELECTIVE_KEYS
from .validation import ArrayLike, probs_labels

__all__ = ["SELECTIVE_KEYS", "augrc", "aurc", "risk_coverage", "selective_report"]

_F64 = torch.float64


def _expected_errors(conf: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """E_k (N,) float64 for k = 1..N: expected errors among the k most confident (ties averaged).

    Shapes: conf (N,), correct (N,) bool.
    """
    order = torch.argsort(conf, descending=True, stable=True)
    c, wrong = conf[order], (~correct[order]).to(_F64)
    _, counts = torch.unique_consecutive(c, return_counts=True)
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=c.device), counts)
    g_err = torch.zeros(counts.numel(), dtype=_F64, device=c.device).index_add_(0, group, wrong)
    ends = torch.cumsum(counts, 0)
    err_before = torch.cumsum(g_err, 0) - g_err
    k = torch.arange(1, c.numel() + 1, dtype=_F64, device=c.device)
    start = (ends - counts).to(_F64)[group]
    return err_before[group] + (k - start) * (g_err / counts)[group]


def _top_label(
    probs: ArrayLike, labels: ArrayLike, validate_args: bool
) -> tuple[torch.Tensor, ...]:
    p, y = probs_labels(probs, labels, validate_args=validate_args)
    conf, pred = p.max(dim=1)
    return conf, pred == y


def risk_coverage(
    probs: ArrayLike, labels: ArrayLike, *, validate_args: bool = True
) -> dict[str, torch.Tensor]:
    """The risk–coverage curve: ``coverage`` k/N, ``risk`` E_k/k and ``generalized_risk`` E_k/N,
    each (N,) float64 for k = 1..N (ties averaged, see the module docstring)."""
    conf, correct = _top_label(probs, labels, validate_args)
    e = _expected_errors(conf, correct)
    n = conf.numel()
    k = torch.arange(1, n + 1, dtype=_F64, device=e.device)
    return {"coverage": k / n, "risk": e / k, "generalized_risk": e / n}


def aurc(probs: ArrayLike, labels: ArrayLike, *, validate_args: bool = True) -> float:
    """Area under the risk–coverage curve, 1/N Σ_k E_k / k (lower is better).

    >>> round(aurc([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.6, 0.4]], [0, 0, 1, 1]), 4)
    0.3333
    """
    return float(risk_coverage(probs, labels, validate_args=validate_args)["risk"].mean())


def augrc(probs: ArrayLike, labels: ArrayLike, *, validate_args: bool = True) -> float:
    """Area under the generalised risk–coverage curve, 1/N Σ_k E_k / N (lower is better).

    >>> augrc([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.6, 0.4]], [0, 0, 1, 1])
    0.25
    """
    curve = risk_coverage(probs, labels, validate_args=validate_args)
    return float(curve["generalized_risk"].mean())


def selective_report(
    probs: ArrayLike, labels: ArrayLike, *, validate_args: bool = True
) -> dict[str, float]:
    """`SELECTIVE_KEYS` from one sort: ``{"aurc": …, "augrc": …}``."""
    curve = risk_coverage(probs, labels, validate_args=validate_args)
    return {"aurc": float(curve["risk"].mean()), "augrc": float(curve["generalized_risk"].mean())}
