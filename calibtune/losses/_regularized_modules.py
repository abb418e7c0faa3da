"""Registered module adapters for MbLS, LogitNorm, MDCA and DCA (`calibtune.losses._regularized`).

Defaults come from the papers and the authors' code; see docs/losses.md for the table.
"""

from __future__ import annotations

from dataclasses import replace

from . import _regularized as R
from ._base import function_loss

MbLSLoss = function_loss(
    "MbLSLoss",
    "mbls",
    R.mbls_loss,
    params=[
        replace(R.MARGIN, default=6.0, doc="margin m on max_j z_j − z_k (Liu et al.: 6 on CIFAR)"),
        replace(R.MBLS_LAM, default=0.1, doc="weight λ of the class-averaged margin penalty"),
    ],
    summary="margin-based label smoothing: CE + (λ/K)Σ_k max(0, max_j z_j − z_k − m)",
    module=__name__,
)
LogitNormLoss = function_loss(
    "LogitNormLoss",
    "logitnorm",
    R.logitnorm_loss,
    params=[replace(R.TAU, default=0.04, doc="temperature τ (Wei et al.: 0.04 on CIFAR-10)")],
    summary="logit normalisation: CE(z / (τ‖z‖₂), y) (Wei et al. 2022)",
    module=__name__,
)
MDCALoss = function_loss(
    "MDCALoss",
    "mdca",
    R.mdca_loss,
    params=[replace(R.BETA, default=1.0, doc="weight β of MDCA (Hebbalaguppe et al.: 1 with CE)")],
    summary="CE + β·MDCA, (1/K)Σ_k |mean p_k − mean 1[y = k]| over the batch",
    module=__name__,
)
DCALoss = function_loss(
    "DCALoss",
    "dca",
    R.dca_loss,
    params=[replace(R.BETA, default=5.0, doc="weight β of DCA (5 in Liang et al.'s code)")],
    summary="CE + β·|mean confidence − accuracy| over the batch (Liang et al. 2020)",
    module=__name__,
)
