"""Registered module adapters for the losses without validation-driven state: each is its pure
function with the hyperparameters (and defaults) the function declares, or the ones listed here;
FLSD keeps its schedule in buffers."""

from __future__ import annotations

import itertools
from dataclasses import replace

import torch

from calibtune._registry import Param

from . import _functional as F
from ._base import CalibrationLoss
from ._registry import register_loss


class CrossEntropyLoss(CalibrationLoss, name="cross_entropy", function=F.cross_entropy_loss):
    """cross-entropy −log p_y"""


class FocalLoss(CalibrationLoss, name="focal", function=F.focal_loss):
    """focal loss −(1−p_y)^γ log p_y (Lin et al. 2017; Mukhoti et al. 2020)"""


class InverseFocalLoss(CalibrationLoss, name="inverse_focal", function=F.inverse_focal_loss):
    """inverse focal loss −(1+p_y)^γ log p_y (Ghosh et al. 2022)"""


@register_loss(
    "flsd",
    params=[
        Param(
            "gammas",
            (5.0, 3.0),
            kind="float_list",
            low=0.0,
            searchable=False,
            doc="γ per p_y bin, one more than thresholds",
        ),
        Param(
            "thresholds",
            (0.2,),
            kind="float_list",
            low=0.0,
            high=1.0,
            low_open=True,
            high_open=True,
            searchable=False,
            doc="strictly increasing p_y thresholds; bins [t_b, t_{b+1})",
        ),
    ],
    summary="sample-dependent focal loss, default FLSD-53 (Mukhoti et al. 2020)",
)
class FLSDLoss(CalibrationLoss):
    """FLSD (`calibtune.losses.functional.flsd_loss`); schedules via `flsd_from_p0`."""

    gamma_values: torch.Tensor
    thresholds: torch.Tensor

    def _configure(self) -> None:
        gammas, thresholds = self.hparams["gammas"], self.hparams["thresholds"]
        if len(gammas) != len(thresholds) + 1:
            raise ValueError(
                f"flsd: gammas: expected len(thresholds) + 1 = {len(thresholds) + 1} values, "
                f"got {len(gammas)}"
            )
        if any(a >= b for a, b in itertools.pairwise(thresholds)):
            raise ValueError(f"flsd: thresholds: expected strictly increasing, got {thresholds}")
        # non-persistent: the schedule is configuration, not state; buffers follow .to(device)
        self.register_buffer("gamma_values", torch.tensor(gammas), persistent=False)
        self.register_buffer("thresholds", torch.tensor(thresholds), persistent=False)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.flsd_loss(
            logits,
            targets,
            self.gamma_values,
            self.thresholds,
            self.reduction,
            validate_args=False,
        )


class DualFocalLoss(CalibrationLoss, name="dual_focal", function=F.dual_focal_loss):
    """dual focal loss −(1−p_y+p_j)^γ log p_y (Tao et al. 2023)"""


class FocalCalibrationLoss(CalibrationLoss, name="fcl", function=F.fcl_loss):
    """focal calibration loss: focal + λ‖p − onehot(y)‖²"""


class BrierLoss(CalibrationLoss, name="brier", function=F.brier_loss):
    """Brier score Σ_k (p_k − y_k)²"""


_SMOOTHING = replace(
    F.ALPHA,
    default=0.05,
    high=1.0,
    high_open=True,
    doc="smoothing α: (1−α) on y, α/(K−1) elsewhere; at most (K−1)/K",
)


class LabelSmoothingLoss(
    CalibrationLoss, name="label_smoothing", function=F.label_smoothing_loss, params=[_SMOOTHING]
):
    """cross-entropy with label smoothing (Müller et al. 2019; Mukhoti et al. §5)"""


_MMCE_PARAMS = (
    replace(
        F.LAM,
        default=2.0,
        doc="weight λ of MMCE_w (2 in Mukhoti et al., tuned with normalization "
        "'focal_calibration')",
    ),
    Param(
        "normalization",
        "kumar",
        kind="categorical",
        choices=F.MMCE_NORMALIZATIONS,
        searchable=False,
        doc="'kumar': Kumar et al.'s MMCE_w; 'focal_calibration': the seed code's, whose "
        "kernel sums are divided by m², n², mn twice (Mukhoti et al.'s λ = 2 assumes it)",
    ),
)


class MMCELoss(CalibrationLoss, name="mmce", function=F.mmce_loss, params=_MMCE_PARAMS):
    """cross-entropy + λ·weighted MMCE, Laplacian kernel width 0.4 (Kumar et al. 2018)"""
