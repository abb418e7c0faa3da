"""The numerics demo (`make demo`): every metric before and after every post-hoc method."""

from __future__ import annotations

from calibtune.demo import demo_table, main, synthetic_overconfident
from calibtune.metrics import REPORT_KEYS
from calibtune.posthoc import build_posthoc, list_posthoc


def test_synthetic_model_is_calibrated_at_its_planted_temperature():
    from calibtune.metrics import ece

    logits, labels = synthetic_overconfident(n=20_000, scale=2.5, seed=1)
    import torch

    assert ece(torch.softmax(logits, 1), labels) > 0.1  # over-confident as produced
    assert ece(torch.softmax(logits / 2.5, 1), labels) < 0.01  # calibrated at T = 2.5


def test_demo_table_rows_columns_and_effect(capsys):
    table = demo_table(n=4000)
    assert list(table.index) == ["uncalibrated", *list_posthoc()]
    assert [c for c in table.columns if c != "fitted"] == list(REPORT_KEYS)
    assert table.loc["ts", "ece"] < table.loc["uncalibrated", "ece"] / 3
    assert "T=" in table.loc["ts", "fitted"]
    # methods that keep the predicted class keep the error; the others may change it
    keeps = ["uncalibrated"] + [n for n in list_posthoc() if build_posthoc(n).preserves_argmax]
    assert table.loc[keeps, "error"].nunique() == 1 and len(keeps) >= 8
    assert main(["--n", "2000"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert {"uncalibrated", *list_posthoc()} <= set(rows)
