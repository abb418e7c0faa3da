"""Base class of the loss modules: validated hyperparameters + reduction around a pure function."""

from __future__ import annotations

from typing import Any, ClassVar, Self

import torch
from torch import nn

from ._reduce import check_reduction
from ._registry import LOSSES


class CalibrationLoss(nn.Module):
    """Thin ``nn.Module`` adapter over one function of `calibtune.losses.functional`.

    Hyperparameters are validated against the registry entry ``name`` at construction, with
    defaults filled from it (the only place defaults live); ``self.hparams`` holds the resolved
    values, which ``forward`` passes with ``validate_args=False`` (never re-checked per batch).
    `from_params` builds from values resolved already; subclasses put cross-parameter rules
    and buffers in ``_configure``, which both paths run.
    ``forward(logits (B, K), targets (B,) int64)`` returns the loss reduced by ``reduction``
    (``"mean"`` over the batch by default; the seed papers' code sums).
    ``adaptive`` is True for losses whose state is updated from validation statistics.
    """

    name: ClassVar[str] = ""
    adaptive: ClassVar[bool] = False

    def __init__(self, *, reduction: str = "mean", **params: Any) -> None:
        super().__init__()
        self.reduction = check_reduction(reduction)
        self.hparams: dict[str, Any] = LOSSES.get(self.name).resolve(**params)
        self._configure()

    @classmethod
    def from_params(cls, reduction: str = "mean", **resolved: Any) -> Self:
        """The loss from hyperparameters the registry resolved already (``Entry.resolve``, e.g.
        a validated `calibtune.trial.LossConfig`'s ``params``): missing ones take their
        defaults, none is checked again; cross-parameter rules still apply.

        >>> from calibtune.losses import LOSSES, FocalLoss
        >>> FocalLoss.from_params(**LOSSES.get("focal").resolve(gamma=2)).hparams
        {'gamma': 2.0}
        """
        obj = cls.__new__(cls)
        nn.Module.__init__(obj)
        obj.reduction = check_reduction(reduction)
        obj.hparams = {**LOSSES.get(cls.name).defaults(), **resolved}
        obj._configure()
        return obj

    def _configure(self) -> None:
        """Cross-parameter rules and buffers from ``self.hparams`` (subclasses extend it)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        items = [f"{k}={v!r}" for k, v in self.hparams.items()]
        return ", ".join([*items, f"reduction={self.reduction!r}"])
