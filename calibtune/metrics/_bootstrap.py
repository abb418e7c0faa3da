"""Bootstrap confidence intervals for every scalar metric of `calibration_report`.

A resample draws N of the N test samples with replacement; B resamples are one (B, N) index
tensor (`bootstrap_indices`). The samples are first renumbered in the equal-mass order (sorted by
confidence, once) and the indices turned into multiplicities w (B, N) in that
order (w_bi = how often sample i is in resample b). Every metric is a function of the multiset of
a resample's samples, so each is computed from weighted sums over the sorted samples, for all B
at once:

* the sorted resample is the sorted samples with sample i repeated w_i times, so a sum over its
  sorted positions [0, p) is a prefix sum of w·x (B, N+1) at the sample holding position p plus
  a partial copy of that sample (one batched ``searchsorted``; no per-resample sort, no (B, N)
  expansion); a group sum over [s, e) is a difference of two such sums;
* equal-width metrics (ECE, MCE): sorted by confidence, each bin is a run of sorted samples, so
  its sums are prefix sums at the run ends; error is the correct count at the end;
* equal-mass metrics (AdaECE, debiased ECE, sweep ECE) read group sums at their group
  boundaries; AdaECE's and the sweep's boundaries are moved past the run of tied confidences
  they cut (`binning.equal_mass_snap`), which puts every boundary between two sorted samples, so
  their sums are plain prefix sums there; the sweep only revisits the resamples whose bin
  accuracies are still monotone, and once its boundaries outnumber the positions it reads them
  from a (B, N+1) table of the snapped boundary at every integer position (one search) instead
  of searching for each boundary;
* per-sample means (NLL, Brier) are w @ x / N;
* classwise ECE: the non-zero bins of p[:, k] from one (B, N) @ sparse (N, K·n_bins) product, bin
  0 by difference from the dense class totals w @ p;
* smECE (the authors' `relplot`, a kernel fixed point) is the exception: one call per resample.

Values agree with `calibration_report` of ``probs[idx_b]`` up to floating-point summation order
(tested; correct counts, hence every accuracy and the sweep's monotonicity test, are exact
integers). Memory: about six (B, N) float64/int64 arrays (≈ 0.5 GB at B = 1000, N = 10⁴).
CIs are percentile intervals (Efron & Tibshirani 1993, ch. 13): the (1 − level)/2 and
(1 + level)/2 quantiles of the B values (linear interpolation, numpy's default).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .binning import equal_mass_order, equal_width_ids, fill_empty_groups
from .keys import REPORT_KEYS
from .validation import ArrayLike, check_n_bins, logits_labels, probs_labels

# Lazy: relplot (slower to import than this module with torch, by `python -X importtime`) only
# when a bootstrap asks for smECE.

__all__ = [
    "bootstrap_indices",
    "bootstrap_report",
    "bootstrap_top_label",
    "bootstrap_values",
    "percentile_ci",
]

_F64 = torch.float64
TOP_LABEL = ("ece", "mce", "adaece", "error", "ece_debiased", "ece_sweep")


def bootstrap_indices(n: int, n_resamples: int = 1000, seed: int = 0) -> torch.Tensor:
    """(n_resamples, n) int64 indices drawn uniformly with replacement (CPU generator ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (n_resamples, n), generator=g)


def _weights(indices: torch.Tensor, n: int, device: torch.device) -> torch.Tensor:
    idx = indices.to(device)
    w = torch.zeros(idx.shape[0], n, dtype=_F64, device=device)
    return w.scatter_add_(1, idx, torch.ones((), dtype=_F64, device=device).expand(idx.shape))


def _prefix(x: torch.Tensor) -> torch.Tensor:
    """(B, N) -> (B, N+1) running sums along rows, starting at 0 (one buffer, no ``cat``)."""
    out = x.new_empty(x.shape[0], x.shape[1] + 1)
    out[:, 0] = 0
    torch.cumsum(x, 1, out=out[:, 1:])
    return out


def _in_order(
    conf: torch.Tensor, correct: torch.Tensor, indices: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The equal-mass order (N,) of the samples (by confidence) and the
    multiplicities (B, N) of ``indices`` with the samples renumbered in that order: every metric
    is a function of the multiset of samples, so the rest works on sorted data (no (B, N)
    gather)."""
    order = equal_mass_order(conf)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    idx = indices.to(order.device)
    renumbered = rank.expand(idx.shape[0], -1).gather(1, idx)  # faster than rank[idx] on CPU
    return order, _weights(renumbered, order.numel(), order.device)


class _Sorted:
    """Every resample in the equal-mass order without sorting or expanding it: the sorted
    resample is the sorted samples with sample i repeated w_i times, so a prefix sum over its
    positions up to the end of a run of tied confidences (where every snapped equal-mass
    boundary lies) is a prefix sum over the sorted samples weighted by w.

    Takes ``conf``, ``correct`` (N,) already in equal-mass order and their multiplicities w
    (B, N) (`_in_order`). ``conf``, ``correct`` (N,) float64; ``cnt``, ``c``, ``a`` (B, N+1)
    prefix sums (from 0) of w, w·confidence and w·correctness over the sorted samples.
    """

    def __init__(self, conf: torch.Tensor, correct: torch.Tensor, w: torch.Tensor) -> None:
        self.conf = conf.to(_F64)
        self.correct = correct.to(_F64)
        self.cnt = _prefix(w)
        self.c = _prefix(w * self.conf)
        self.a = _prefix(w * self.correct)
        self.n = conf.numel()
        # sorted sample index just past the run of confidences tied with sample i (N,)
        self.run_end = torch.searchsorted(self.conf, self.conf, right=True)
        self._every: torch.Tensor | None = None  # `snapped`'s table

    def sample_at(self, cnt: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The sorted sample f (B, P) holding resample position ``pos`` (B, P) float64 in
        [0, n]: cnt_f ≤ pos < cnt_{f+1} (f = N at pos = n)."""
        return torch.searchsorted(cnt, pos, right=True).sub_(1)

    def snapped(self, pos: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Equal-mass boundaries moved past the tied confidences they cut
        (`binning.equal_mass_snap`, per resample): for integer positions ``pos`` (P,) or (R, P)
        in [0, n], the sorted sample index k (R, P) whose prefix ``cnt[:, k]`` is the snapped
        boundary — the end of the run of ties holding resample position pos − 1 (0 at pos = 0).
        Read from a table at every position once the positions asked for outnumber its
        B × (n+1) (a long sweep visits ≈ n²/2 positions per resample)."""
        shared = pos.ndim == 1
        r = rows.numel() if rows is not None else self.cnt.shape[0]
        if shared and self._every is None and r * pos.numel() >= self.cnt.numel():
            self._every = self._snap(torch.arange(self.n + 1, device=pos.device), self.cnt)
        if shared and self._every is not None:
            return self._every[:, pos] if rows is None else self._every[rows[:, None], pos]
        if rows is None:
            return self._snap(pos, self.cnt)
        # copying (R, N+1) rows costs more than the searches it saves unless R is small
        if 2 * rows.numel() > self.cnt.shape[0]:
            return self._snap(pos, self.cnt)[rows]
        return self._snap(pos, self.cnt[rows])

    def _snap(self, pos: torch.Tensor, cnt: torch.Tensor) -> torch.Tensor:
        at = (pos - 1).clamp_min(0).to(_F64).expand(cnt.shape[0], -1).contiguous()
        k = self.run_end[self.sample_at(cnt, at)]
        return torch.where(pos > 0, k, torch.zeros_like(k))

    def at_samples(
        self, k: torch.Tensor, rows: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Count, confidence and accuracy prefix sums (R, P) before sorted samples ``k`` (R, P)."""
        if rows is None:
            return self.cnt.gather(1, k), self.c.gather(1, k), self.a.gather(1, k)
        r = rows[:, None]
        return self.cnt[r, k], self.c[r, k], self.a[r, k]


def _equal_mass_bounds(n: int, b: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """Position of boundary j of b equal-mass groups of n (sizes differ by at most one, the
    larger first, as `binning.equal_mass_sizes`); j > b gives n."""
    return (j * (n // b) + torch.minimum(j, n % b)).clamp_max(n)


def _sizes_bounds(n: int, n_bins: int, device: torch.device) -> torch.Tensor:
    """The n_bins + 1 equal-mass boundaries of n sorted positions."""
    j = torch.arange(n_bins + 1, device=device)
    return _equal_mass_bounds(n, torch.tensor(n_bins, device=device), j)


def _adaece(s: _Sorted, n_bins: int) -> torch.Tensor:
    _, c, a = s.at_samples(s.snapped(_sizes_bounds(s.n, n_bins, s.conf.device)))
    return (a.diff(dim=1) - c.diff(dim=1)).abs().sum(1) / s.n


def _ece_debiased(s: _Sorted, n_bins: int) -> torch.Tensor:
    """Kumar et al.'s bins per resample; duplicate boundaries leave empty bins (which contribute
    0, as merging them does in `calibration_report`)."""
    b = min(n_bins, s.n)
    last = _sizes_bounds(s.n, b, s.conf.device)[1:-1].to(_F64)
    pos = torch.cat([last - 1, last]).expand(s.cnt.shape[0], -1).contiguous()
    at = s.conf[s.sample_at(s.cnt, pos)]  # confidences at sorted positions last − 1, last
    bounds = (at[:, : b - 1] + at[:, b - 1 :]) / 2  # (B, b−1)
    # positions with conf ≤ bound = multiplicity before the first sorted sample above it
    j = torch.searchsorted(s.conf, bounds, right=True)
    full = torch.full_like(j[:, :1], s.conf.numel())
    cut = torch.cat([torch.zeros_like(full), j, full], 1)
    count = s.cnt.gather(1, cut).diff(dim=1)
    conf_sum, acc_sum = s.c.gather(1, cut).diff(dim=1), s.a.gather(1, cut).diff(dim=1)
    safe = count.clamp_min(1)
    acc = acc_sum / safe
    per_bin = (conf_sum / safe - acc).square() - acc * (1 - acc) / (count - 1).clamp_min(1)
    per_bin = torch.where(count >= 2, per_bin, torch.zeros_like(per_bin))
    return (count / s.n * per_bin).sum(1).clamp_min(0).sqrt()


def _sweep_monotone(s: _Sorted, counts: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """For bin counts (C,): whether each resample of ``rows`` (R,) has non-decreasing
    equal-mass accuracies at each count, (R, C) bool (only accuracy sums are needed: the ECE is
    computed once, at the count the sweep settles on)."""
    dev = counts.device
    # the b + 1 group boundaries of each bin count b, end to end; groups are the consecutive
    # pairs inside one bin count
    seg = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), counts + 1)
    j = torch.arange(seg.numel(), device=dev) - torch.repeat_interleave(
        torch.cumsum(counts + 1, 0) - counts - 1, counts + 1
    )
    bounds = _equal_mass_bounds(s.n, counts[seg], j)
    inside = (seg[1:] == seg[:-1]).nonzero().squeeze(1)
    cnt, _, a = s.at_samples(s.snapped(bounds, rows), rows)
    size = cnt.diff(dim=1)[:, inside]
    acc = fill_empty_groups(a.diff(dim=1)[:, inside] / size.clamp_min(1), size > 0)
    seg = seg[inside]
    drop = (acc[:, 1:] < acc[:, :-1]) & (seg[1:] == seg[:-1])
    broken = torch.zeros(rows.numel(), counts.numel(), dtype=_F64, device=dev)
    return broken.index_add_(1, seg[1:], drop.to(_F64)) == 0


def _ece_sweep(s: _Sorted) -> torch.Tensor:
    """Monotonic sweep per resample (as `calibration_report`'s, p = 1): the ECE at the largest
    bin count b* before the first whose equal-mass accuracies decrease. Each chunk of bin counts
    only looks at the resamples still monotone; the ECE is then computed at each resample's own
    b* (groups past b* are empty)."""
    dev = s.c.device
    b_star = torch.ones(s.c.shape[0], dtype=torch.long, device=dev)  # one bin is monotone
    active = torch.arange(s.c.shape[0], device=dev)
    lo, width = 1, 2
    while lo <= s.n and active.numel():
        counts = torch.arange(lo, min(s.n, lo + width - 1) + 1, device=dev)
        bad = ~_sweep_monotone(s, counts, active)
        first = bad.long().argmax(1)
        has_bad = bad.any(1)
        before = torch.where(first > 0, counts[(first - 1).clamp_min(0)], b_star[active])
        b_star[active] = torch.where(has_bad, before, counts[-1])
        active = active[~has_bad]
        lo, width = lo + counts.numel(), width * 2
    j = torch.arange(int(b_star.max()) + 1, device=dev)
    bounds = _equal_mass_bounds(s.n, b_star[:, None], j)  # (B, max b* + 1)
    _, c_at, a_at = s.at_samples(s.snapped(bounds))
    return (a_at.diff(dim=1) - c_at.diff(dim=1)).abs().sum(1) / s.n


def _top_label(
    s: _Sorted, conf: torch.Tensor, n_bins: int, metrics: Sequence[str]
) -> dict[str, torch.Tensor]:
    """`bootstrap_top_label` on sorted data: ``conf`` (N,) in equal-mass order, its own dtype."""
    out: dict[str, torch.Tensor] = {}
    if {"ece", "mce"} & set(metrics):
        # sorted by confidence, so each equal-width bin is a run of sorted samples
        ids = equal_width_ids(conf, n_bins)
        cut = torch.searchsorted(ids, torch.arange(n_bins + 1, device=ids.device))
        count = s.cnt[:, cut].diff(dim=1)
        gap = (s.a[:, cut].diff(dim=1) - s.c[:, cut].diff(dim=1)).abs()
        out["ece"] = gap.sum(1) / s.n
        ratio = torch.where(count > 0, gap / count.clamp_min(1), torch.full_like(gap, -1.0))
        out["mce"] = ratio.amax(1)
    if "error" in metrics:
        out["error"] = (s.n - s.a[:, -1]) / s.n
    if {"adaece", "ece_debiased", "ece_sweep"} & set(metrics):
        out["adaece"] = _adaece(s, n_bins)
        out["ece_debiased"] = _ece_debiased(s, n_bins)
        if "ece_sweep" in metrics:
            out["ece_sweep"] = _ece_sweep(s)
    return {m: out[m] for m in metrics}


def bootstrap_top_label(
    conf: torch.Tensor,
    correct: torch.Tensor,
    indices: torch.Tensor,
    n_bins: int = 15,
    metrics: Sequence[str] = TOP_LABEL,
) -> dict[str, torch.Tensor]:
    """Top-label metrics of every resample: conf (N,), correct (N,) bool, indices (B, N) ->
    {metric: (B,) float64} for ``metrics`` ⊆ `TOP_LABEL`. Used for paired comparisons: two
    models' values on the same ``indices`` are paired."""
    order, w = _in_order(conf, correct, indices)
    conf, correct = conf[order], correct[order]
    return _top_label(_Sorted(conf, correct, w), conf, n_bins, metrics)


def _classwise(p: torch.Tensor, y: torch.Tensor, w: torch.Tensor, n_bins: int) -> torch.Tensor:
    n, k = p.shape
    ids = equal_width_ids(p, n_bins)
    p64 = p.to(_F64)
    rows, cols = (ids > 0).nonzero(as_tuple=True)  # entries outside bin 0: few when K is large
    flat = cols * n_bins + ids[rows, cols]
    upper = torch.sparse_coo_tensor(
        torch.stack([rows, flat]), p64[rows, cols], (n, k * n_bins), check_invariants=False
    ).coalesce()
    # dense (B, N) @ sparse (N, K·n_bins): no transposed copy of w (2× faster than sparse @ w.T)
    conf_sum = torch.mm(w, upper).reshape(-1, k, n_bins)
    conf_sum[:, :, 0] = (w @ p64) - conf_sum[:, :, 1:].sum(2)
    hit = y * n_bins + ids.gather(1, y[:, None]).squeeze(1)
    acc_sum = w.new_zeros(w.shape[0], k * n_bins).index_add_(1, hit, w).reshape(-1, k, n_bins)
    return (acc_sum - conf_sum).abs().sum((1, 2)) / (n * k)


def _smece(conf: torch.Tensor, correct: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    import relplot  # one smECE fixed point per resample (not vectorisable)

    f, y = conf.to(_F64).cpu().numpy(), correct.to(_F64).cpu().numpy()
    vals = [float(relplot.smECE(f[i], y[i])) for i in indices.cpu().numpy()]
    return torch.tensor(vals, dtype=_F64)


def bootstrap_values(
    logits: ArrayLike | None = None,
    probs: ArrayLike | None = None,
    labels: ArrayLike | None = None,
    n_bins: int = 15,
    *,
    indices: torch.Tensor,
    metrics: Sequence[str] = REPORT_KEYS,
    validate_args: bool = True,
) -> dict[str, torch.Tensor]:
    """Every metric of ``metrics`` (⊆ `REPORT_KEYS`) on every resample ``indices`` (B, N):
    {metric: (B,) float64}, equal to ``calibration_report(..., probs[indices[b]], ...)``.

    Give ``logits`` (N, K) (NLL from log_softmax, as the report does) or ``probs`` (N, K).
    """
    if (logits is None) == (probs is None) or labels is None:
        raise ValueError("bootstrap: expected exactly one of logits= or probs=, and labels=")
    unknown = [m for m in metrics if m not in REPORT_KEYS]
    if unknown:
        raise ValueError(f"metrics: expected names from {', '.join(REPORT_KEYS)}, got {unknown}")
    if validate_args:
        check_n_bins(n_bins)
    if logits is not None:
        z, y = logits_labels(logits, labels, validate_args=validate_args)
        log_p = torch.log_softmax(z.to(_F64), dim=1)
        p = log_p.exp()
        nll_i = -log_p.gather(1, y[:, None]).squeeze(1)
    else:
        p, y = probs_labels(probs, labels, validate_args=validate_args)
        py = p.gather(1, y[:, None]).squeeze(1)
        nll_i = -torch.log(py.clamp_min(torch.finfo(p.dtype).tiny).to(_F64))
    n = y.numel()
    if indices.ndim != 2 or indices.shape[1] != n:
        raise ValueError(f"indices: expected shape (B, {n}), got {tuple(indices.shape)}")
    conf, pred = p.max(dim=1)
    correct = pred == y
    out = {"smece": _smece(conf, correct, indices)} if "smece" in metrics else {}
    order, w = _in_order(conf, correct, indices)
    p, y, nll_i, conf, correct = (x[order] for x in (p, y, nll_i, conf, correct))
    top = [m for m in metrics if m in TOP_LABEL]
    out.update(_top_label(_Sorted(conf, correct, w), conf, n_bins, top))
    p64 = p.to(_F64)
    if "nll" in metrics:
        out["nll"] = w @ nll_i / n
    if "brier" in metrics:
        py64 = p64.gather(1, y[:, None]).squeeze(1)
        out["brier"] = w @ (torch.linalg.vecdot(p64, p64) - 2 * py64 + 1) / n
    if "classwise_ece" in metrics:
        out["classwise_ece"] = _classwise(p, y, w, n_bins)
    return {m: out[m] for m in metrics}


def percentile_ci(values: torch.Tensor, level: float = 0.95) -> tuple[float, float]:
    """(low, high): the (1 − level)/2 and (1 + level)/2 quantiles of ``values`` (B,)."""
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=_F64)
    low, high = torch.quantile(values.to(_F64).cpu(), q).tolist()
    return low, high


def bootstrap_report(
    logits: ArrayLike | None = None,
    probs: ArrayLike | None = None,
    labels: ArrayLike | None = None,
    n_bins: int = 15,
    *,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    metrics: Sequence[str] = REPORT_KEYS,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap CIs {metric: (low, high)} of `calibration_report`'s metrics over
    ``n_resamples`` resamples of the N samples (seeded: same seed, same intervals).

    >>> ci = bootstrap_report(probs=[[0.9, 0.1]] * 4, labels=[0, 0, 0, 0], n_resamples=50)
    >>> [round(v, 6) for v in ci["ece"]]
    [0.1, 0.1]
    """
    if not (isinstance(n_resamples, int) and n_resamples >= 1):
        raise ValueError(f"n_resamples: expected an integer >= 1, got {n_resamples!r}")
    if not (isinstance(level, float) and 0 < level < 1):
        raise ValueError(f"level: expected a float in (0, 1), got {level!r}")
    ref = logits if logits is not None else probs
    n = len(ref) if ref is not None else 0
    idx = bootstrap_indices(n, n_resamples, seed)
    values = bootstrap_values(logits, probs, labels, n_bins, indices=idx, metrics=metrics)
    return {m: percentile_ci(v, level) for m, v in values.items()}
