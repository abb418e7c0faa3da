"""The one reduction convention shared by every loss.

``"mean"`` (default) averages the per-sample losses over the batch, ``"sum"`` adds them and
``"none"`` returns them, shape (B,). The seed papers' code sums over the batch, so a learning rate
copied from it must be divided by the batch size when used with ``"mean"``.
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
