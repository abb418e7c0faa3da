"""The one reduction convention shared by every loss.

``"mean"`` (default) averages the per-sample losses over the batch, ``"sum"`` adds them and
``"none"`` returns them, shape (B,).

Learning rates: the gradient of a sum over a batch of B samples is B times the gradient of the
mean, so one SGD step of ``lr`` on the sum equals one step of ``lr × B`` on the mean. Code that
sums over the batch (most of the seed papers' code does; their Brier loss and the FCL code do
not) is reproduced by ``reduction="sum"`` at its own learning rate (``loss.reduction`` in a trial
config) together with its clip norm of 2 (``train.grad_clip``), tested in
tests/test_reduction_step.py. Equivalently, for a summed loss only, with SGD + momentum + weight
decay: lr·(clip_2(g_sum) + wd·θ) = (lr·B)·(clip_{2/B}(g_mean) + (wd/B)·θ) (docs/losses.md).
"""

from __future__ import annotations

from typing import Literal

import torch

Reduction = Literal["mean", "sum", "none"]
REDUCTIONS: tuple[str, ...] = ("mean", "sum", "none")


def check_reduction(reduction: object) -> Reduction:
    """Return ``reduction`` if it is one of `REDUCTIONS`, else raise ``ValueError``."""
    if reduction not in REDUCTIONS:
        choices = ", ".join(repr(r) for r in REDUCTIONS)
        raise ValueError(f"reduction: expected one of {choices}, got {reduction!r}")
    return reduction  # type: ignore[return-value]


def reduce_loss(per_sample: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """Reduce per-sample losses (B,) to a scalar (``mean``/``sum``) or keep them (``none``)."""
    if reduction == "mean":
        return per_sample.mean()
    if reduction == "sum":
        return per_sample.sum()
    return per_sample


def expand_reduced_grad(grad_out: torch.Tensor, reduction: Reduction, n: int) -> torch.Tensor:
    """Gradient of `reduce_loss` w.r.t. each per-sample loss: a scalar or a (B,) tensor.

    Used by the fused autograd functions, which reduce inside ``forward``.
    """
    if reduction == "mean":
        return grad_out / n
    return grad_out
