"""Calibration metrics over class probabilities.

Every function takes ``probs`` (N, K) — probabilities, never logits — and ``labels`` (N,) integer
class indices, and returns a Python float as a fraction (not a percentage). Computation is
vectorised torch on the device of ``probs``; bins are assigned in the input dtype against edges
that are exactly k/n_bins in that dtype, equal-mass groups keep tied confidences together (both
conventions in `calibtune.metrics.binning`), and bin sums are accumulated in float64. Any memory
layout is accepted (transposed views, strided slices such as ``probs[::2]``).

References:
    Guo et al. 2017, "On Calibration of Modern Neural Networks" (ECE, MCE, reliability diagrams).
    Mukhoti et al. 2020, "Calibrating Deep Neural Networks using Focal Loss" (AdaECE, cwECE).
    Kull et al. 2019, "Beyond temperature scaling" (classwise ECE).
    Kumar, Liang, Ma 2019, "Verified Uncertainty Calibration" (debiased estimator).
    Roelofs et al. 2022, "Mitigating Bias in Calibration Error Estimation" (ECE_SWEEP).
    Błasiok & Nakkiran 2023, "Smooth ECE: Principled Reliability Diagrams via Kernel Smoothing".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._smece import smooth_ece
from .binning import (
    bin_stats,
    binned_gap,
    equal_mass_ids_sorted,
    equal_mass_order,
    equal_mass_sizes,
    equal_mass_snap,
    equal_mass_starts,
    equal_width_edges,
    equal_width_ids,
    fill_empty_groups,
)
from .validation import ArrayLike, check_n_bins, logits_labels, probs_labels

_F64 = torch.float64


def _top_label(p: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-label confidence (N,) in the input dtype and correctness (N,) as bool."""
    conf, pred = p.max(dim=1)
    return conf, pred == y


class _Prepared:
    """Quantities shared by several metrics, computed once (see `calibration_report`)."""

    def __init__(self, p: torch.Tensor, y: torch.Tensor) -> None:
        self.p, self.y = p, y
        self.conf, self.correct = _top_label(p, y)
        self.conf64 = self.conf.to(_F64)
        self.correct64 = self.correct.to(_F64)
        self._sorted: tuple[torch.Tensor, torch.Tensor] | None = None
        self._p64: torch.Tensor | None = None

    @property
    def p64(self) -> torch.Tensor:
        """The probabilities in float64 (N, K), converted once for every metric that sums them."""
        if self._p64 is None:
            self._p64 = self.p.to(_F64)
        return self._p64

    @property
    def sorted(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(confidences, correctness) sorted by confidence (`metrics.binning`), float64."""
        if self._sorted is None:
            order = equal_mass_order(self.conf)
            self._sorted = (self.conf64[order], self.correct64[order])
        return self._sorted


# -- equal-width top-label ---------------------------------------------------------------


def _width_stats(prep: _Prepared, n_bins: int) -> tuple[torch.Tensor, ...]:
    ids = equal_width_ids(prep.conf, n_bins)
    return bin_stats(ids, prep.conf64, prep.correct64, n_bins)


def _ece(prep: _Prepared, n_bins: int) -> float:
    return float(binned_gap(*_width_stats(prep, n_bins)))


def _mce(prep: _Prepared, n_bins: int) -> float:
    count, conf_sum, acc_sum = _width_stats(prep, n_bins)
    nonempty = count > 0
    gaps = (acc_sum[nonempty] - conf_sum[nonempty]).abs() / count[nonempty]
    return float(gaps.max())


def ece(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, *, validate_args: bool = True
) -> float:
    """Expected calibration error, top-label, equal-width bins.

    ECE = Σ_b |B_b|/N · |acc_b − conf_b| with bins (lo, hi] on [0, 1]; a confidence of 0 falls in
    the first bin. Shapes: probs (N, K), labels (N,). Guo et al. 2017; Mukhoti et al. 2020.

    >>> round(ece([[0.9, 0.1], [0.2, 0.8]], [0, 0]), 4)
    0.45
    >>> round(ece(torch.tensor([[0.9, 0.1]]), torch.tensor([0]), validate_args=False), 4)
    0.1
    """
    p, y = probs_labels(probs, labels, n_bins, validate_args=validate_args)
    return _ece(_Prepared(p, y), n_bins)


def mce(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, *, validate_args: bool = True
) -> float:
    """Maximum calibration error: max over non-empty equal-width bins of |acc_b − conf_b|."""
    p, y = probs_labels(probs, labels, n_bins, validate_args=validate_args)
    return _mce(_Prepared(p, y), n_bins)


# -- equal-mass top-label ----------------------------------------------------------------


def _adaece(prep: _Prepared, n_bins: int) -> float:
    conf, correct = prep.sorted
    ids = equal_mass_ids_sorted(conf, n_bins)
    return float(binned_gap(*bin_stats(ids, conf, correct, n_bins)))


def adaece(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, *, validate_args: bool = True
) -> float:
    """Adaptive (equal-mass) ECE.

    Samples are sorted by confidence ascending and split into ``n_bins`` contiguous groups whose
    sizes differ by at most one, larger groups first (``numpy.array_split`` sizes); tied
    confidences stay together in the group where their run starts (boundaries only between
    distinct confidences, as Kumar et al.'s ``get_equal_bins``), so the value depends on neither
    the labels' nor the input's order. Every sample is counted exactly once (unlike the
    focal_calibration reference, which drops the minimum).
    AdaECE = Σ_g |G_g|/N · |acc_g − conf_g|. Mukhoti et al. 2020, "Calibrating Deep Neural
    Networks using Focal Loss" (ECE_EM in Ghosh et al. 2022).
    """
    p, y = probs_labels(probs, labels, n_bins, validate_args=validate_args)
    return _adaece(_Prepared(p, y), n_bins)


# -- classwise ---------------------------------------------------------------------------


def _classwise_ece(prep: _Prepared, n_bins: int) -> float:
    p, y = prep.p, prep.y
    n, k = p.shape
    # Most entries of a K-class probability matrix lie in the first bin (p ≤ 1/n_bins): bin only
    # the others, and get each class's first-bin sum as its column total minus theirs (10k × 100:
    # 3 % of the entries; ~3× faster than binning all N·K on CPU, the same ids and sums).
    upper = (p > equal_width_edges(n_bins, p.dtype, p.device)[1]).reshape(-1).nonzero().squeeze(1)
    cls = upper.remainder(k)
    ids = equal_width_ids(p.reshape(-1)[upper], n_bins).add_(cls, alpha=n_bins)
    conf_sum = torch.zeros(k, n_bins, dtype=_F64, device=p.device)
    conf_sum.view(-1).index_add_(0, ids, prep.p64.reshape(-1)[upper])
    conf_sum[:, 0] = prep.p64.sum(0) - conf_sum[:, 1:].sum(1)
    # 1{y = k} is non-zero only at (n, y_n): N entries instead of N·K
    hit = equal_width_ids(p.gather(1, y[:, None]).squeeze(1), n_bins).add_(y, alpha=n_bins)
    acc_sum = torch.zeros(k * n_bins, dtype=_F64, device=p.device)
    acc_sum.index_add_(0, hit, torch.ones(n, dtype=_F64, device=p.device))
    return float((acc_sum - conf_sum.view(-1)).abs().sum() / (n * k))


def classwise_ece(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, *, validate_args: bool = True
) -> float:
    """Classwise ECE: mean over the K classes of the equal-width ECE of p[:, k] against 1{y = k}.

    cwECE = 1/K Σ_k Σ_b |B_kb|/N · |mean_{B_kb} 1{y=k} − mean_{B_kb} p_k|, bins (lo, hi] on p[:, k].
    K is ``probs.shape[1]`` (never inferred from the labels). Kull et al. 2019; reported ×100 in
    Mukhoti et al. 2020 and Ghosh et al. 2022.
    """
    p, y = probs_labels(probs, labels, n_bins, validate_args=validate_args)
    return _classwise_ece(_Prepared(p, y), n_bins)


# -- proper scores and error -------------------------------------------------------------


def _nll_from_probs(prep: _Prepared) -> float:
    py = prep.p.gather(1, prep.y[:, None]).squeeze(1).to(_F64)
    # probabilities that underflowed to 0 would give inf; clamp at the dtype's smallest normal.
    return float(-torch.log(py.clamp_min(torch.finfo(prep.p.dtype).tiny)).mean())


def _brier(prep: _Prepared) -> float:
    p = prep.p64
    # Σ_k (p_k − y_k)² = Σ_k p_k² − 2 p_y + 1
    # Σ_k p_k² as a batched (1, K)·(K, 1) product: `vecdot` materialises p ⊙ p, and that fresh
    # N·K buffer cost 4.1 ms against 0.6 ms for bmm inside the report (10k × 100, CPU)
    sq = torch.bmm(p.unsqueeze(1), p.unsqueeze(2)).view(-1)
    sq = sq - 2 * p.gather(1, prep.y[:, None]).squeeze(1) + 1
    return float(sq.mean())


def nll(probs: ArrayLike, labels: ArrayLike, *, validate_args: bool = True) -> float:
    """Mean negative log-likelihood −1/N Σ log p_{n, y_n} (p_y clamped at the dtype's tiny)."""
    p, y = probs_labels(probs, labels, validate_args=validate_args)
    return _nll_from_probs(_Prepared(p, y))


def brier(probs: ArrayLike, labels: ArrayLike, *, validate_args: bool = True) -> float:
    """Multiclass Brier score 1/N Σ_n Σ_k (p_nk − 1{y_n = k})² (range [0, 2])."""
    p, y = probs_labels(probs, labels, validate_args=validate_args)
    return _brier(_Prepared(p, y))


def error(probs: ArrayLike, labels: ArrayLike, *, validate_args: bool = True) -> float:
    """Top-1 error: fraction of samples with argmax_k p_k ≠ y (first maximum on ties)."""
    p, y = probs_labels(probs, labels, validate_args=validate_args)
    return float(1.0 - _Prepared(p, y).correct64.mean())


# -- debiased, sweep and smooth estimators -----------------------------------------------


def _ece_debiased(prep: _Prepared, n_bins: int) -> float:
    conf, correct = prep.sorted
    n = conf.numel()
    b = min(n_bins, n)
    # Bins of Kumar et al.'s `get_equal_bins`: boundaries halfway between consecutive equal-mass
    # groups, duplicates merged, a sample on a boundary goes to the lower bin.
    sizes = torch.tensor(equal_mass_sizes(n, b), device=conf.device)
    last = torch.cumsum(sizes, 0)[:-1]
    bounds = torch.unique((conf[last - 1] + conf[last]) / 2)
    ids = torch.bucketize(conf, bounds, right=False)
    count, conf_sum, acc_sum = bin_stats(ids, conf, correct, bounds.numel() + 1)
    safe = count.clamp_min(1)
    acc = acc_sum / safe
    biased = (conf_sum / safe - acc).square()
    variance = acc * (1 - acc) / (count - 1).clamp_min(1)
    per_bin = torch.where(count >= 2, biased - variance, torch.zeros_like(biased))
    return float((count / n * per_bin).sum().clamp_min(0).sqrt())


def ece_debiased(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, *, validate_args: bool = True
) -> float:
    """Debiased L2 top-label calibration error of Kumar, Liang & Ma 2019 (ECE_DEBIAS).

    With equal-mass bins B_b (boundaries midway between the ``array_split`` groups of the sorted
    confidences, as in the authors' `uncertainty-calibration` package):
    ECE_DEBIAS = sqrt(max(0, Σ_b |B_b|/N · [(conf_b − acc_b)² − acc_b(1 − acc_b)/(|B_b| − 1)])),
    bins with fewer than two samples contributing 0. Equals
    ``calibration.lower_bound_scaling_ce(probs, labels, p=2, debias=True, num_bins=n_bins,
    binning_scheme=get_equal_bins, mode="top-label")``. Cited in Ghosh et al. 2022, App. F.
    """
    p, y = probs_labels(probs, labels, n_bins, validate_args=validate_args)
    return _ece_debiased(_Prepared(p, y), n_bins)


def _sweep_errors(
    conf: torch.Tensor,
    cum_conf: torch.Tensor,
    cum_acc: torch.Tensor,
    counts: torch.Tensor,
    p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each candidate bin count b in ``counts`` (C,): monotone flag (C,) and ECE_p (C,).

    ``conf`` (N,) sorted; groups are `equal_mass_snap`'s (ties together), so some are empty: they
    add nothing and the monotonicity test skips them.
    """
    n = cum_conf.numel() - 1
    device = cum_conf.device
    seg = torch.repeat_interleave(torch.arange(counts.numel(), device=device), counts)
    j = torch.arange(seg.numel(), device=device) - torch.repeat_interleave(
        torch.cumsum(counts, 0) - counts, counts
    )
    b = counts[seg]
    q, r = n // b, n % b
    start = j * q + torch.minimum(j, r)
    end = equal_mass_snap(conf, start + q + (j < r).long())
    start = equal_mass_snap(conf, start)
    size = (end - start).to(_F64)
    safe = size.clamp_min(1)
    acc_sum = cum_acc[end] - cum_acc[start]
    conf_sum = cum_conf[end] - cum_conf[start]
    gap = ((acc_sum - conf_sum).abs() / safe).pow(p) * size / n
    ece_p = torch.zeros(counts.numel(), dtype=_F64, device=device).index_add_(0, seg, gap)
    acc = fill_empty_groups(acc_sum / safe, size > 0)
    # a decrease between consecutive bins of the same b breaks monotonicity
    drop = (acc[1:] < acc[:-1]) & (seg[1:] == seg[:-1])
    broken = torch.zeros(counts.numel(), dtype=torch.bool, device=device)
    broken[seg[1:][drop]] = True
    return ~broken, ece_p.pow(1.0 / p)


def _ece_sweep(prep: _Prepared, p: float = 1.0) -> float:
    conf, correct = prep.sorted
    n = conf.numel()
    zero = torch.zeros(1, dtype=_F64, device=conf.device)
    cum_conf = torch.cat([zero, torch.cumsum(conf, 0)])
    cum_acc = torch.cat([zero, torch.cumsum(correct, 0)])
    best = None
    lo, width = 1, 64
    while lo <= n:
        counts = torch.arange(lo, min(n, lo + width - 1) + 1, device=conf.device)
        monotone, errs = _sweep_errors(conf, cum_conf, cum_acc, counts, p)
        if not bool(monotone.all()):
            first_bad = int((~monotone).nonzero()[0, 0])
            if first_bad > 0:
                best = errs[first_bad - 1]
            break
        best = errs[-1]
        lo, width = lo + counts.numel(), width * 2
    assert best is not None  # b = 1 is always monotone
    return float(best)


def ece_sweep(
    probs: ArrayLike, labels: ArrayLike, p: float = 1.0, *, validate_args: bool = True
) -> float:
    """Monotonic-sweep ECE with equal-mass bins (Roelofs et al. 2022; ECE_SWEEP in Ghosh et al.).

    The number of bins b* is the largest b (sweeping b = 1, 2, … and stopping at the first b whose
    equal-mass bin accuracies are not non-decreasing in confidence) and
    ECE_SWEEP = (Σ_b |B_b|/N · |acc_b − conf_b|^p)^{1/p} at b*. Groups follow ``adaece``
    (``array_split`` sizes, tied confidences kept together; empty groups are skipped by the
    monotonicity test). ``p=1`` (default) is comparable with ECE; Roelofs et al. also use ``p=2``.
    """
    pr, y = probs_labels(probs, labels, validate_args=validate_args)
    if validate_args and not (isinstance(p, (int, float)) and p >= 1):
        raise ValueError(f"p: expected a number >= 1, got {p!r}")
    return _ece_sweep(_Prepared(pr, y), float(p))


def _smece(prep: _Prepared) -> float:
    return smooth_ece(prep.conf64.cpu().numpy(), prep.correct64.cpu().numpy())


def smece(probs: ArrayLike, labels: ArrayLike, *, validate_args: bool = True) -> float:
    """Smooth ECE (smECE) of the top-label confidence: the authors' `relplot` algorithm, vectorised.

    smECE(f, y) = Σ over a kernel-smoothed residual r̂_σ(t) = E[y − f | f ≈ t] weighted by the
    smoothed density, with σ the fixed point σ = smECE_σ (Błasiok & Nakkiran 2023; used as smCE in
    the Focal Calibration Loss paper). Here f = max_k p_k and y = 1{argmax = label}. Equals
    ``relplot.smECE(f, y)`` to ≤ 1e-9 (`calibtune.metrics._smece`, tested against relplot).
    """
    p, y = probs_labels(probs, labels, validate_args=validate_args)
    return _smece(_Prepared(p, y))


# -- reliability table and report ---------------------------------------------------------


def reliability_table(
    probs: ArrayLike,
    labels: ArrayLike,
    n_bins: int = 15,
    binning: str = "width",
    *,
    validate_args: bool = True,
) -> dict[str, np.ndarray]:
    """Per-bin data behind reliability diagrams and AdaFocal's validation bins.

    Returns arrays of length ``n_bins``: ``count``, ``lower``, ``upper`` (bin edges), ``conf``
    (mean confidence), ``acc`` (accuracy) and ``gap`` = conf − acc (signed; positive means
    over-confident). Empty bins have count 0 and NaN conf/acc/gap.
    ``binning="width"``: equal-width (lo, hi] bins. ``binning="mass"``: the ``adaece`` groups;
    group b spans [smallest confidence in b, smallest confidence in b+1), the first starting at 0
    and the last ending at 1 (the edges AdaFocal bins training samples with); an empty group
    (swallowed by tied confidences, or n < n_bins) spans the empty interval where the next
    non-empty one starts.
    """
    p, y = probs_labels(probs, labels, n_bins, validate_args=validate_args)
    if validate_args and binning not in ("width", "mass"):
        raise ValueError(f"binning: expected 'width' or 'mass', got {binning!r}")
    prep = _Prepared(p, y)
    if binning == "width":
        count, conf_sum, acc_sum = _width_stats(prep, n_bins)
        edges = equal_width_edges(n_bins, _F64, p.device)
        lower, upper = edges[:-1], edges[1:]
    else:
        conf, correct = prep.sorted
        ids = equal_mass_ids_sorted(conf, n_bins)
        count, conf_sum, acc_sum = bin_stats(ids, conf, correct, n_bins)
        first = equal_mass_starts(conf, ids, n_bins)
        lower = torch.cat([torch.zeros(1, dtype=_F64, device=conf.device), first[1:]])
        upper = torch.cat([first[1:], torch.ones(1, dtype=_F64, device=conf.device)])
    safe = count.clamp_min(1)
    nan = torch.full_like(count, float("nan"))
    conf_mean = torch.where(count > 0, conf_sum / safe, nan)
    acc = torch.where(count > 0, acc_sum / safe, nan)
    return {
        "count": count.long().cpu().numpy(),
        "lower": lower.cpu().numpy(),
        "upper": upper.cpu().numpy(),
        "conf": conf_mean.cpu().numpy(),
        "acc": acc.cpu().numpy(),
        "gap": (conf_mean - acc).cpu().numpy(),
    }


def calibration_report(
    logits: ArrayLike | None = None,
    probs: ArrayLike | None = None,
    labels: ArrayLike | None = None,
    n_bins: int = 15,
    *,
    validate_args: bool = True,
) -> dict[str, float]:
    """All calibration metrics in one pass (keys: `REPORT_KEYS`), sharing sorting and binning.

    Give exactly one of ``logits`` (N, K) — then p = softmax(logits) and NLL is computed from
    ``log_softmax`` exactly — or ``probs`` (N, K). ``labels`` (N,). Values are fractions.
    """
    if (logits is None) == (probs is None):
        raise ValueError(
            "calibration_report: expected exactly one of logits= or probs=, got "
            + ("both" if logits is not None else "neither")
        )
    if labels is None:
        raise ValueError("calibration_report: expected labels=, got None")
    if validate_args:
        check_n_bins(n_bins)
    log_p: torch.Tensor | None = None
    if logits is not None:
        z, y = logits_labels(logits, labels, validate_args=validate_args)
        log_p = torch.log_softmax(z.to(_F64), dim=1)
        p = log_p.exp()
    else:
        p, y = probs_labels(probs, labels, validate_args=validate_args)
    prep = _Prepared(p, y)
    out: dict[str, Any] = {
        "ece": _ece(prep, n_bins),
        "adaece": _adaece(prep, n_bins),
        "classwise_ece": _classwise_ece(prep, n_bins),
        "mce": _mce(prep, n_bins),
        "nll": (
            float(-log_p.gather(1, y[:, None]).mean())
            if log_p is not None
            else _nll_from_probs(prep)
        ),
        "brier": _brier(prep),
        "error": float(1.0 - prep.correct64.mean()),
        "smece": _smece(prep),
        "ece_debiased": _ece_debiased(prep, n_bins),
        "ece_sweep": _ece_sweep(prep),
    }
    return out
