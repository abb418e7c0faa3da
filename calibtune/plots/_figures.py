"""Figures from the data a trial leaves in its artifacts directory (never imported by the core).

Inputs are the JSON-ready structures the trial writes: reliability tables (``reliability.json``:
method -> {count, lower, upper, conf, acc, gap}), the adaptive loss's update history
(``gamma_history.json``: list of {gammas, edges, c_val, a_val, switched, ...}) and ROC points
(``roc.json``: "<ood set>/<score>[@ts]" -> {fpr, tpr}) and metrics under dataset shift
(``shift.json``, `calibtune.plots._shift`).

Figures are built with the object API (`matplotlib.figure.Figure`, Agg canvas) and fixed
margins: importing ``matplotlib.pyplot`` and ``tight_layout`` (a second text-layout pass) were
most of a quickstart trial's figure time (issue 13; bench/bench_trial_overhead.py).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from calibtune.plots._layout import TITLE_Y, margins
from calibtune.plots._render import drawing, save_png
from calibtune.plots._selective import plot_risk_coverage
from calibtune.plots._shift import plot_shift

__all__ = [
    "plot_gamma_dynamics",
    "plot_reliability",
    "plot_roc",
    "save_trial_figures",
]


def _nan(v: Any) -> np.ndarray:
    return np.asarray([np.nan if x is None else x for x in v], dtype=float)


def plot_reliability(tables: Mapping[str, Mapping[str, Sequence[float]]]) -> Figure:
    """One reliability diagram per table: accuracy per equal-width bin vs the diagonal.

    Bars show bin accuracy; the red part is the gap to mean confidence; the title carries the
    ECE recomputed from the table, ``Σ_b (n_b/N) |conf_b − acc_b|``.
    """
    n = max(1, len(tables))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(3.6 * cols, 3.6 * rows))
    # one accuracy scale: the y tick labels and label only on the first column
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True)
    for i, (ax, (name, t)) in enumerate(zip(axes.flat, tables.items(), strict=False)):
        lower, upper = _nan(t["lower"]), _nan(t["upper"])
        acc, conf, count = _nan(t["acc"]), _nan(t["conf"]), _nan(t["count"])
        width = upper - lower
        ok = count > 0
        ax.bar(lower[ok], acc[ok], width=width[ok], align="edge", edgecolor="k", label="accuracy")
        ax.bar(
            lower[ok],
            conf[ok] - acc[ok],
            bottom=acc[ok],
            width=width[ok],
            align="edge",
            color="tab:red",
            alpha=0.4,
            label="gap",
        )
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        total = count[ok].sum()
        ece = float((count[ok] / total * np.abs(conf[ok] - acc[ok])).sum()) if total else 0.0
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="" if i % cols else "accuracy")
        ax.set_title(f"{name} (ECE {100 * ece:.2f}%)", y=TITLE_Y)
        ax.legend(loc="upper left", fontsize=7)
    for ax in list(axes.flat)[len(tables) :]:
        ax.axis("off")
    margins(fig, left=0.5, bottom=0.45, top=0.3, wspace=0.6, hspace=0.75)
    return fig


def plot_gamma_dynamics(history: Sequence[Mapping[str, Any]]) -> Figure:
    """γ per validation bin vs update (AdaFocal Fig. 5 style), with switch events marked.

    Top: γ_b after each update; a marker where bin b switched between focal and inverse-focal.
    Bottom: C_val − A_val per bin (positive means over-confident).
    """
    fig = Figure(figsize=(7, 6))
    ax_g, ax_d = fig.subplots(2, 1, sharex=True)
    margins(fig, left=0.85, bottom=0.45, top=0.3, hspace=0.1)
    if not history:
        ax_g.set_title("no adaptive-loss updates", y=TITLE_Y)
        return fig
    nb = max(len(r.get("gammas") or []) for r in history)
    steps = np.arange(1, len(history) + 1)
    gam = np.full((len(history), nb), np.nan)
    gap = np.full((len(history), nb), np.nan)
    sw = np.zeros((len(history), nb), dtype=bool)
    for i, r in enumerate(history):
        g = _nan(r.get("gammas") or [])
        gam[i, : len(g)] = g
        c, a = _nan(r.get("c_val") or []), _nan(r.get("a_val") or [])
        m = min(len(c), len(a))
        gap[i, :m] = c[:m] - a[:m]
        s = r.get("switched")
        if isinstance(s, Sequence) and not isinstance(s, str):
            s = np.asarray(s, dtype=bool)
            sw[i, : len(s)] = s
    cmap = colormaps["viridis"].resampled(max(nb, 2))
    for b in range(nb):
        ax_g.plot(steps, gam[:, b], color=cmap(b), lw=1, label=f"bin {b}" if nb <= 15 else None)
        ax_d.plot(steps, gap[:, b], color=cmap(b), lw=1)
        hit = sw[:, b]
        if hit.any():
            ax_g.scatter(steps[hit], gam[hit, b], marker="x", color="tab:red", zorder=3)
    ax_g.axhline(0, color="k", lw=0.5)
    ax_d.axhline(0, color="k", lw=0.5)
    ax_g.set_ylabel("γ")
    ax_d.set_ylabel("C_val − A_val")
    ax_d.set_xlabel("update")
    ax_g.set_title("adaptive γ per validation bin (× = focal/inverse-focal switch)", y=TITLE_Y)
    if nb <= 15:
        ax_g.legend(fontsize=6, ncol=5)
    return fig


def plot_roc(curves: Mapping[str, Mapping[str, Sequence[float]]]) -> Figure:
    """ROC curves (OOD positive) for every "<set>/<score>[@ts]" entry."""
    fig = Figure(figsize=(5, 5))
    ax = fig.subplots()
    for key, c in curves.items():
        fpr, tpr = _nan(c["fpr"]), _nan(c["tpr"])
        auc = float(np.trapezoid(tpr, fpr)) if len(fpr) > 1 else float("nan")
        ax.plot(fpr, tpr, lw=1, ls="--" if key.endswith("@ts") else "-", label=f"{key} ({auc:.3f})")
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    ax.set(xlabel="false-positive rate", ylabel="true-positive rate", xlim=(0, 1), ylim=(0, 1))
    ax.set_title("OOD detection ROC", y=TITLE_Y)
    if curves:
        ax.legend(fontsize=6, loc="lower right")
    margins(fig, left=0.5, bottom=0.45, top=0.3)
    return fig


def save_trial_figures(artifacts_dir: str | os.PathLike[str]) -> list[Path]:
    """Render every figure whose data file exists in ``artifacts_dir`` into ``figures/``
    (`calibtune.plots._render.drawing`: unhinted text, the garbage collector paused)."""
    d = Path(artifacts_dir)
    out_dir = d / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = (
        ("reliability.json", plot_reliability, "reliability.png"),
        ("gamma_history.json", plot_gamma_dynamics, "gamma_dynamics.png"),
        ("roc.json", plot_roc, "roc.png"),
        ("shift.json", plot_shift, "shift.png"),
        ("risk_coverage.json", plot_risk_coverage, "risk_coverage.png"),
    )
    written: list[Path] = []
    with drawing():
        for source, plot, name in plots:
            if (d / source).is_file() and (data := json.loads((d / source).read_text())):
                written.append(save_png(plot(data), out_dir / name))
    return written
