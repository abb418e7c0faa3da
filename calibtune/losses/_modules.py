"""Registered module adapters for the losses without validation-driven state."""

from __future__ import annotations

import itertools
from dataclasses import replace

import torch

from calibtune._registry import Param

from . import _functional as F
from ._base import CalibrationLoss
from ._registry import register_loss

__all__ = [
    "BrierLoss",
    "CrossEntropyLoss",
    "DualFocalLoss",
    "FLSDLoss",
    "FocalCalibrationLoss",
    "FocalLoss",
    "InverseFocalLoss",
    "LabelSmoothingLoss",
    "MMCELoss",
]


def _gamma(default: float, doc: str) -> Param:
    return replace(F.GAMMA, default=default, doc=doc)


@register_loss("cross_entropy", summary="cross-entropy −log p_y")
class CrossEntropyLoss(CalibrationLoss):
    """Cross-entropy −log p_y (`calibtune.losses.functional.cross_entropy_loss`)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy_loss(logits, targets, self.reduction, validate_args=False)


@register_loss(
    "focal",
    params=[_gamma(3.0, "focusing parameter γ (0 = cross-entropy)")],
    summary="focal loss −(1−p_y)^γ log p_y (Lin et al. 2017; Mukhoti et al. 2020)",
)
class FocalLoss(CalibrationLoss):
    """Focal loss (`calibtune.losses.functional.focal_loss`)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.focal_loss(
            logits, targets, self.hparams["gamma"], self.reduction, validate_args=False
        )


@register_loss(
    "inverse_focal",
    params=[_gamma(1.0, "exponent of (1+p_y)")],
    summary="inverse focal loss −(1+p_y)^γ log p_y (Ghosh et al. 2022)",
)
class InverseFocalLoss(CalibrationLoss):
    """Inverse focal loss (`calibtune.losses.functional.inverse_focal_loss`)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.inverse_focal_loss(
            logits, targets, self.hparams["gamma"], self.reduction, validate_args=False
        )


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


@register_loss(
    "dual_focal",
    params=[_gamma(5.0, "focusing parameter γ (Tao et al. Table 13: 5 on CIFAR-10)")],
    summary="dual focal loss −(1−p_y+p_j)^γ log p_y (Tao et al. 2023)",
)
class DualFocalLoss(CalibrationLoss):
    """Dual focal loss (`calibtune.losses.functional.dual_focal_loss`)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.dual_focal_loss(
            logits, targets, self.hparams["gamma"], self.reduction, validate_args=False
        )


@register_loss(
    "fcl",
    params=[
        _gamma(4.0, "focusing parameter γ"),
        replace(F.LAM, default=1.5, doc="weight λ of ‖p − onehot(y)‖²"),
    ],
    summary="focal calibration loss: focal + λ‖p − onehot(y)‖²",
)
class FocalCalibrationLoss(CalibrationLoss):
    """Focal Calibration Loss (`calibtune.losses.functional.fcl_loss`)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.hparams
        return F.fcl_loss(
            logits, targets, h["gamma"], h["lam"], self.reduction, validate_args=False
        )


@register_loss("brier", summary="Brier score Σ_k (p_k − y_k)²")
class BrierLoss(CalibrationLoss):
    """Brier score (`calibtune.losses.functional.brier_loss`)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.brier_loss(logits, targets, self.reduction, validate_args=False)


@register_loss(
    "label_smoothing",
    params=[
        replace(
            F.ALPHA,
            default=0.05,
            high=1.0,
            high_open=True,
            doc="smoothing α: (1−α) on y, α/(K−1) elsewhere; at most (K−1)/K",
        )
    ],
    summary="cross-entropy with label smoothing (Müller et al. 2019; Mukhoti et al. §5)",
)
class LabelSmoothingLoss(CalibrationLoss):
    """Label smoothing (`calibtune.losses.functional.label_smoothing_loss`)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.label_smoothing_loss(
            logits, targets, self.hparams["alpha"], self.reduction, validate_args=False
        )


@register_loss(
    "mmce",
    params=[
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
    ],
    summary="cross-entropy + λ·weighted MMCE, Laplacian kernel width 0.4 (Kumar et al. 2018)",
)
class MMCELoss(CalibrationLoss):
    """Cross-entropy + λ·MMCE_w (`calibtune.losses.functional.mmce_loss`)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.hparams
        return F.mmce_loss(
            logits,
            targets,
            h["lam"],
            self.reduction,
            normalization=h["normalization"],
            validate_args=False,
        )
