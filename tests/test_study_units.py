"""Study pieces that need no Ray: seed aggregation, samplers, the Pareto front, metric names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from calibtune.metrics.keys import from_mlflow
from calibtune.study import load_study
from calibtune.study._config import SAMPLERS
from calibtune.study._optuna import conditional_grid, define_by_run, make_sampler
from calibtune.study._results import pareto_mask
from calibtune.study._tracking import mlflow_metric_name, resolve_tracking_uri
from calibtune.study._trainable import aggregate

ROOT = Path(__file__).resolve().parents[1]


def test_aggregate_mean_and_population_std_over_seeds():
    out = aggregate([{"val/ece": 0.1, "x": 1.0}, {"val/ece": 0.3, "x": 3.0}])
    assert out["val/ece"] == pytest.approx(0.2)
    assert out["val/ece_std"] == pytest.approx(0.1)  # sqrt(((0.1)^2 + (0.1)^2) / 2)
    assert aggregate([{"a": 2.0}]) == {"a": 2.0}  # one seed: no _std


def test_pareto_front_hand_example():
    # (ece, error) minimise both: B dominates D; A, B, C trade off; E has NaN
    v = np.array([[0.1, 0.5], [0.2, 0.2], [0.5, 0.1], [0.3, 0.3], [np.nan, 0.0]])
    assert pareto_mask(v, ["min", "min"]).tolist() == [True, True, True, False, False]
    # maximising the second objective: A has the lowest ECE and the highest error -> only A
    assert pareto_mask(v[:4], ["min", "max"]).tolist() == [True, False, False, False]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_drives_the_conditional_space(tmp_path, sampler):
    raw = yaml.safe_load((ROOT / "studies" / "quickstart.yaml").read_text())
    raw["search"]["sampler"] = sampler
    if sampler == "grid":
        raw["losses"] = [
            "cross_entropy",
            {"name": "focal", "params": {"gamma": {"type": "categorical", "choices": [1.0, 2.0]}}},
        ]
        raw["search"]["num_samples"] = 3
    else:
        raw["losses"] = [
            {**item, "space": str(ROOT / "search_spaces" / Path(item["space"]).name)}
            if isinstance(item, dict) and "space" in item
            else item
            for item in raw["losses"]
        ]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    study = load_study(path)
    space = define_by_run(study)
    ostudy = optuna.create_study(sampler=make_sampler(study))
    if sampler == "grid":
        points = conditional_grid(study)
        assert points == [
            {"loss": "cross_entropy"},
            {"loss": "focal", "focal/gamma": 1.0},
            {"loss": "focal", "focal/gamma": 2.0},
        ]
        for p in points:
            ostudy.enqueue_trial(p)
    seen = []
    for i in range(6 if sampler != "grid" else 3):
        t = ostudy.ask()
        space(t)
        seen.append(t.params)
        assert all(k == "loss" or k.startswith(t.params["loss"] + "/") for k in t.params)
        ostudy.tell(t, float(i % 3))
    if sampler == "grid":
        assert seen == conditional_grid(study)


def test_metric_names_round_trip_through_mlflow():
    for name in ("test/ece@ts", "val/ece@focal_ts", "ood/svhn/auroc_msp@ts", "test/ece@ts_std"):
        mapped = mlflow_metric_name(name)
        assert "@" not in mapped
        assert from_mlflow(mapped) == name
    for name in ("test/ece", "posthoc/ts/T", "adaptive/gammas/bin_03", "val/ece_std"):
        assert from_mlflow(mlflow_metric_name(name)) == name


def test_tracking_uri_is_made_absolute(tmp_path):
    assert resolve_tracking_uri(None, tmp_path) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert resolve_tracking_uri("sqlite:///x.db", tmp_path) == f"sqlite:///{tmp_path / 'x.db'}"
    assert resolve_tracking_uri("http://127.0.0.1:5000", tmp_path) == "http://127.0.0.1:5000"
