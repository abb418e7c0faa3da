"""``posthoc/<method>/T_at_edge`` (issue 31 item 5): a fitted temperature at an end of the range
its fit searched is flagged in the trial's own metrics, declared among the keys a trial reports,
and preferred by `calibtune report`'s mark over the study's grid tag."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from calibtune.metrics import keys as K
from calibtune.posthoc import build_posthoc, fitted_values, t_at_edge, t_range
from calibtune.readers._results import _report_row
from calibtune.training import evaluate_final
from calibtune.trial import config_from_dict

N, C = 400, 4


def _logits(scale: float, wrong_every: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot logits of height ``scale``; every ``wrong_every``-th sample's peak on a wrong
    class, so accuracy is 1 − 1/wrong_every whatever the scale."""
    y = torch.arange(N) % C
    z = scale * torch.nn.functional.one_hot(y, C).double()
    flip = torch.arange(N) % wrong_every == 0
    z[flip] = z[flip].roll(1, dims=1)
    return z, y


def test_the_range_is_the_grid_or_the_continuous_bounds():
    assert t_range(build_posthoc("ts")) == (0.1, 10.0)
    assert t_range(build_posthoc("ts", temperatures=[0.5, 2.0, 1.0])) == (0.5, 2.0)
    assert t_range(build_posthoc("ts_nll")) == (0.01, 100.0)  # continuous: its bounds
    assert t_range(build_posthoc("ts_nll", t_grid="ts")) == (0.1, 10.0)  # NLL over a grid
    assert t_range(build_posthoc("focal_ts")) == (0.01, 5.0)
    assert t_range(build_posthoc("isotonic")) is None and t_range(build_posthoc("ets")) is None


@pytest.mark.parametrize(
    ("method", "scale", "wrong_every", "edge", "t"),
    [
        ("ts", 0.05, 10, 1.0, 0.1),  # 90 % right at ~26 % confidence: T* ≈ 0.02 < the grid
        ("ts", 40.0, 2, 1.0, 10.0),  # 50 % right at ~100 %: T* beyond 10
        ("ts", 1.0, 5, 0.0, None),  # T* = 1/ln 12 ≈ 0.4: inside
        ("focal_ts", 0.005, 10, 1.0, 0.01),  # even γ_ev = 5 cannot sharpen it enough
        ("focal_ts", 30.0, 2, 1.0, 5.0),
        ("ts_nll", 0.01, 10, 1.0, 0.01),  # the continuous search stops at its lower bound
        ("ts_nll", 1.0, 5, 0.0, None),
    ],
)
def test_a_temperature_at_an_end_is_flagged_one_inside_zero(method, scale, wrong_every, edge, t):
    fitted = build_posthoc(method).fit(*_logits(scale, wrong_every))
    assert t_at_edge(fitted) == edge
    values = fitted_values(fitted)
    assert values[K.T_AT_EDGE] == edge and values["T"] == pytest.approx(fitted.T)
    if t is not None:
        assert pytest.approx(t, rel=1e-5) == fitted.T


def test_methods_without_a_temperature_search_log_no_flag():
    z, y = _logits(1.0, 5)
    assert K.T_AT_EDGE not in fitted_values(build_posthoc("isotonic").fit(z, y))
    assert t_at_edge(build_posthoc("ets").fit(z, y)) is None


def test_the_final_evaluation_logs_the_flag_and_the_trial_declares_it():
    z, y = _logits(0.005, 10)
    out = evaluate_final(z, y, z, y, posthoc={"ts": {}, "focal_ts": {}, "isotonic": {}})
    assert out.metrics["posthoc/ts/T_at_edge"] == 1.0 and out.metrics["posthoc/ts/T"] == 0.1
    assert out.metrics["posthoc/focal_ts/T_at_edge"] == 1.0
    assert out.posthoc_params["ts"][K.T_AT_EDGE] == 1.0
    assert not any(k.startswith("posthoc/isotonic/T_at") for k in out.metrics)
    inside = evaluate_final(*_logits(1.0, 5), *_logits(1.0, 5), posthoc={"ts": {}})
    assert inside.metrics["posthoc/ts/T_at_edge"] == 0.0
    cfg = config_from_dict(
        {"data": {"name": "digits"}, "eval": {"posthoc": {"ts": {}, "isotonic": {}}}}
    )
    keys = cfg.metric_keys()
    assert "posthoc/ts/T_at_edge" in keys and "posthoc/isotonic/T_at_edge" not in keys
    assert K.parse("posthoc/ts/T_at_edge") == K.MetricKey("posthoc", "T_at_edge", "ts")


def test_the_report_marks_from_the_trial_flag_before_the_grid_tag():
    row = pd.Series(
        {
            "trial_id": "t1",
            "test/error": 0.01,
            "test/ece": 0.02,
            "test/ece@ts": 0.01,
            "posthoc/ts/T": 0.3,
            "posthoc/ts/T_at_edge": 0.4,  # 2 of a trial's 5 seeds at the edge: mean T inside
        }
    )
    assert _report_row(row, {"ts": (0.1, 10.0)})["ECE (TS)"] == "1.00 (0.3⚠)"
    row["posthoc/ts/T_at_edge"] = 0.0
    row["posthoc/ts/T"] = 0.1  # the flag, not the grid, decides where it was logged
    assert _report_row(row, {"ts": (0.1, 10.0)})["ECE (TS)"] == "1.00 (0.1)"
