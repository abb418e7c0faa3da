"""Pure functional forms of every loss, plus the AdaFocal/CalFocal rules and FLSD's γ*.

``import calibtune.losses.functional as F_cal``; e.g. ``F_cal.focal_loss(logits, targets, 3.0)``.
Conventions (reduction, numerics, checks) are described in `calibtune.losses._functional`.
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
from ._reduce import REDUCTIONS, reduce_loss

__all__ = [
    "REDUCTIONS",
    "ValidationBins",
    "adadual_focal_loss",
    "adafocal_gamma_update",
    "adafocal_loss",
    "brier_loss",
    "calfocal_gammas",
    "calfocal_loss",
    "cross_entropy_loss",
    "dual_focal_loss",
    "fcl_loss",
    "flsd_from_p0",
    "flsd_loss",
    "focal_loss",
    "initial_edges",
    "inverse_focal_loss",
    "label_smoothing_loss",
    "mmce_loss",
    "mmce_weighted",
    "reduce_loss",
    "validation_bins",
]
