"""Figures consume only trial data: they render, and what they annotate is computed correctly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from calibtune.plots import plot_gamma_dynamics, plot_reliability, plot_roc, save_trial_figures

# two bins with data: (0.5, 0.6] holds 3 samples at conf 0.55 / acc 1/3,
# (0.9, 1.0] holds 1 sample at conf 0.95 / acc 1; ECE = 3/4·|0.55−1/3| + 1/4·|0.95−1| = 0.175
TABLE = {
    "count": [0, 3, 1],
    "lower": [0.0, 0.5, 0.9],
    "upper": [0.5, 0.6, 1.0],
    "conf": [None, 0.55, 0.95],
    "acc": [None, 1 / 3, 1.0],
    "gap": [None, 0.55 - 1 / 3, -0.05],
}


def test_reliability_title_carries_the_table_ece() -> None:
    # the same bins with the counts moved: ECE = 1/4·|0.55−1/3| + 3/4·|0.95−1| = 0.091667
    other = {**TABLE, "count": [0, 1, 3]}
    fig = plot_reliability({"uncalibrated": TABLE, "ts": other})
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["uncalibrated (ECE 17.50%)", "ts (ECE 9.17%)"]


def test_gamma_dynamics_marks_switches() -> None:
    hist = [
        {
            "gammas": [1.0, 2.0],
            "c_val": [0.6, 0.9],
            "a_val": [0.5, 0.8],
            "switched": [False, False],
        },
        {
            "gammas": [-1.0, 2.5],
            "c_val": [0.4, 0.9],
            "a_val": [0.5, 0.8],
            "switched": [True, False],
        },
    ]
    fig = plot_gamma_dynamics(hist)
    ax_g, ax_d = fig.axes
    assert len(ax_g.lines) >= 2
    xs = [c.get_offsets() for c in ax_g.collections]
    assert len(xs) == 1 and np.allclose(xs[0], [[2, -1.0]])  # one switch: update 2, bin 0
    np.testing.assert_allclose(ax_d.lines[0].get_ydata(), [0.1, -0.1], atol=1e-12)


def test_roc_legend_has_auc() -> None:
    # area under (0, 0), (0.5, 1), (1, 1): 0.5·1/2 + 0.5·1 = 0.75; a perfect curve: 1
    fig = plot_roc(
        {
            "noise/entropy": {"fpr": [0, 0.5, 1], "tpr": [0, 1, 1]},
            "noise/msp@ts": {"fpr": [0, 0, 1], "tpr": [0, 1, 1]},
        }
    )
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["noise/entropy (0.750)", "noise/msp@ts (1.000)"]


def test_save_trial_figures_from_artifact_files(tmp_path: Path) -> None:
    (tmp_path / "reliability.json").write_text(json.dumps({"uncalibrated": TABLE}))
    (tmp_path / "gamma_history.json").write_text(json.dumps([]))  # not adaptive: no figure
    (tmp_path / "roc.json").write_text(json.dumps({"a/msp": {"fpr": [0, 1], "tpr": [0, 1]}}))
    written = save_trial_figures(tmp_path)
    assert sorted(p.name for p in written) == ["reliability.png", "roc.png"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_plots_and_ray_never_imported_by_the_core_or_the_loop() -> None:
    import ast

    root = Path(__file__).resolve().parents[1] / "calibtune"
    for pkg in ("training", "metrics", "losses", "posthoc"):
        for f in (root / pkg).glob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                for n in names:
                    assert not n.startswith(("calibtune.plots", "calibtune.trial", "ray")), (f, n)
                    assert not n.startswith(("matplotlib", "mlflow", "optuna")), (f, n)


@pytest.mark.parametrize("empty", [[], None])
def test_gamma_dynamics_without_updates(empty: list | None) -> None:
    fig = plot_gamma_dynamics(empty)
    assert fig.axes[0].get_title() == "no adaptive-loss updates"


def test_trial_figures_register_nothing_with_pyplot() -> None:
    """The shift and risk–coverage figures use the object API: rendering one per trial never
    fills pyplot's global registry (which warned after 20 figures and kept each alive)."""
    import matplotlib.pyplot as plt

    from calibtune.plots import plot_risk_coverage, plot_shift

    curve = {"severities": [1, 2], "ece": {"uncalibrated": [0.1, 0.2], "ts": [0.05, None]}}
    rc = {
        "uncalibrated": {"coverage": [0.5, 1.0], "risk": [0.0, 0.5], "generalized_risk": [0, 0.5]}
    }
    before = plt.get_fignums()
    for _ in range(3):
        shift = plot_shift({"shift": {"noise": curve}, "val_shift": {"noise": curve}})
        risk = plot_risk_coverage(rc)
    assert plt.get_fignums() == before
    assert [len(ax.lines) for ax in shift.axes] == [2, 2]  # one line per method, per side
    assert [ax.get_title() for ax in shift.axes] == ["noise (test)", "noise (validation)"]
    labels = [t.get_text() for t in risk.axes[0].get_legend().get_texts()]
    assert labels == ["uncalibrated (0.1250)"]  # trapezoid: ½·0.5·(0 + 0.5)
