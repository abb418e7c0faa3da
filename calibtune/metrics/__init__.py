"""Calibration and OOD-detection metrics: pure functions over ``probs``/``logits`` and labels.

See `calibtune.metrics._calibration` for the binning conventions (they are part of the contract)
and `calibtune.metrics._ood` for score orientation (OOD is the positive class).
"""

from . import keys as keys
from ._calibration import (
    REPORT_KEYS,
    adaece,
    brier,
    calibration_report,
    classwise_ece,
    ece,
    ece_debiased,
    ece_sweep,
    error,
    mce,
    nll,
    reliability_table,
    smece,
)
from ._ood import (
    SCORES,
    aupr_from_scores,
    auroc_from_scores,
    energy,
    entropy,
    fpr95_from_scores,
    fpr_at_95_tpr,
    msp,
    ood_aupr,
    ood_auroc,
    ood_score,
    roc_curve_points,
    roc_from_scores,
)

__all__ = [
    "REPORT_KEYS",
    "SCORES",
    "adaece",
    "aupr_from_scores",
    "auroc_from_scores",
    "brier",
    "calibration_report",
    "classwise_ece",
    "ece",
    "ece_debiased",
    "ece_sweep",
    "energy",
    "entropy",
    "error",
    "fpr95_from_scores",
    "fpr_at_95_tpr",
    "mce",
    "msp",
    "nll",
    "ood_aupr",
    "ood_auroc",
    "ood_score",
    "reliability_table",
    "roc_curve_points",
    "roc_from_scores",
    "smece",
]
