"""The figures' cheaper drawing (issue 13, `calibtune.plots._render`): it leaves the process as it
found it (garbage collector, rcParams), and panels on one scale share it, their inner tick
labels hidden, while panels on different scales keep their own."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import matplotlib as mpl
import pytest

from calibtune.plots import plot_reliability, plot_shift, save_trial_figures
from calibtune.plots._render import drawing
from calibtune.plots._study import plot_metric_vs_params

TABLE = {"count": [2, 1], "lower": [0.0, 0.5], "upper": [0.5, 1.0], "conf": [0.3, 0.9]}
TABLE |= {"acc": [0.5, 1.0], "gap": [-0.2, -0.1]}


def _inner_labels_hidden(ax, axis: str) -> bool:
    return not any(t.get_visible() for t in getattr(ax, f"get_{axis}ticklabels")())


@pytest.mark.parametrize("enabled", [True, False])
def test_drawing_restores_the_collector_and_rcparams(enabled: bool, tmp_path: Path) -> None:
    hinting = mpl.rcParams["text.hinting"]
    (tmp_path / "reliability.json").write_text(json.dumps({"uncalibrated": TABLE}))
    (gc.enable if enabled else gc.disable)()
    try:
        with drawing():
            assert not gc.isenabled()
            assert mpl.rcParams["text.hinting"] == "no_hinting"
        assert gc.isenabled() is enabled
        assert [p.name for p in save_trial_figures(tmp_path)] == ["reliability.png"]
        assert gc.isenabled() is enabled
        assert mpl.rcParams["text.hinting"] == hinting
    finally:
        gc.enable()


def test_reliability_panels_share_the_accuracy_scale() -> None:
    fig = plot_reliability({"uncalibrated": TABLE, "ts": TABLE, "focal_ts": TABLE})
    first, *inner = fig.axes
    assert first.get_ylabel() == "accuracy" and not _inner_labels_hidden(first, "y")
    for ax in inner:
        assert ax.get_ylabel() == "" and _inner_labels_hidden(ax, "y")
        assert ax.get_xlabel() == "confidence" and not _inner_labels_hidden(ax, "x")


def _curve(severities: list[int]) -> dict:
    return {"severities": severities, "ece": {"uncalibrated": [0.1] * len(severities)}}


def test_shift_rows_share_severities_only_when_they_have_the_same() -> None:
    same = plot_shift({"shift": {"n": _curve([1, 2, 3])}, "val_shift": {"n": _curve([1, 2, 3])}})
    top, bottom = same.axes
    assert (top.get_xlabel(), bottom.get_xlabel()) == ("", "severity")
    assert _inner_labels_hidden(top, "x") and not _inner_labels_hidden(bottom, "x")
    other = plot_shift({"shift": {"n": _curve([1, 2, 3])}, "val_shift": {"n": _curve([1, 3])}})
    assert [ax.get_xlabel() for ax in other.axes] == ["severity", "severity"]
    assert [list(ax.get_xticks()) for ax in other.axes] == [[1, 2, 3], [1, 3]]


def test_ece_vs_params_panels_share_the_metric_scale() -> None:
    fig = plot_metric_vs_params(
        {"focal.gamma": [1.0, 2.0, None], "loss": ["ce", "focal", "focal"]},
        {"val/ece": [0.1, 0.02, 0.05], "val/ece@ts": [0.05, 0.01, 0.3]},
    )
    a, b = fig.axes
    assert a.get_ylim() == b.get_ylim()  # 0.3 only plotted in the loss panel: one scale
    assert not _inner_labels_hidden(a, "y") and _inner_labels_hidden(b, "y")
