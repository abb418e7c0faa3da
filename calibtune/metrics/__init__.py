"""Calibration and OOD-detection metrics: pure functions over ``probs``/``logits`` and labels.

See `calibtune.metrics._calibration` for the binning conventions (they are part of the contract)
`calibtune.metrics._ood` for score orientation (OOD is the positive class),
`calibtune.metrics._selective` for AURC/AUGRC (ties averaged) and the refinement NLL, and
`calibtune.metrics._bootstrap` for vectorised bootstrap confidence intervals. The binning
conventions (`calibtune.metrics.binning`) and the input checks (`calibtune.metrics.validation`)
are public submodules: the losses and post-hoc methods reuse them.
"""

from calibtune._lazy import lazy_exports

# Lazy (PEP 562): `calibtune compare/report/export` read metric names through `keys` and must
# not pay for torch, which every other submodule imports.
_EXPORTS = {
    **dict.fromkeys(["binning", "keys", "validation"], ""),
    **dict.fromkeys(["REPORT_KEYS", "SELECTIVE_KEYS"], ".keys"),
    **dict.fromkeys(
        [
            "bootstrap_indices",
            "bootstrap_report",
            "bootstrap_top_label",
            "bootstrap_values",
            "percentile_ci",
        ],
        "._bootstrap",
    ),
    **dict.fromkeys(["augrc", "aurc", "risk_coverage", "selective_report"], "._selective"),
    **dict.fromkeys(
        [
            "adaece",
            "brier",
            "calibration_report",
            "classwise_ece",
            "ece",
            "ece_debiased",
            "ece_sweep",
            "error",
            "mce",
            "nll",
            "reliability_table",
            "smece",
        ],
        "._calibration",
    ),
    **dict.fromkeys(
        [
            "SCORES",
            "aupr_from_scores",
            "auroc_from_scores",
            "energy",
            "entropy",
            "fpr95_from_scores",
            "fpr_at_95_tpr",
            "msp",
            "ood_aupr",
            "ood_auroc",
            "ood_score",
            "roc_curve_points",
            "roc_from_scores",
        ],
        "._ood",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(k for k, where in _EXPORTS.items() if where)
