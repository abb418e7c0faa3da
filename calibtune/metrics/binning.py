"""Binning shared by every metric, the AdaFocal controller and post-hoc fitting.

Two conventions, each implemented once:

* equal-width: ``n_bins`` bins ``(lo, hi]`` on [0, 1] whose edges are exactly k/n_bins in every
  dtype: k/n_bins is divided in float64 (correctly rounded) and rounded to the values' dtype, so
  a confidence written as k/n_bins (e.g. 0.55 with 20 bins, in float32 or float64) *is* edge k and
  falls in the lower bin ((0.5, 0.55]), as in scikit-learn's ``calibration_curve`` and Kumar et
  al.'s ``verified_calibration``. (``torch.linspace`` edges are not: in float64
  ``linspace(0, 1, 21)[11]`` is 0.5499999999999999, which sent 0.55 to the upper bin.) A
  confidence of exactly 0 falls in the first bin.
* equal-mass: sort the samples by (confidence, correctness) ascending — among tied confidences
  the incorrect ones first — and split the sorted positions into ``n_bins`` contiguous groups
  whose sizes differ by at most one, larger groups first (the sizes of ``numpy.array_split``).
  Every sample belongs to exactly one group. Sorting on both keys makes the sorted sequence of
  (confidence, correct) pairs — hence every group statistic — independent of the input order,
  even when tied confidences straddle a group boundary; on tie-free data it is the plain stable
  sort by confidence.

Public (a building block, not a metric): the AdaFocal controller (`calibtune.losses`) and the
post-hoc grid searches (`calibtune.posthoc`) bin exactly as the metrics do by calling these.

>>> equal_width_ids(torch.tensor([0.0, 0.5, 0.55, 1.0]), n_bins=20).tolist()
[0, 9, 10, 19]
>>> equal_mass_sizes(10, 3)
[4, 3, 3]
"""

from __future__ import annotations

import torch

__all__ = [
    "bin_stats",
    "binned_gap",
    "equal_mass_ids",
    "equal_mass_order",
    "equal_mass_sizes",
    "equal_mass_sort",
    "equal_width_edges",
    "equal_width_ids",
]


def equal_width_edges(n_bins: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Edges (n_bins+1,) of the equal-width bins on [0, 1]: k/n_bins rounded once to ``dtype``."""
    k = torch.arange(n_bins + 1, dtype=torch.float64, device=device)
    return (k / n_bins).to(dtype)


def equal_width_ids(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Bin index in ``[0, n_bins)`` of every value for bins ``(lo, hi]``; 0 maps to bin 0.

    Shapes: ``values`` any shape, returns the same shape (int64). Values are compared with the
    edges in their own dtype (see the module docstring).
    """
    edges = equal_width_edges(n_bins, values.dtype, values.device)
    # bucketize(right=False) returns i with edges[i-1] < v <= edges[i] over the inner edges.
    return torch.bucketize(values, edges[1:-1], right=False)


def equal_mass_sizes(n: int, n_bins: int) -> list[int]:
    """Group sizes of ``numpy.array_split(range(n), n_bins)``: larger groups first."""
    q, r = divmod(n, n_bins)
    return [q + 1] * r + [q] * (n_bins - r)


def equal_mass_ids(n: int, n_bins: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Group index (n,) of each *sorted* position for the equal-mass split."""
    sizes = torch.tensor(equal_mass_sizes(n, n_bins), device=device)
    return torch.repeat_interleave(torch.arange(n_bins, device=device), sizes, output_size=n)


def equal_mass_order(conf: torch.Tensor, correct: torch.Tensor) -> torch.Tensor:
    """Indices sorting ``conf`` (..., N) by (confidence, correctness) ascending, on the last axis.

    ``correct`` (..., N) bool, broadcastable to ``conf``. Ties in both keys keep the input order
    (the pairs are then identical, so no statistic depends on it). Two stable sorts: first
    incorrect-before-correct, then by confidence.
    """
    correct = correct.expand_as(conf)
    pre = torch.sort(correct.to(torch.uint8), dim=-1, stable=True).indices
    inner = torch.sort(conf.gather(-1, pre), dim=-1, stable=True).indices
    return pre.gather(-1, inner)


def equal_mass_sort(
    conf: torch.Tensor, correct: torch.Tensor, n_bins: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`equal_mass_order` of (N,) samples and the group id (N,) of each *original* sample."""
    order = equal_mass_order(conf, correct)
    ids = torch.empty_like(order)
    ids[order] = equal_mass_ids(conf.numel(), n_bins, conf.device)
    return order, ids


def bin_stats(
    ids: torch.Tensor, conf: torch.Tensor, correct: torch.Tensor, n_bins: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-bin count, confidence sum and accuracy sum, each (n_bins,) in ``conf``'s dtype."""
    dtype = conf.dtype
    count = torch.zeros(n_bins, dtype=dtype, device=conf.device)
    count.index_add_(0, ids, torch.ones_like(conf))
    conf_sum = torch.zeros_like(count).index_add_(0, ids, conf)
    acc_sum = torch.zeros_like(count).index_add_(0, ids, correct.to(dtype))
    return count, conf_sum, acc_sum


def binned_gap(count: torch.Tensor, conf_sum: torch.Tensor, acc_sum: torch.Tensor) -> torch.Tensor:
    """Σ_b |B_b|/N · |acc_b − conf_b| = Σ_b |acc_sum_b − conf_sum_b| / N, over the last axis."""
    n = count.sum(-1)
    return (acc_sum - conf_sum).abs().sum(-1) / n
