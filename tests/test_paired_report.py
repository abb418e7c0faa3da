"""`calibtune report STUDY --baseline LOSS` end to end: a real two-loss, two-seed, one-epoch study
(Ray Tune + MLflow SQLite in tmp), read back through the saved test predictions."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from calibtune.cli import main
from calibtune.record._tracking import PARENT
from calibtune.study import load_study, run_study

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _study(tmp: Path) -> Path:
    raw = {
        "name": "paired",
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 128},
            "eval": {"posthoc": ["ts"], "figures": False, "bootstrap": 0},
        },
        "losses": [
            "cross_entropy",
            {"name": "focal", "label": "focal_g3", "params": {"gamma": 3.0}},
        ],
        "search": {
            "sampler": "grid",
            "num_samples": 2,
            "max_concurrent": 1,
            "seeds": [1, 2],
            "objectives": [{"metric": "val/ece@ts", "mode": "min"}],
        },
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": "paired"},
        "storage": str(tmp / "studies"),
    }
    path = tmp / "paired.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _seed_metrics(outcome, label: str) -> dict[str, dict[str, float]]:
    """seed -> metrics of the seed runs of the trial with this loss label."""
    client = MlflowClient(outcome.tracking_uri)
    trials = client.search_runs(
        [outcome.experiment_id], f"tags.`{PARENT}` = '{outcome.parent_run_id}'"
    )
    (trial,) = [t for t in trials if t.data.params.get("loss_label") == label]
    seeds = client.search_runs([outcome.experiment_id], f"tags.`{PARENT}` = '{trial.info.run_id}'")
    return {r.data.params["seed"]: r.data.metrics for r in seeds}


def test_paired_report_against_a_baseline(tmp_path, capsys, ray_session):
    path = _study(tmp_path)
    outcome = run_study(load_study(path), verbose=0)
    assert outcome.counts.get("finished") == 2, outcome.counts
    capsys.readouterr()
    assert main(["report", str(path), "--baseline", "cross_entropy", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {(r["loss"], r["method"], r["metric"]) for r in rows} == {
        ("focal_g3", m, k) for m in ("none", "ts") for k in ("ece", "adaece", "error")
    }
    base, focal = _seed_metrics(outcome, "cross_entropy"), _seed_metrics(outcome, "focal_g3")
    assert set(base) == set(focal) == {"1", "2"}
    for r in rows:
        name = f"test/{r['metric']}" + ("" if r["method"] == "none" else f".{r['method']}")
        want = 100 * sum(focal[s][name] - base[s][name] for s in ("1", "2")) / 2
        assert float(r["diff"]) == pytest.approx(want, abs=1e-9), r
        low, high = float(r["ci_low"]), float(r["ci_high"])
        assert low <= high and r["seeds"] == "2"
        assert r["resolved"] == ("yes" if low > 0 or high < 0 else "no")

    assert main(["report", str(path), "--baseline", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "calibtune report: error: --baseline: expected one of the study's losses "
        "(cross_entropy, focal_g3), got 'nope'"
    ]
