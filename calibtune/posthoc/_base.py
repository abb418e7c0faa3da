"""Common contract of the post-hoc calibrators: fit on cached validation logits, then calibrate.

Every method is fitted on the logits of one inference pass over the validation split and maps
logits (N, K) to probabilities (N, K) on the same device. Inputs are validated once here, with the
shared checks of `calibtune.metrics.validation`; the numerical work lives in pure functions in
the sibling modules.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Self

import torch

from calibtune._registry import Param
from calibtune.metrics.validation import ArrayLike, check_logits_labels, check_matrix


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else (float16/bfloat16/float32/ints) runs in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def validate_params(owner: str, params: Sequence[Param], values: dict[str, Any]) -> dict[str, Any]:
    """Validate constructor arguments against the declared `Param`s (same rules as the registry).

    ``None`` is accepted for parameters whose declared default is ``None`` (e.g. "use the
    protocol's default grid").
    """
    out = {}
    for p in params:
        v = values[p.name]
        out[p.name] = v if (v is None and p.default is None) else p.validate(v, owner=owner)
    return out


class PosthocCalibrator(ABC):
    """Base class: ``fit(val_logits, val_labels) -> self``, ``calibrate(logits) -> probs``.

    Subclasses set the class attribute ``name`` (the registry name), implement `_fit` and
    `_calibrate` on validated tensors, and expose their fitted parameters as attributes and via
    `params`.
    """

    # The registry name; a class attribute, overridden per instance only where one class
    # serves two registry entries (TemperatureScaling with criterion="nll" is "ts_nll").
    name: str = ""

    def __init__(self) -> None:
        self._fitted = False

    @property
    def is_fitted(self) -> bool:
        return self._fitted

    def fit(self, val_logits: ArrayLike, val_labels: ArrayLike) -> Self:
        """Fit on validation logits (N, K) and integer labels (N,); returns ``self``."""
        z, y = check_logits_labels(val_logits, val_labels)
        self._fit(z.to(compute_dtype(z)), y)
        self._fitted = True
        return self

    def calibrate(self, logits: ArrayLike) -> torch.Tensor:
        """Calibrated probabilities (N, K) for ``logits`` (N, K), on the logits' device.

        float64 logits give float64 probabilities; any other dtype gives float32.
        """
        if not self._fitted:
            raise ValueError(
                f"{type(self).__name__}: calibrate() called before fit(); "
                "call fit(val_logits, val_labels) first"
            )
        z = check_matrix(logits, "logits")
        return self._calibrate(z.to(compute_dtype(z)))

    def params(self) -> dict[str, float]:
        """Fitted parameters as plain floats (e.g. ``{"T": 1.3}``); requires a fitted model."""
        if not self._fitted:
            raise ValueError(
                f"{type(self).__name__}: params() called before fit(); "
                "call fit(val_logits, val_labels) first"
            )
        return self._params()

    @abstractmethod
    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None: ...

    @abstractmethod
    def _calibrate(self, z: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def _params(self) -> dict[str, float]: ...

    def __repr__(self) -> str:
        state = self._params() if self._fitted else "unfitted"
        return f"{type(self).__name__}({state})"
