"""The post-hoc calibration registry: studies and the trial engine name methods as strings."""

from __future__ import annotations

from typing import Any

from calibtune._registry import Registry

from ._base import PosthocCalibrator
from ._ets import ETS_PARAMS, EnsembleTemperatureScaling
from ._focal import FOCAL_TS_PARAMS, FocalTemperatureScaling
from ._spline import SPLINE_PARAMS, SplineCalibration
from ._temperature import TS_PARAMS, TemperatureScaling

POSTHOC: Registry[PosthocCalibrator] = Registry("post-hoc calibration method")

POSTHOC.add(
    "ts",
    TemperatureScaling,
    params=TS_PARAMS,
    summary="temperature scaling; T from {0.1, …, 10} minimising validation ECE (15 bins)",
)
POSTHOC.add(
    "ts_nll",
    lambda **kw: TemperatureScaling(criterion="nll", **kw),
    params=tuple(p for p in TS_PARAMS if p.name in ("t_grid", "temperatures", "t_min", "t_max")),
    summary="temperature scaling; T minimising validation NLL over log T (or over a grid)",
)
POSTHOC.add(
    "focal_ts",
    FocalTemperatureScaling,
    params=FOCAL_TS_PARAMS,
    summary="focal temperature scaling (Komisarenko & Kull 2024); (γ_ev, T) on validation "
    "equal-mass ECE",
)
POSTHOC.add(
    "focal_ts_nll",
    lambda **kw: FocalTemperatureScaling(criterion="nll", **kw),
    params=tuple(p for p in FOCAL_TS_PARAMS if p.name in ("gammas", "temperatures")),
    summary="focal temperature scaling with (γ_ev, T) on validation NLL (Komisarenko & Kull "
    "2024's log-loss criterion)",
)
POSTHOC.add(
    "ets",
    EnsembleTemperatureScaling,
    params=ETS_PARAMS,
    summary="ensemble temperature scaling (Zhang et al. 2020, Mix-n-Match)",
)
POSTHOC.add(
    "spline",
    SplineCalibration,
    params=SPLINE_PARAMS,
    summary="top-label natural cubic spline recalibration (Gupta et al. 2021)",
)


def build_posthoc(name: str, **params: Any) -> PosthocCalibrator:
    """Unfitted post-hoc method ``name`` with validated ``params`` (unknown names/params raise
    ``ValueError`` listing the valid ones)."""
    return POSTHOC.build(name, **params)


def list_posthoc() -> list[str]:
    """Registered method names, sorted."""
    return POSTHOC.names()
