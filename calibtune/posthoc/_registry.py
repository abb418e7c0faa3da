"""The post-hoc calibration registry: studies and the trial engine name methods as strings."""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

from calibtune._registry import Registry

from ._affine import DirichletCalibration, MatrixScaling, VectorScaling
from ._base import PosthocCalibrator
from ._binning import HistogramBinning, IsotonicCalibration
from ._ets import EnsembleTemperatureScaling
from ._focal import FocalTemperatureScaling
from ._spline import SplineCalibration
from ._temperature import TemperatureScaling

POSTHOC: Registry[PosthocCalibrator] = Registry("post-hoc calibration method")


class _Method(NamedTuple):
    """One registry entry: a class, its one-line summary, and for an entry that fixes
    ``criterion`` (the ``*_nll`` ones) that value and the params that still apply (the NLL
    criterion has no ECE binning to tune)."""

    cls: type[PosthocCalibrator]
    summary: str
    criterion: str | None = None
    offered: tuple[str, ...] | None = None  # None: all of the class's PARAMS


#: in the order of the package docstring's table
_METHODS: dict[str, _Method] = {
    "ts": _Method(
        TemperatureScaling,
        "temperature scaling; T from {0.1, …, 10} minimising validation ECE (15 bins)",
    ),
    "ts_nll": _Method(
        TemperatureScaling,
        "temperature scaling; T minimising validation NLL over log T (or over a grid)",
        criterion="nll",
        offered=("t_grid", "temperatures", "t_min", "t_max"),
    ),
    "focal_ts": _Method(
        FocalTemperatureScaling,
        "focal temperature scaling (Komisarenko & Kull 2024); (γ_ev, T) on validation "
        "equal-mass ECE",
    ),
    "focal_ts_nll": _Method(
        FocalTemperatureScaling,
        "focal temperature scaling with (γ_ev, T) on validation NLL (Komisarenko & Kull "
        "2024's log-loss criterion)",
        criterion="nll",
        offered=("gammas", "temperatures"),
    ),
    "ets": _Method(
        EnsembleTemperatureScaling, "ensemble temperature scaling (Zhang et al. 2020, Mix-n-Match)"
    ),
    "spline": _Method(
        SplineCalibration, "top-label natural cubic spline recalibration (Gupta et al. 2021)"
    ),
    "vector_scaling": _Method(
        VectorScaling,
        "vector scaling softmax(v ⊙ z + b) (Guo et al. 2017), NLL + μ·mean b², L-BFGS",
    ),
    "matrix_scaling": _Method(
        MatrixScaling,
        "matrix scaling softmax(W z + b) (Guo et al. 2017), ODIR penalty (Kull et al. 2019)",
    ),
    "dirichlet": _Method(
        DirichletCalibration,
        "Dirichlet calibration softmax(W log p + b) with ODIR (Kull et al. 2019)",
    ),
    "hist_binning": _Method(
        HistogramBinning,
        "top-label histogram binning, equal-mass bins per predicted class (Gupta & Ramdas 2022)",
    ),
    "isotonic": _Method(
        IsotonicCalibration, "one-vs-rest isotonic regression on softmax(z), renormalised"
    ),
}

for _name, _m in _METHODS.items():
    POSTHOC.add(
        _name,
        partial(_m.cls.from_params, criterion=_m.criterion) if _m.criterion else _m.cls.from_params,
        params=[p for p in _m.cls.PARAMS if _m.offered is None or p.name in _m.offered],
        summary=_m.summary,
    )


def build_posthoc(name: str, **params: Any) -> PosthocCalibrator:
    """Unfitted post-hoc method ``name`` with validated ``params`` (unknown names/params raise
    ``ValueError`` listing the valid ones)."""
    return POSTHOC.build(name, **params)


def list_posthoc() -> list[str]:
    """Registered method names, sorted."""
    return POSTHOC.names()
