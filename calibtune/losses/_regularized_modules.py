"""Registered module adapters for MbLS, LogitNorm, MDCA and DCA (`calibtune.losses._regularized`):
each registers its function with the hyperparameters (and defaults) the function declares.

Defaults come from the papers and the authors' code; see docs/losses.md for the table.
"""

from __future__ import annotations

from . import _regularized as R
from ._base import CalibrationLoss


class MbLSLoss(CalibrationLoss, name="mbls", function=R.mbls_loss):
    """margin-based label smoothing: CE + (λ/K)Σ_k max(0, max_j z_j − z_k − m)"""


class LogitNormLoss(CalibrationLoss, name="logitnorm", function=R.logitnorm_loss):
    """logit normalisation: CE(z / (τ‖z‖₂), y) (Wei et al. 2022)"""


class MDCALoss(CalibrationLoss, name="mdca", function=R.mdca_loss):
    """CE + β·MDCA, (1/K)Σ_k |mean p_k − mean 1[y = k]| over the batch"""


class DCALoss(CalibrationLoss, name="dca", function=R.dca_loss):
    """CE + β·|mean confidence − accuracy| over the batch (Liang et al. 2020)"""
