"""Post-hoc calibration: fit on cached validation logits, map logits to calibrated probabilities.

Every method follows one contract (`PosthocCalibrator`): ``fit(val_logits, val_labels) -> self``,
fitted parameters as attributes and via ``params() -> dict[str, float]``,
``calibrate(logits) -> probs`` (torch in, torch out, same device). One inference pass over the
validation split serves every method. Methods are named through the `POSTHOC` registry:

==================  ===========================================================================
``ts``              `TemperatureScaling` — grid T ∈ {0.1, …, 10}, validation ECE (Mukhoti et al.
                    2020); ``criterion``/``t_grid`` select Ghosh's or Komisarenko's protocol
``ts_nll``          `TemperatureScaling` with ``criterion="nll"`` — T minimising validation NLL
``focal_ts``        `FocalTemperatureScaling` — focal calibration map on softmax(z/T)
                    (Komisarenko & Kull 2024), (γ_ev, T) on validation equal-mass ECE
``focal_ts_nll``    `FocalTemperatureScaling` with ``criterion="nll"``
``ets``             `EnsembleTemperatureScaling` (Zhang et al. 2020, Mix-n-Match)
``spline``          `SplineCalibration` (Gupta et al. 2021)
``vector_scaling``  `VectorScaling` — softmax(v ⊙ z + b) (Guo et al. 2017); may change argmax
``matrix_scaling``  `MatrixScaling` — softmax(W z + b), ODIR penalty; may change argmax
``dirichlet``       `DirichletCalibration` — softmax(W log p + b), Dir-ODIR (Kull et al. 2019)
``hist_binning``    `HistogramBinning` — top-label, equal-mass bins (Gupta & Ramdas 2022)
``isotonic``        `IsotonicCalibration` — one-vs-rest isotonic, renormalised; may change argmax
==================  ===========================================================================

`t_at_edge` says whether a fitted temperature lies at an end of the range its fit searched
(`t_range`); trials log it as ``posthoc/<method>/T_at_edge``.
``preserves_argmax`` (a class attribute) says whether a method keeps the predicted class.
"""

from ._affine import DirichletCalibration, MatrixScaling, VectorScaling
from ._base import PosthocCalibrator
from ._binning import HistogramBinning, IsotonicCalibration
from ._edges import T_AT_EDGE, fitted_values, t_at_edge, t_range
from ._ets import EnsembleTemperatureScaling
from ._focal import (
    DEFAULT_FOCAL_TEMPERATURES,
    DEFAULT_GAMMAS,
    FocalTemperatureScaling,
    focal_calibration_map,
)
from ._registry import POSTHOC, build_posthoc, list_posthoc
from ._spline import SplineCalibration
from ._temperature import (
    DEFAULT_TEMPERATURES,
    TEMPERATURE_GRIDS,
    TemperatureScaling,
    refinement_nll,
)

__all__ = [
    "DEFAULT_FOCAL_TEMPERATURES",
    "DEFAULT_GAMMAS",
    "DEFAULT_TEMPERATURES",
    "POSTHOC",
    "TEMPERATURE_GRIDS",
    "T_AT_EDGE",
    "DirichletCalibration",
    "EnsembleTemperatureScaling",
    "FocalTemperatureScaling",
    "HistogramBinning",
    "IsotonicCalibration",
    "MatrixScaling",
    "PosthocCalibrator",
    "SplineCalibration",
    "TemperatureScaling",
    "VectorScaling",
    "build_posthoc",
    "fitted_values",
    "focal_calibration_map",
    "list_posthoc",
    "refinement_nll",
    "t_at_edge",
    "t_range",
]
