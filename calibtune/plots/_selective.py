"""Risk–coverage figure from a trial's ``risk_coverage.json`` (method -> {coverage, risk,
generalized_risk}, written by `calibtune.training.evaluate_final`); data only, no metrics code."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from calibtune.plots._layout import TITLE_Y, margins

__all__ = ["plot_risk_coverage"]


def plot_risk_coverage(curves: Mapping[str, Mapping[str, Sequence[float]]]) -> Figure:
    """Left: selective risk vs coverage (AURC = its mean); right: generalised risk (AUGRC).

    One line per method; the legend carries each area recomputed from the (thinned) points with
    the trapezoid rule, so it can differ slightly from the logged ``aurc``/``augrc``.
    """
    fig = Figure(figsize=(9, 4))
    ax_r, ax_g = fig.subplots(1, 2)
    for method, c in curves.items():
        cov = np.asarray(c["coverage"], dtype=float)
        for ax, name in ((ax_r, "risk"), (ax_g, "generalized_risk")):
            y = np.asarray(c[name], dtype=float)
            area = float(np.trapezoid(y, cov)) if len(cov) > 1 else float("nan")
            ax.plot(cov, y, lw=1, label=f"{method} ({area:.4f})")
    ax_r.set(xlabel="coverage", ylabel="selective risk", xlim=(0, 1))
    ax_g.set(xlabel="coverage", ylabel="generalised risk", xlim=(0, 1))
    ax_r.set_title("risk–coverage (AURC)", y=TITLE_Y)
    ax_g.set_title("generalised (AUGRC)", y=TITLE_Y)
    for ax in (ax_r, ax_g):
        ax.set_ylim(bottom=0)
        if curves:
            ax.legend(fontsize=7, loc="upper left")
    margins(fig, left=0.65, bottom=0.45, top=0.3, wspace=0.25)
    return fig
