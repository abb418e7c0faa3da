"""The post-hoc calibration registry: studies and the trial engine name methods as strings."""

from __future__ import annotations

from typing import Any

from calibtune._registry import Param, Registry

from ._affine import DirichletCalibration, MatrixScaling, VectorScaling
from ._base import PosthocCalibrator
from ._binning import HistogramBinning, IsotonicCalibration
from ._ets import EnsembleTemperatureScaling
from ._focal import FocalTemperatureScaling
from ._spline import SplineCalibration
from ._temperature import TemperatureScaling

POSTHOC: Registry[PosthocCalibrator] = Registry("post-hoc calibration method")


def _only(cls: type[PosthocCalibrator], *names: str) -> tuple[Param, ...]:
    """The declared `Param`s of ``cls`` named ``names`` (an entry that fixes the others)."""
    return tuple(p for p in cls.PARAMS if p.name in names)


POSTHOC.add(
    "ts",
    TemperatureScaling.from_params,
    params=TemperatureScaling.PARAMS,
    summary="temperature scaling; T from {0.1, …, 10} minimising validation ECE (15 bins)",
)
POSTHOC.add(
    "ts_nll",
    lambda **kw: TemperatureScaling.from_params(criterion="nll", **kw),
    params=_only(TemperatureScaling, "t_grid", "temperatures", "t_min", "t_max"),
    summary="temperature scaling; T minimising validation NLL over log T (or over a grid)",
)
POSTHOC.add(
    "focal_ts",
    FocalTemperatureScaling.from_params,
    params=FocalTemperatureScaling.PARAMS,
    summary="focal temperature scaling (Komisarenko & Kull 2024); (γ_ev, T) on validation "
    "equal-mass ECE",
)
POSTHOC.add(
    "focal_ts_nll",
    lambda **kw: FocalTemperatureScaling.from_params(criterion="nll", **kw),
    params=_only(FocalTemperatureScaling, "gammas", "temperatures"),
    summary="focal temperature scaling with (γ_ev, T) on validation NLL (Komisarenko & Kull "
    "2024's log-loss criterion)",
)
POSTHOC.add(
    "ets",
    EnsembleTemperatureScaling.from_params,
    params=EnsembleTemperatureScaling.PARAMS,
    summary="ensemble temperature scaling (Zhang et al. 2020, Mix-n-Match)",
)
POSTHOC.add(
    "spline",
    SplineCalibration.from_params,
    params=SplineCalibration.PARAMS,
    summary="top-label natural cubic spline recalibration (Gupta et al. 2021)",
)

POSTHOC.add(
    "vector_scaling",
    VectorScaling.from_params,
    params=VectorScaling.PARAMS,
    summary="vector scaling softmax(v ⊙ z + b) (Guo et al. 2017), NLL + μ·mean b², L-BFGS",
)
POSTHOC.add(
    "matrix_scaling",
    MatrixScaling.from_params,
    params=MatrixScaling.PARAMS,
    summary="matrix scaling softmax(W z + b) (Guo et al. 2017), ODIR penalty (Kull et al. 2019)",
)
POSTHOC.add(
    "dirichlet",
    DirichletCalibration.from_params,
    params=DirichletCalibration.PARAMS,
    summary="Dirichlet calibration softmax(W log p + b) with ODIR (Kull et al. 2019)",
)
POSTHOC.add(
    "hist_binning",
    HistogramBinning.from_params,
    params=HistogramBinning.PARAMS,
    summary="top-label histogram binning, equal-mass bins per predicted class (Gupta & Ramdas "
    "2022)",
)
POSTHOC.add(
    "isotonic",
    IsotonicCalibration.from_params,
    params=IsotonicCalibration.PARAMS,
    summary="one-vs-rest isotonic regression on softmax(z), renormalised",
)


def build_posthoc(name: str, **params: Any) -> PosthocCalibrator:
    """Unfitted post-hoc method ``name`` with validated ``params`` (unknown names/params raise
    ``ValueError`` listing the valid ones)."""
    return POSTHOC.build(name, **params)


def list_posthoc() -> list[str]:
    """Registered method names, sorted."""
    return POSTHOC.names()
