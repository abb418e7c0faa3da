"""Calibration and OOD-detection metrics: pure functions over ``probs``/``logits`` and labels.

See `calibtune.metrics._calibration` for the binning conventions (they are part of the contract)
`calibtune.metrics._ood` for score orientation (OOD is the positive class),
`calibtune.metrics._selective` for AURC/AUGRC (ties averaged) and the refinement NLL, and
`calibtune.metrics._bootstrap` for vectorised bootstrap confidence intervals. The binning
conventions (`calibtune.metrics.binning`) and the input checks (`calibtune.metrics.validation`)
are public submodules: the losses and post-hoc methods reuse them.
"""

from . import binning as binning
from . import keys as keys
from . import validation as validation
from ._bootstrap import (
    bootstrap_indices,
    bootstrap_report,
    bootstrap_top_label,
    bootstrap_values,
    percentile_ci,
)
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
from ._selective import (
    SELECTIVE_KEYS,
    augrc,
    aurc,
    refinement_nll,
    risk_coverage,
    selective_report,
)

__all__ = [
    "REPORT_KEYS",
    "SCORES",
    "SELECTIVE_KEYS",
    "adaece",
    "augrc",
    "aupr_from_scores",
    "aurc",
    "auroc_from_scores",
    "bootstrap_indices",
    "bootstrap_report",
    "bootstrap_top_label",
    "bootstrap_values",
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
    "percentile_ci",
    "refinement_nll",
    "reliability_table",
    "risk_coverage",
    "roc_curve_points",
    "roc_from_scores",
    "selective_report",
    "smece",
]
