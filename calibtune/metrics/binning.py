"""Binning shared by every metric, the AdaFocal controller and post-hoc fitting.

Two conventions, each implemented once:

* equal-width: ``n_bins`` bins ``(lo, hi]`` on [0, 1] whose edges are exactly k/n_bins in every
  dtype: k/n_bins is divided in float64 (correctly rounded) and rounded to the values' dtype, so
  a confidence written as k/n_bins (e.g. 0.55 with 20 bins, in float32 or float64) *is* edge k and
  falls in the lower bin ((0.5, 0.55]), as in scikit-learn's ``calibration_curve`` and Kumar et
  al.'s ``verified_calibration``. (``torch.linspace`` edges are not: in float64
  ``linspace(0, 1, 21)[11]`` is 0.5499999999999999, which sent 0.55 to the upper bin.) A
  confidence of exactly 0 falls in the first bin.
* equal-mass: sort the samples by confidence ascending and split the sorted positions into
  ``n_bins`` contiguous groups whose sizes differ by at most one, larger groups first (the sizes
  of ``numpy.array_split``); then keep tied confidences together: every sample goes to the group
  of the first sorted position holding its confidence, so group boundaries fall only between
  distinct confidences (the bins of Kumar et al.'s ``verified_calibration.get_equal_bins``, whose
  boundaries are midpoints between consecutive groups, duplicates merged, a confidence on a
  boundary in the lower bin). Every sample belongs to exactly one group; a group swallowed by a
  run of ties that started in an earlier group is empty. The groups use the confidences alone —
  not the labels, not the input order — so every group statistic is permutation invariant; on
  tie-free data they are the plain ``array_split`` groups of the sorted confidences.

Public (a building block, not a metric): the AdaFocal controller (`calibtune.losses`) and the
post-hoc grid searches (`calibtune.posthoc`) bin exactly as the metrics do by calling these.

>>> equal_width_ids(torch.tensor([0.0, 0.5, 0.55, 1.0]), n_bins=20).tolist()
[0, 9, 10, 19]
>>> equal_mass_sizes(10, 3)
[4, 3, 3]
>>> equal_mass_ids_sorted(torch.tensor([0.1, 0.1, 0.1, 0.1, 0.7]), 2).tolist()
[0, 0, 0, 0, 1]
"""

from __future__ import annotations

import torch

__all__ = [
    "bin_stats",
    "binned_gap",
    "equal_mass_ids",
    "equal_mass_ids_sorted",
    "equal_mass_order",
    "equal_mass_sizes",
    "equal_mass_snap",
    "equal_mass_sort",
    "equal_mass_starts",
    "equal_width_edges",
    "equal_width_ids",
    "fill_empty_groups",
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


def equal_mass_order(conf: torch.Tensor) -> torch.Tensor:
    """Indices (..., N) sorting ``conf`` (..., N) ascending on the last axis (stable sort).

    The order among tied confidences does not matter: `equal_mass_ids_sorted` keeps ties in one
    group.
    """
    return torch.sort(conf, dim=-1, stable=True).indices


def equal_mass_ids_sorted(sorted_conf: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Group id (..., N) of each position of confidences sorted ascending on the last axis.

    id = the ``array_split`` group (`equal_mass_ids`) of the first position holding the same
    confidence, so a run of ties never straddles a boundary. Non-decreasing along the last axis;
    values in ``[0, n_bins)``; some groups may be empty.
    """
    n = sorted_conf.shape[-1]
    base = equal_mass_ids(n, n_bins, sorted_conf.device)
    sc = sorted_conf.contiguous()
    first = torch.searchsorted(sc, sc, right=False)
    return base[first]


def equal_mass_snap(sorted_conf: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """Move ``array_split`` boundaries (positions in [0, N], any shape) past the run of ties they
    cut: boundary p > 0 becomes the number of confidences ≤ ``sorted_conf[p − 1]``.

    The groups between snapped boundaries are those of `equal_mass_ids_sorted` (a tied run
    stays in the group where it starts); ``sorted_conf`` (N,) ascending.
    """
    sc = sorted_conf.contiguous()
    before = sc[(bounds - 1).clamp_min(0)]
    moved = torch.searchsorted(sc, before.reshape(-1), right=True).reshape(bounds.shape)
    return torch.where(bounds > 0, moved, bounds)


def equal_mass_sort(conf: torch.Tensor, n_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`equal_mass_order` of (N,) samples and the group id (N,) of each *original* sample."""
    order = equal_mass_order(conf)
    ids = torch.empty_like(order)
    ids[order] = equal_mass_ids_sorted(conf[order], n_bins)
    return order, ids


def equal_mass_starts(
    sorted_conf: torch.Tensor, sorted_ids: torch.Tensor, n_bins: int
) -> torch.Tensor:
    """Smallest confidence (n_bins,) of each group, from (N,) sorted confidences and their ids.

    An empty group starts where the next non-empty one does (1 past the last non-empty one), so
    group b spans ``[starts[b], starts[b+1])`` and the spans tile [starts[0], 1].
    """
    n = sorted_conf.numel()
    b = torch.arange(n_bins, device=sorted_ids.device)
    pos = torch.searchsorted(sorted_ids.contiguous(), b, right=False)
    first = sorted_conf[pos.clamp_max(n - 1)]
    return torch.where(pos < n, first, torch.ones_like(first))


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


def fill_empty_groups(acc: torch.Tensor, nonempty: torch.Tensor) -> torch.Tensor:
    """``acc`` (..., G) with each empty group's value replaced by the last non-empty one before
    it on the last axis, so that a monotonicity test skips empty groups. The first group must be
    non-empty (true of every equal-mass split: it starts at 0 and holds at least its
    ``array_split`` size), also after each bin count of a sweep laid end to end."""
    pos = torch.arange(acc.shape[-1], device=acc.device).expand_as(acc)
    last = torch.where(nonempty, pos, torch.zeros_like(pos)).cummax(dim=-1).values
    return acc.gather(-1, last)
