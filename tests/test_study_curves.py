"""Learning curves in the persisted Optuna study, without Ray: per-epoch objectives read back from
real MLflow child runs (SQLite) become each Optuna trial's intermediate values, once."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.test_study_dashboard import _study_file


def _child(client, exp_id, parent, trial_id, values):
    from calibtune.record._tracking import PARENT, TAG_TRIAL, log_metrics

    run = client.create_run(exp_id, tags={PARENT: parent, TAG_TRIAL: trial_id})
    for epoch, v in enumerate(values):  # as MlflowTrialCallback logs an epoch: step=epoch
        log_metrics(client.tracking_uri, run.info.run_id, {"val/ece@ts": v, "epoch": epoch}, epoch)
    return run.info.run_id


def test_intermediate_values_come_from_the_child_runs_once(tmp_path):
    from calibtune.readers._summary import load_optuna_study, refresh_summary
    from calibtune.record._curves import objective_curves

    study = _study_file(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("dash")
    parent = client.create_run(exp_id).info.run_id
    _child(client, exp_id, parent, "a", [0.30, 0.20, 0.15])
    _child(client, exp_id, parent, "b", [0.40, float("nan")])  # a NaN epoch is left out
    curves = objective_curves(uri, exp_id, parent, "val/ece@ts", ["a", "b", "missing"])
    assert curves == {"a": {0: 0.30, 1: 0.20, 2: 0.15}, "b": {0: 0.40}}

    done = {"calibtune/done": 1, "val/ece@ts": 0.15}
    ended = [
        ("a", {"loss": "cross_entropy"}, done, False),
        ("b", {"loss": "cross_entropy"}, {}, False),
    ]
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    for _ in range(2):  # a resumed study's driver records the same ended trials again
        assert refresh_summary(study, uri, exp_id, parent, storage, ended=ended) is None
    trials = load_optuna_study("dash", storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED"]
    assert [t.intermediate_values for t in trials] == [{0: 0.30, 1: 0.20, 2: 0.15}, {0: 0.40}]


def test_a_several_seed_trials_curve_is_the_mean_of_its_seed_runs(tmp_path):
    from calibtune.record._curves import objective_curves
    from calibtune.record._tracking import PARENT, TAG_KIND, log_metrics

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("seeds")
    parent = client.create_run(exp_id).info.run_id
    trial = _child(client, exp_id, parent, "a", [0.9])  # only the seed mean of the last epoch
    for values in ([0.4, 0.2], [0.2, 0.1, 0.05]):  # the second seed ran one epoch further
        seed = client.create_run(exp_id, tags={PARENT: trial, TAG_KIND: "seed"}).info.run_id
        for epoch, v in enumerate(values):
            log_metrics(uri, seed, {"val/ece@ts": v}, epoch)
    curves = objective_curves(uri, exp_id, parent, "val/ece@ts", ["a"])
    assert curves == {"a": {0: pytest.approx(0.3), 1: pytest.approx(0.15)}}
