"""Common contract of the post-hoc calibrators: fit on cached validation logits, then calibrate.

Every method is fitted on the logits of one inference pass over the validation split and maps
logits (N, K) to probabilities (N, K) on the same device. Inputs are validated once here, with the
shared checks of `calibtune.metrics.validation`; the numerical work lives in pure functions in
the sibling modules.

Hyperparameters are declared once per class, as `Param` rules in ``PARAMS`` whose defaults are
read from ``__init__``'s signature (`calibtune._registry.defaults_from_signature`). A direct
constructor call checks its arguments against them; the registry (`calibtune.posthoc.POSTHOC`)
checks the given values in `Entry.resolve` and builds through `PosthocCalibrator.from_params`,
which does not check them again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import torch

from calibtune._registry import Param, defaults_from_signature
from calibtune.metrics.validation import ArrayLike, check_logits_labels, check_matrix


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else (float16/bfloat16/float32/ints) runs in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class PosthocCalibrator(ABC):
    """Base class: ``fit(val_logits, val_labels) -> self``, ``calibrate(logits) -> probs``.

    Subclasses set the class attribute ``name`` (the registry name), implement `_fit` and
    `_calibrate` on validated tensors, and expose their fitted parameters as attributes and via
    `params`.
    """

    # The registry name; a class attribute, overridden per instance only where one class
    # serves two registry entries (TemperatureScaling with criterion="nll" is "ts_nll").
    name: str = ""
    #: the constructor's hyperparameters; each default is taken from ``__init__``'s signature
    PARAMS: ClassVar[tuple[Param, ...]] = ()
    #: whether calibrate() keeps argmax_k of the logits for every input (a guarantee of the
    #: method, tested on random logits); methods that can reorder classes set it to False
    preserves_argmax: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.PARAMS = defaults_from_signature(cls.__init__, cls.PARAMS)

    def __init__(self) -> None:
        self._fitted = False

    def _checked(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor's arguments (its ``locals()``) checked against `PARAMS`; ``None`` is
        accepted where the declared default is ``None`` (e.g. "the protocol's default grid")."""
        owner = type(self).__name__
        out = {}
        for p in self.PARAMS:
            v = args[p.name]
            out[p.name] = v if (v is None and p.default is None) else p.validate(v, owner=owner)
        return out

    @classmethod
    def from_params(cls, **params: Any) -> Self:
        """An unfitted instance from values already checked against `PARAMS` (missing ones take
        their defaults); what the registry builds with, after `Entry.resolve` checked them.

        >>> from calibtune.posthoc import TemperatureScaling
        >>> TemperatureScaling.from_params(n_bins=10).n_bins
        10
        """
        obj = cls.__new__(cls)
        PosthocCalibrator.__init__(obj)
        obj._configure({**{p.name: p.default for p in cls.PARAMS}, **params})
        return obj

    @abstractmethod
    def _configure(self, cfg: dict[str, Any]) -> None:
        """Set the hyperparameter attributes from checked values (cross-parameter rules here)."""

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
