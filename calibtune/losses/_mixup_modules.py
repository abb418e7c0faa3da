"""Registered module adapters for the mixup family (`calibtune.losses._mixup`, issue 23): each is
its function with its paper's defaults, plus the ``batch_transform`` the training loop applies to
every training batch before the forward pass (`calibtune.training._loop._step`).

Defaults come from the papers and the authors' code; see docs/losses.md for the table.
"""

from __future__ import annotations

from dataclasses import replace

from torch import Tensor

from calibtune._registry import defaults_from_signature

from . import _mixup as M
from ._base import CalibrationLoss


class _MixupFamily(CalibrationLoss):
    """A loss trained on a mixed batch: ``batch_transform(x, y)`` returns the combined batch
    (clean rows first, unchanged) and the `MixedTargets` its ``forward`` takes."""

    def copies(self) -> int:
        """How many mixed copies M of the batch each step adds (1 unless ``num_mixup``)."""
        return int(self.hparams.get("num_mixup", 1))

    def batch_transform(self, x: Tensor, y: Tensor) -> tuple[Tensor, M.MixedTargets]:
        return M.mixup_batch(x, y, self.hparams["alpha"], self.copies())


class RegMixupLoss(
    _MixupFamily,
    name="regmixup",
    function=M.regmixup_loss,
    params=defaults_from_signature(
        M.regmixup_loss,
        [
            replace(
                M.MIX_ALPHA,
                doc="Beta(α, α) of the mixing λ (Pinto et al.: 10; large α mixes near ½)",
            ),
            replace(M.ETA, doc="weight η of the mixed samples' CE (Pinto et al.: 1)"),
        ],
    ),
):
    """RegMixup: CE(x, y) + η·CE(mixup(x), mixed targets), λ ~ Beta(α, α) (Pinto et al. 2022)"""


class RankMixupLoss(
    _MixupFamily,
    name="rankmixup",
    function=M.rankmixup_loss,
    params=defaults_from_signature(
        M.rankmixup_loss,
        [
            replace(M.MIX_ALPHA, doc="Beta(α, α) of the mixing λ of each copy"),
            replace(M.RANK_WEIGHT, doc="weight w of 1 − NDCG (the authors' code: 0.1)"),
            M.NUM_MIXUP,
        ],
    ),
):
    """RankMixup M-NDCG: CE + w·(1 − NDCG of clean and mixed confidences ranked by λ)
    (Noh et al. 2023)"""


class RankMixupMRLLoss(
    _MixupFamily,
    name="rankmixup_mrl",
    function=M.rankmixup_mrl_loss,
    params=defaults_from_signature(
        M.rankmixup_mrl_loss,
        [
            replace(M.MIX_ALPHA, doc="Beta(α, α) of the mixing λ"),
            replace(M.RANK_MARGIN, doc="margin m of max z̃ below max z (the authors' code: 0.1)"),
            replace(M.RANK_WEIGHT, doc="weight w of the ranking hinge (the authors' code: 0.1)"),
        ],
    ),
):
    """RankMixup M-RL: CE + w·max(0, max z̃ − max z + m) per mixed copy (Noh et al. 2023)"""
