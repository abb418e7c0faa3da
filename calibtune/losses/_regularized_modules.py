"""Registered module adapters for MbLS, LogitNorm, MDCA and DCA (`calibtune.losses._regularized`).

Defaults come from the papers and the authors' code; see docs/losses.md for the table.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from . import _regularized as R
from ._base import CalibrationLoss
from ._registry import register_loss

__all__ = ["DCALoss", "LogitNormLoss", "MDCALoss", "MbLSLoss"]


@register_loss(
    "mbls",
    params=[
        replace(R.MARGIN, default=6.0, doc="margin m on max_j z_j − z_k (Liu et al.: 6 on CIFAR)"),
        replace(R.MBLS_LAM, default=0.1, doc="weight λ of the class-averaged margin penalty"),
    ],
    summary="margin-based label smoothing: CE + (λ/K)Σ_k max(0, max_j z_j − z_k − m)",
)
class MbLSLoss(CalibrationLoss):
    """MbLS (`calibtune.losses.functional.mbls_loss`)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.hparams
        return R.mbls_loss(
            logits, targets, h["margin"], h["lam"], self.reduction, validate_args=False
        )


@register_loss(
    "logitnorm",
    params=[replace(R.TAU, default=0.04, doc="temperature τ (Wei et al.: 0.04 on CIFAR-10)")],
    summary="logit normalisation: CE(z / (τ‖z‖₂), y) (Wei et al. 2022)",
)
class LogitNormLoss(CalibrationLoss):
    """LogitNorm (`calibtune.losses.functional.logitnorm_loss`)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return R.logitnorm_loss(
            logits, targets, self.hparams["tau"], self.reduction, validate_args=False
        )


@register_loss(
    "mdca",
    params=[replace(R.BETA, default=1.0, doc="weight β of MDCA (Hebbalaguppe et al.: 1 with CE)")],
    summary="CE + β·MDCA, (1/K)Σ_k |mean p_k − mean 1[y = k]| over the batch",
)
class MDCALoss(CalibrationLoss):
    """CE + β·MDCA (`calibtune.losses.functional.mdca_loss`); a batch-level term."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return R.mdca_loss(
            logits, targets, self.hparams["beta"], self.reduction, validate_args=False
        )


@register_loss(
    "dca",
    params=[replace(R.BETA, default=5.0, doc="weight β of DCA (5 in Liang et al.'s code)")],
    summary="CE + β·|mean confidence − accuracy| over the batch (Liang et al. 2020)",
)
class DCALoss(CalibrationLoss):
    """CE + β·DCA (`calibtune.losses.functional.dca_loss`); a batch-level term."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return R.dca_loss(
            logits, targets, self.hparams["beta"], self.reduction, validate_args=False
        )
