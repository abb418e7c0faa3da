"""A study never trains one configuration twice, and resuming a finished study keeps its totals
(issue 24, items 3 and 5): real `calibtune run` and `resume` processes, a real local Ray, MLflow
on SQLite and the Optuna storage.

The space holds only ``cross_entropy``, which has no hyperparameters: the second trial is the
first one's configuration again and must reuse its result instead of training.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _calibtune(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "CALIBTUNE_MIN_FREE_MB": "8",
    }
    return subprocess.run(
        [sys.executable, "-m", "calibtune", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _write_study(tmp: Path, name: str, seeds: list[int]) -> None:
    raw = {
        "name": name,
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 64},
            "eval": {"posthoc": ["ts"], "figures": False},
        },
        "losses": ["cross_entropy"],  # no hyperparameters: every trial is the same config
        "search": {
            "sampler": "random",
            "num_samples": 2,
            "max_concurrent": 1,
            "objectives": ["val/ece"],
            "seeds": seeds,
        },
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": name},
        "storage": str(tmp / "studies"),
    }
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(raw))


@pytest.mark.timeout(300)
def test_a_repeated_configuration_reuses_the_result_and_resume_keeps_the_totals(tmp_path):
    _write_study(tmp_path, "twice", [1])
    run = _calibtune(tmp_path, "run", "twice.yaml")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("twice")
    trials = client.search_runs([exp.experiment_id], "tags.`calibtune.kind` = 'trial'")
    assert len(trials) == 2 and {t.data.tags["calibtune.status"] for t in trials} == {"finished"}
    reused = [t for t in trials if "calibtune.reused_from" in t.data.tags]
    trained = [t for t in trials if "calibtune.reused_from" not in t.data.tags]
    assert len(reused) == 1 and len(trained) == 1, [t.data.tags for t in trials]
    first, second = trained[0], reused[0]
    assert second.data.tags["calibtune.reused_from"] == first.data.tags["calibtune.trial_id"]
    for key in ("val/ece", "test/ece", "test/ece.ts", "epoch"):
        assert second.data.metrics[key] == first.data.metrics[key], key
    assert [m.step for m in client.get_metric_history(second.info.run_id, "val/ece")] == [1]
    arts = {a.path for a in client.list_artifacts(second.info.run_id)}
    assert "config.yaml" in arts  # `export` of the reused trial finds its config
    sdir = tmp_path / "studies" / "twice"
    trained_folders = [p.parent.name for p in sdir.glob("trials/*/result.json")]
    assert trained_folders == [f"{first.data.tags['calibtune.trial_id']}-seed1"]  # trained once
    said = f"same config as trial {first.data.tags['calibtune.trial_id']}: its result reused"
    assert sum(said in line for line in run.stdout.splitlines()) == 1, run.stdout

    import optuna  # told to Optuna with the same value

    ot = optuna.load_study(study_name="twice", storage=f"sqlite:///{sdir / 'optuna.db'}")
    assert [t.state.name for t in ot.trials] == ["COMPLETE", "COMPLETE"]
    assert ot.trials[0].values == ot.trials[1].values

    (parent,) = client.search_runs([exp.experiment_id], "tags.`calibtune.kind` = 'study'")
    total = parent.data.metrics["study/wall_time_s"]
    resume = _calibtune(tmp_path, "resume", str(sdir))
    assert resume.returncode == 0, resume.stdout[-3000:] + resume.stderr[-3000:]
    for noise in ("Failed to fetch metrics", "trial_fs_path", "Traceback", "Warning"):
        assert noise not in resume.stderr, resume.stderr[-3000:]
    after = client.get_run(parent.info.run_id).data.metrics
    session = after["study/session_wall_time_s"]
    assert after["study/wall_time_s"] == pytest.approx(total + session)  # the total is kept
    assert after["study/sessions"] == 2


# `long`: a reused result stays in `make test` as
# test_a_repeated_configuration_reuses_the_result_and_resume_keeps_the_totals
@pytest.mark.long
@pytest.mark.timeout(300)
def test_with_several_seeds_each_seed_run_and_the_trial_run_say_they_reused(tmp_path):
    _write_study(tmp_path, "seeds", [1, 2])
    run = _calibtune(tmp_path, "run", "seeds.yaml")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("seeds")
    trials = client.search_runs([exp.experiment_id], "tags.`calibtune.kind` = 'trial'")
    (first,) = [t for t in trials if "calibtune.reused_from" not in t.data.tags]
    (second,) = [t for t in trials if "calibtune.reused_from" in t.data.tags]
    first_id = first.data.tags["calibtune.trial_id"]
    assert second.data.tags["calibtune.reused_from"] == first_id
    seed_runs = client.search_runs(
        [exp.experiment_id], f"tags.`mlflow.parentRunId` = '{second.info.run_id}'"
    )
    assert sorted(r.data.params["seed"] for r in seed_runs) == ["1", "2"]
    assert {r.data.tags.get("calibtune.reused_from") for r in seed_runs} == {first_id}
    assert second.data.metrics["test/ece"] == first.data.metrics["test/ece"]  # the seed mean
    assert second.data.metrics["test/ece_std"] == first.data.metrics["test/ece_std"]
    folders = sorted(
        p.parent.name for p in (tmp_path / "studies").glob("seeds/trials/*/result.json")
    )
    assert folders == [f"{first_id}-seed1", f"{first_id}-seed2"]  # each seed trained once
