"""Base class of the loss modules: validated hyperparameters + reduction around a pure function."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Self

import torch
from torch import nn

from calibtune._registry import Param

from ._reduce import check_reduction
from ._registry import LOSSES, register_loss


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
    Most losses are a pure function and its hyperparameters (a subclass declared with
    ``name=`` and ``function=``, see `__init_subclass__`): ``forward`` calls ``function``; the
    others write their own ``forward`` (and register with ``name=`` or `register_loss`).
    """

    name: ClassVar[str] = ""
    adaptive: ClassVar[bool] = False
    #: ``function(logits, targets, reduction=, validate_args=False, **hparams)``, or None
    function: ClassVar[Callable[..., torch.Tensor] | None] = None

    def __init_subclass__(
        cls,
        *,
        name: str | None = None,
        function: Callable[..., torch.Tensor] | None = None,
        params: Sequence[Param] | None = None,
        **kwargs: Any,
    ) -> None:
        """``class FocalLoss(CalibrationLoss, name="focal", function=F.focal_loss)``: registers the
        class under ``name`` with the class docstring as its one-line summary; a ``function``
        becomes ``forward``, and its declared rules (`calibtune.losses._functional.loss_function`,
        defaults included) the entry's hyperparameters unless ``params`` are given."""
        super().__init_subclass__(**kwargs)
        if function is not None:
            cls.function = staticmethod(function)
        if name is None:
            return
        summary = " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())
        declared = getattr(function, "rules", ()) if params is None else params
        register_loss(name, params=declared, summary=summary)(cls)
        if function is not None:
            module = f"calibtune.losses.functional.{function.__name__}"
            cls.__doc__ = f"{summary} (`{module}` as a module)."

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
        if self.function is None:
            raise NotImplementedError
        return self.function(
            logits, targets, reduction=self.reduction, validate_args=False, **self.hparams
        )

    def extra_repr(self) -> str:
        items = [f"{k}={v!r}" for k, v in self.hparams.items()]
        return ", ".join([*items, f"reduction={self.reduction!r}"])
