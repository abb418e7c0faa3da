"""The dataset-shift figure: each metric vs corruption severity, one line per post-hoc method.

Input: ``shift.json`` as `calibtune.training.shift_metrics` writes it,
``{side: {set: {"severities": [k…], metric: {method: [value per severity]}}}}`` with side
``shift`` (corrupted test split) or ``val_shift`` (corrupted validation split).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from calibtune.plots._layout import TITLE_Y, margins

__all__ = ["plot_shift"]

_SIDE = {"shift": "test", "val_shift": "validation"}


def plot_shift(data: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Figure:
    """One row per (side, set), one column per metric; x: severity, y: the metric (in % for
    error/ECE/AdaECE), one line per method (``uncalibrated`` solid black). Object API with
    fixed margins (`calibtune.plots._layout`): no pyplot, nothing registered globally."""
    rows = [(side, name, c) for side, sets in data.items() for name, c in sets.items()]
    metrics = [m for m in rows[0][2] if m != "severities"] if rows else []
    n_rows, n_cols = max(1, len(rows)), max(1, len(metrics))
    fig = Figure(figsize=(3.2 * n_cols, 2.8 * n_rows))
    # every row on the same severities: one x axis, its tick labels on the bottom row only
    shared = len({tuple(c["severities"]) for _, _, c in rows}) == 1
    axes = fig.subplots(n_rows, n_cols, squeeze=False, sharex=shared)
    for r, (side, name, curve) in enumerate(rows):
        sev = np.asarray(curve["severities"], dtype=float)
        for c, metric in enumerate(metrics):
            ax = axes[r, c]
            scale = 1.0 if metric == "nll" else 100.0
            for method, values in curve[metric].items():
                y = scale * np.asarray([np.nan if v is None else v for v in values], dtype=float)
                style = {"color": "k", "lw": 2} if method == "uncalibrated" else {"lw": 1}
                ax.plot(sev, y, marker="o", ms=3, label=method, **style)
            ax.set_xticks(sev)
            ax.set_xlabel("severity" if not shared or r == n_rows - 1 else "")
            ax.set_ylabel(metric if metric == "nll" else f"{metric} (%)")
            ax.set_title(f"{name} ({_SIDE.get(side, side)})", fontsize=8, y=TITLE_Y)
    if rows and metrics:
        axes[0, 0].legend(fontsize=6)
    margins(fig, left=0.65, bottom=0.45, top=0.3, wspace=0.4, hspace=0.45)
    return fig
