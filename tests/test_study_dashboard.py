"""The study's dashboards without Ray: experiment tags, adaptive summaries, parent-run summary,
Optuna storage; real MLflow SQLite stores and real Optuna storages."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from calibtune.metrics import keys as K
from calibtune.study._tracking import EXPERIMENT_TAGS, MlflowTrialCallback, experiment_id


def test_experiments_open_on_training_runs_new_and_reused(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    old = client.create_experiment("made-elsewhere")  # reused by calibtune: tagged too
    assert "mlflow.experimentKind" not in client.get_experiment(old).tags
    assert experiment_id(uri, "made-elsewhere") == old
    new = experiment_id(uri, "calibtune/new")
    for exp_id in (old, new):
        tags = client.get_experiment(exp_id).tags
        assert tags["mlflow.experimentKind"] == "custom_model_development"
        assert tags["mlflow.note.content"] == EXPERIMENT_TAGS["mlflow.note.content"]


def test_adaptive_summary_values():
    s = K.adaptive_summary([-1.0, 2.0, 5.0], [0.1, -0.3], 4)
    assert s == {
        "adaptive/gamma_min": -1.0,
        "adaptive/gamma_mean": 2.0,
        "adaptive/gamma_max": 5.0,
        "adaptive/inverse_bins": 1.0,
        "adaptive/gap_absmax": 0.3,
        "adaptive/updates": 4.0,
    }
    assert set(s) <= K.epoch_keys(adaptive=True)
    assert K.is_adaptive_list("adaptive/gammas") and not K.is_adaptive_list("adaptive/gamma_max")


def _epoch(n_bins: int) -> dict:
    gammas = [float(i) - 1.0 for i in range(n_bins)]
    gap = [0.01 * i for i in range(n_bins)]
    return {
        "val/ece": 0.1,
        "adaptive/gammas": gammas,
        "adaptive/edges": [i / n_bins for i in range(n_bins)],
        "adaptive/gap": gap,
        **K.adaptive_summary(gammas, gap, 1),
    }


@pytest.mark.parametrize("log_bins", [False, True])
def test_adaptive_state_logs_summaries_unless_every_bin_is_asked_for(tmp_path, log_bins):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(experiment_id(uri, "x")).info.run_id
    MlflowTrialCallback(uri, run_id, log_bins=log_bins).on_epoch(1, _epoch(30))
    names = set(client.get_run(run_id).data.metrics)
    adaptive = {n for n in names if n.startswith("adaptive")}
    if log_bins:
        assert "adaptive/gammas/bin_29" in adaptive and len(adaptive) == 90 + 6
    else:
        assert len(adaptive) <= 8, sorted(adaptive)
        assert adaptive == {f"adaptive/{n}" for n in K.ADAPTIVE_SUMMARY}
    assert client.get_run(run_id).data.metrics["adaptive/inverse_bins"] == 1.0


def test_log_adaptive_bins_is_a_checked_trial_option():
    from calibtune.trial import config_from_dict

    assert config_from_dict({"eval": {"log_adaptive_bins": True}}).eval.log_adaptive_bins is True
    assert config_from_dict({}).eval.log_adaptive_bins is False
    with pytest.raises(Exception, match=r"eval\.log_adaptive_bins: expected"):
        config_from_dict({"eval": {"log_adaptive_bins": "yes"}})
