"""Figures from trial artifacts (matplotlib); consumes data only, never imported by the core."""

from calibtune.plots._figures import (
    plot_gamma_dynamics,
    plot_reliability,
    plot_roc,
    save_trial_figures,
)
from calibtune.plots._render import drawing, save_png
from calibtune.plots._selective import plot_risk_coverage
from calibtune.plots._shift import plot_shift

__all__ = [
    "drawing",
    "plot_gamma_dynamics",
    "plot_reliability",
    "plot_risk_coverage",
    "plot_roc",
    "plot_shift",
    "save_png",
    "save_trial_figures",
]
