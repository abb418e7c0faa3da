"""Study-level figures for the parent run: computing (pure, numpy) apart from plotting.

Inputs are plain arrays taken from the comparison frame (one row per ended trial, in start
order): objective values, searched hyperparameters, validation ECE before/after temperature
scaling, and Optuna's parameter importances.

Fixed margins (`calibtune.plots._layout`), no ``tight_layout``: its second text-layout pass was
about half of each refresh of the parent run's summary (issue 13, bench/README.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from calibtune.plots._layout import TITLE_Y, margins

__all__ = [
    "param_positions",
    "plot_importances",
    "plot_metric_vs_params",
    "plot_objective_history",
    "plot_pareto",
    "running_best",
]


def running_best(values: Sequence[float], mode: str) -> np.ndarray:
    """Best value so far after each trial, shape (n,); NaN (failed trials) are skipped:
    ``b_i = min_{j<=i} v_j`` (``max`` for ``mode="max"``), NaN until the first value."""
    v = np.asarray(values, dtype=float)
    fill = np.inf if mode == "min" else -np.inf
    acc = (np.minimum if mode == "min" else np.maximum).accumulate(np.where(np.isnan(v), fill, v))
    return np.where(np.isinf(acc), np.nan, acc)


def param_positions(values: Sequence[Any]) -> tuple[np.ndarray, list[str] | None]:
    """x positions of one hyperparameter's values (n,): the numbers themselves, or for
    categorical values the index of each distinct value (returned as tick labels); missing
    (``None``/NaN: a trial whose loss has no such parameter) -> NaN."""
    present = [v for v in values if not _missing(v)]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return np.asarray([np.nan if _missing(v) else float(v) for v in values]), None
    labels = sorted({str(v) for v in present})
    index = {s: i for i, s in enumerate(labels)}
    return np.asarray([np.nan if _missing(v) else index[str(v)] for v in values], float), labels


def _figure(figsize: tuple[float, float]) -> Figure:
    """A figure of the object API on an Agg canvas: no pyplot (no global registry to close, no
    GUI backend; the summary is drawn from a thread of the study driver)."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


def plot_objective_history(values: Sequence[float], objective: str, mode: str) -> Figure:
    """Objective per trial in start order (dots; failed trials absent) and the best so far."""
    v = np.asarray(values, dtype=float)
    x = np.arange(1, len(v) + 1)
    fig = _figure((6, 3.5))
    ax = fig.subplots()
    ax.plot(x, v, "o", label=objective)
    ax.step(x, running_best(v, mode), where="post", color="C3", label=f"best so far ({mode})")
    ax.set_xlabel("trial (start order)")
    ax.set_ylabel(objective)
    ax.legend(fontsize=8)
    margins(fig, left=0.9, bottom=0.5, top=0.15)
    return fig


def plot_metric_vs_params(
    params: Mapping[str, Sequence[Any]], series: Mapping[str, Sequence[float]]
) -> Figure:
    """One panel per searched hyperparameter: each metric of ``series`` (e.g. val ECE before
    and after TS) against the parameter's value, for the trials that have the parameter."""
    names = list(params) or ["(no searched parameters)"]
    fig = _figure((3.2 * len(names), 3))
    # the same metrics in every panel: one y scale, its tick labels on the first panel only
    axes = fig.subplots(1, len(names), squeeze=False, sharey=True)
    longest = 0  # characters of the longest categorical tick label (rotated 30°)
    for ax, name in zip(axes[0], names, strict=True):
        ax.set_title(name, fontsize=9, y=TITLE_Y)
        if name not in params:
            continue
        x, labels = param_positions(params[name])
        for i, (label, y) in enumerate(series.items()):
            ax.plot(x, np.asarray(y, float), "o^"[i % 2], alpha=0.7, label=label)
        if labels is not None:
            ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
            longest = max([longest, *map(len, labels)])
    if params:  # else nothing is drawn, and an empty legend warns on the study's terminal
        axes[0][0].legend(fontsize=7)
    # 7 pt labels at 30°: about 0.05 in per character, half of it vertical
    margins(fig, left=0.6, bottom=0.3 + 0.03 * longest, top=0.3, wspace=0.3)
    return fig


def plot_pareto(values: Any, mask: Any, names: Sequence[str]) -> Figure:
    """Trials in the plane of the first two objectives (n, 2); the Pareto-optimal ones (mask)
    highlighted and joined."""
    v = np.asarray(values, dtype=float)[:, :2]
    m = np.asarray(mask, dtype=bool)
    fig = _figure((4.5, 4))
    ax = fig.subplots()
    ax.plot(v[~m, 0], v[~m, 1], "o", color="0.6", label="dominated")
    front = v[m][np.argsort(v[m, 0])]
    ax.plot(front[:, 0], front[:, 1], "o-", color="C3", label="Pareto front")
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.legend(fontsize=8)
    margins(fig, left=0.9, bottom=0.5, top=0.15)
    return fig


def plot_importances(importances: Mapping[str, float]) -> Figure:
    """Horizontal bars of Optuna's parameter importances (largest on top)."""
    items = sorted(importances.items(), key=lambda kv: kv[1])
    # room for the longest parameter name at 10 pt (about 0.075 in per character), and axes
    # as wide as the axis label's second line
    left = 0.2 + 0.075 * max((len(k) for k, _ in items), default=4)
    fig = _figure((max(5.0, left + 3.7), 0.4 * len(items) + 1))
    ax = fig.subplots()
    ax.barh([k for k, _ in items], [v for _, v in items], color="C0")
    ax.set_xlabel("importance\n(optuna.importance.get_param_importances)")
    margins(fig, left=left, bottom=0.7, top=0.15)
    return fig
