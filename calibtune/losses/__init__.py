"""Calibration-aware training losses: one registry, pure functional core, thin module adapters.

``build_loss(name, **params)`` returns an ``nn.Module`` whose ``forward(logits (B, K), targets
(B,))`` gives the loss averaged over the batch (``reduction="mean"``; the seed papers' code sums,
so a seed learning rate is lr × B here — see `calibtune.losses._reduce`). ``list_losses()``
names every loss; ``LOSSES`` is the `calibtune._registry.Registry` whose entries declare each
loss's hyperparameters (defaults, valid ranges, ``searchable``). Adaptive losses (``adafocal``,
``adadual_focal``, ``calfocal``) have ``adaptive = True``, ``update_every``,
``update(val_probs, val_labels)``, ``gammas``, ``edges``, ``history``,
``state_dict()``/``load_state_dict()`` and ``broadcast_state(src)``. The mixup family
(``regmixup``, ``rankmixup``, ``rankmixup_mrl``) has ``batch_transform(x, y)``, which the training
loop applies to each training batch (`mixup_batch`: clean rows, then mixed copies, and the
`MixedTargets` the loss takes).
``compile_loss(loss, mode, device)`` runs a module's forward through ``torch.compile`` (``mode``
``auto``: on CUDA only), falling back to the eager path with one warning if compiling fails.
The pure functions are in `calibtune.losses.functional`. See docs/losses.md for the table.
"""

from . import functional
from ._adafocal import AdaDualFocalLoss, AdaFocalLoss, CalFocalLoss
from ._base import CalibrationLoss
from ._compile import COMPILE_MODES, compile_loss, compile_mode
from ._flsd import flsd_from_p0
from ._mixup import MixedTargets, mixup_batch
from ._mixup_modules import RankMixupLoss, RankMixupMRLLoss, RegMixupLoss  # issue 23
from ._modules import (
    BrierLoss,
    CrossEntropyLoss,
    DualFocalLoss,
    FLSDLoss,
    FocalCalibrationLoss,
    FocalLoss,
    InverseFocalLoss,
    LabelSmoothingLoss,
    MMCELoss,
)
from ._reduce import REDUCTIONS
from ._registry import LOSSES, build_loss, list_losses
from ._regularized_modules import DCALoss, LogitNormLoss, MbLSLoss, MDCALoss  # issue 14

__all__ = [
    "COMPILE_MODES",
    "LOSSES",
    "REDUCTIONS",
    "AdaDualFocalLoss",
    "AdaFocalLoss",
    "BrierLoss",
    "CalFocalLoss",
    "CalibrationLoss",
    "CrossEntropyLoss",
    "DCALoss",
    "DualFocalLoss",
    "FLSDLoss",
    "FocalCalibrationLoss",
    "FocalLoss",
    "InverseFocalLoss",
    "LabelSmoothingLoss",
    "LogitNormLoss",
    "MDCALoss",
    "MMCELoss",
    "MbLSLoss",
    "MixedTargets",
    "RankMixupLoss",
    "RankMixupMRLLoss",
    "RegMixupLoss",
    "build_loss",
    "compile_loss",
    "compile_mode",
    "flsd_from_p0",
    "functional",
    "list_losses",
    "mixup_batch",
]
