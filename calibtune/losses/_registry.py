"""The loss registry: every training objective by name, with its declared hyperparameters.

Entries are added by ``register_loss``: as the decorator of the `CalibrationLoss` subclasses that
write their own ``forward`` (``_modules.py``, ``_adafocal.py``), and by the subclasses that are a
pure function and its declared hyperparameters (``class FocalLoss(CalibrationLoss, name="focal",
function=F.focal_loss)``, see `CalibrationLoss.__init_subclass__`; ``_modules.py``,
``_regularized_modules.py``); ``calibtune.losses`` imports those modules, so the registry is
complete as soon as the package is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from torch import nn

from calibtune._registry import Param, Registry

# Entries are `CalibrationLoss` subclasses; typed by their base nn.Module so that this module,
# below ``_base``, imports nothing of it.
LOSSES: Registry[nn.Module] = Registry("loss")

C = TypeVar("C", bound=type)


def register_loss(
    name: str, *, params: Sequence[Param] = (), summary: str = ""
) -> Callable[[C], C]:
    """Register a `CalibrationLoss` subclass under ``name`` and set its ``name`` attribute."""

    def deco(cls: C) -> C:
        cls.name = name  # type: ignore[attr-defined]
        LOSSES.add(name, cls, params=params, summary=summary)
        return cls

    return deco


def list_losses() -> list[str]:
    """Sorted names of every registered loss."""
    return LOSSES.names()


def build_loss(name: str, reduction: str = "mean", **params: Any) -> Any:
    """Build the loss module ``name`` (a `CalibrationLoss`) with validated ``params``
    (unspecified ones take defaults).

    Unknown names raise ``ValueError`` listing `list_losses()`; unknown or out-of-range parameters
    raise ``ValueError`` naming the rule ("focal: gamma: expected a number in [0, inf), got -1").
    ``reduction`` is ``"mean"`` (default), ``"sum"`` or ``"none"``.
    """
    entry = LOSSES.get(name)
    return entry.factory(reduction=reduction, **params)
