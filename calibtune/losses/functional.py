"""Pure functional forms of every loss, plus the AdaFocal/CalFocal rules and FLSD's γ*.

``import calibtune.losses.functional as F_cal``; e.g. ``F_cal.focal_loss(logits, targets, 3.0)``.
Conventions (reduction, numerics, checks) are described in `calibtune.losses._functional`.
Each loss checks its hyperparameters on every call; a loop that already validated them passes
``validate_args=False`` (the shape/dtype checks of the inputs still run):

>>> import torch
>>> z, y = torch.zeros(4, 3), torch.tensor([0, 1, 2, 0])
>>> round(float(focal_loss(z, y, 2.0, validate_args=False)), 4)
0.4883
>>> focal_loss(z, y, -1.0)
Traceback (most recent call last):
...
calibtune._validate.ValidationError: focal_loss: gamma: expected a number in [0, inf), got -1.0
"""

from ._adafocal import (
    ValidationBins,
    adafocal_gamma_update,
    calfocal_gammas,
    initial_edges,
    validation_bins,
)
from ._flsd import flsd_from_p0
from ._functional import (
    adadual_focal_loss,
    adafocal_loss,
    brier_loss,
    calfocal_loss,
    cross_entropy_loss,
    dual_focal_loss,
    fcl_loss,
    flsd_loss,
    focal_loss,
    inverse_focal_loss,
    label_smoothing_loss,
    mmce_loss,
    mmce_weighted,
)
from ._mixup import MixedTargets, mixup_batch, rankmixup_loss, rankmixup_mrl_loss, regmixup_loss
from ._reduce import REDUCTIONS, reduce_loss
from ._regularized import dca_loss, logitnorm_loss, mbls_loss, mdca_loss

__all__ = [
    "REDUCTIONS",
    "MixedTargets",
    "ValidationBins",
    "adadual_focal_loss",
    "adafocal_gamma_update",
    "adafocal_loss",
    "brier_loss",
    "calfocal_gammas",
    "calfocal_loss",
    "cross_entropy_loss",
    "dca_loss",
    "dual_focal_loss",
    "fcl_loss",
    "flsd_from_p0",
    "flsd_loss",
    "focal_loss",
    "initial_edges",
    "inverse_focal_loss",
    "label_smoothing_loss",
    "logitnorm_loss",
    "mbls_loss",
    "mdca_loss",
    "mixup_batch",
    "mmce_loss",
    "mmce_weighted",
    "rankmixup_loss",
    "rankmixup_mrl_loss",
    "reduce_loss",
    "regmixup_loss",
    "validation_bins",
]
