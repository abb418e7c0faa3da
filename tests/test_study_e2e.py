"""End to end on the embedded dataset: real Ray Tune + Optuna + trial engine + MLflow SQLite store.

One 4-trial, 2-epoch study over two losses is run in-process (module fixture), then inspected;
a second study is interrupted (SIGINT to the `calibtune run` process) and resumed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from calibtune.cli import main
from calibtune.record._tracking import PARENT, TAG_KIND, TAG_STUDY
from calibtune.study import load_study, locate_study, run_study, trials_frame

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _study(tmp: Path, name: str, num_samples: int = 4, epochs: int = 2) -> Path:
    raw = {
        "name": name,
        "trial": {
            "data": {"name": "digits", "ood": ["digits_noise"]},
            "model": {"name": "mlp"},
            "optimizer": {"lr": 0.05},
            "train": {"epochs": epochs, "batch_size": 64, "checkpoint_every": 1},
            "eval": {"posthoc": ["ts"]},
        },
        "losses": [
            "cross_entropy",
            {"name": "focal", "space": str(ROOT / "search_spaces" / "focal.yaml")},
        ],
        "search": {
            "sampler": "random",
            "num_samples": num_samples,
            "max_concurrent": 2,
            "objectives": [{"metric": "val/ece@ts", "mode": "min"}],
        },
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": f"e2e-{name}"},
        "storage": str(tmp / "studies"),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory, ray_session):
    tmp = tmp_path_factory.mktemp("study")
    path = _study(tmp, "e2e")
    outcome = run_study(load_study(path), verbose=0)
    return tmp, path, outcome


def test_parent_and_children_structure(finished):
    _, _, outcome = finished
    client = MlflowClient(outcome.tracking_uri)
    parent = client.get_run(outcome.parent_run_id)
    assert parent.data.tags[TAG_STUDY] == "e2e"
    assert parent.data.tags[TAG_KIND] == "study"
    assert parent.info.status == "FINISHED"
    assert {"calibtune.file_hash", "calibtune.git_sha", "version.torch"} <= set(parent.data.tags)
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "study")}
    assert "study/e2e.yaml" in arts and "study/focal.yaml" in arts
    children = client.search_runs(
        [outcome.experiment_id], f"tags.`{PARENT}` = '{outcome.parent_run_id}'"
    )
    assert len(children) == 4
    assert all(c.info.status == "FINISHED" for c in children)
    assert len({c.data.tags["calibtune.trial_id"] for c in children}) == 4
    exp = client.get_experiment(outcome.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert exp.tags["mlflow.note.content"].startswith("calibtune study")


def test_parent_run_summary_and_optuna_storage(finished):
    import optuna

    _, _, outcome = finished
    client = MlflowClient(outcome.tracking_uri)
    parent = client.get_run(outcome.parent_run_id)
    children = client.search_runs(
        [outcome.experiment_id], f"tags.`{PARENT}` = '{outcome.parent_run_id}'"
    )
    best = min(children, key=lambda c: c.data.metrics["val/ece.ts"])
    assert parent.data.metrics["study/best_val_ece.ts"] == best.data.metrics["val/ece.ts"]
    assert parent.data.tags["calibtune.best_trial"] == best.data.tags["calibtune.trial_id"]
    assert parent.data.params["num_samples"] == "4" and parent.data.params["data"] == "digits"
    arts = {a.path for a in client.list_artifacts(outcome.parent_run_id, "summary")}
    assert {"summary/compare.csv", "summary/report.md", "summary/figures"} <= arts, arts
    figs = {a.path for a in client.list_artifacts(outcome.parent_run_id, "summary/figures")}
    assert "summary/figures/objective.png" in figs and "summary/figures/ece_vs_params.png" in figs
    ot = optuna.load_study(study_name="e2e", storage=f"sqlite:///{outcome.storage / 'optuna.db'}")
    assert [t.state.name for t in ot.trials] == ["COMPLETE"] * 4
    by_tune = {t.user_attrs["tune_trial_id"]: t.values[0] for t in ot.trials}
    assert by_tune == {
        c.data.tags["calibtune.trial_id"]: c.data.metrics["val/ece.ts"] for c in children
    }


def test_dashboard_serves_the_optuna_study_on_loopback(finished):
    import json as _json
    import urllib.request

    from calibtune.readers._ui import start_dashboard, stop_ui

    _, _, outcome = finished
    proc, url = start_dashboard(f"sqlite:///{outcome.storage / 'optuna.db'}")
    try:
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{url}/api/studies") as r:
            studies = _json.loads(r.read())["study_summaries"]
        assert [s["study_name"] for s in studies] == ["e2e"]
        with urllib.request.urlopen(f"{url}/api/studies/{studies[0]['study_id']}") as r:
            detail = _json.loads(r.read())
        assert len(detail["trials"]) == 4
        assert detail["objective_names"] == ["val/ece@ts"]
    finally:
        stop_ui(proc)


def test_children_carry_only_their_loss_params_and_all_metrics(finished):
    _, _, outcome = finished
    client = MlflowClient(outcome.tracking_uri)
    children = client.search_runs(
        [outcome.experiment_id], f"tags.`{PARENT}` = '{outcome.parent_run_id}'"
    )
    for c in children:
        loss = c.data.params["loss"]
        assert c.data.tags["calibtune.loss"] == loss
        loss_params = {k for k in c.data.params if k.startswith("loss.")}
        assert loss_params == ({"loss.gamma"} if loss == "focal" else set())
        m = c.data.metrics
        for key in (
            "val/ece",
            "test/ece",
            "test/ece.ts",
            "test/adaece",
            "val/ece.ts",
            "posthoc/ts/T",
            "ood/digits_noise/s5/auroc",
            "train/loss",
        ):
            assert key in m, (key, sorted(m))
        history = client.get_metric_history(c.info.run_id, "val/ece")
        assert sorted(h.step for h in history) == [1, 2]
        arts = {a.path for a in client.list_artifacts(c.info.run_id)}
        assert "config.yaml" in arts and "figures" in arts, arts


def test_compare_report_export_and_retrain_reproduces(finished, tmp_path, capsys):
    _, path, _ = finished
    assert main(["compare", str(path), "--format", "csv"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("trial_id,loss_label") and len(out) == 5
    assert main(["report", str(path)]) == 0
    report = capsys.readouterr().out
    assert "| loss |" in report and "ECE (TS)" in report
    # one seed: the trial runs themselves hold test_predictions.npz
    assert main(["report", str(path), "--baseline", "cross_entropy", "--format", "csv"]) == 0
    paired = capsys.readouterr().out.splitlines()
    assert paired[0] == "loss,method,metric,diff,ci_low,ci_high,seeds,resolved"
    assert len(paired) == 1 + 6 and all(",1," in r for r in paired[1:])  # focal × {none, ts} × 3
    assert main(["export", str(path), "--top", "1", "--out", str(tmp_path)]) == 0
    exported = Path(capsys.readouterr().out.strip())
    from calibtune._provenance import installed_versions, read_provenance

    prov = read_provenance(exported.read_text())
    assert prov["study"] == "e2e" and prov["rerun"] == f"calibtune train {exported}"
    assert {k: prov[k] for k in installed_versions()} == installed_versions()
    assert prov["objective"]["metric"] == "val/ece@ts" and prov["git_sha"]
    ref = locate_study(path)
    best = trials_frame(ref).sort_values("val/ece@ts").iloc[0]
    from calibtune.trial import load_config, run

    result = run(load_config(exported), storage_path=tmp_path / "retrain")
    for key in ("val/ece@ts", "test/ece", "test/error", "test/nll"):
        assert result.metrics[key] == pytest.approx(best[key], abs=1e-5), key
    assert prov["trial"] == best["trial_id"] and prov["mlflow_run"] == best["run_id"]
    assert prov["objective"]["value"] == pytest.approx(best["val/ece@ts"])


def _finished_children(uri: str, exp_name: str) -> list:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(exp_name)
    if exp is None:
        return []
    return [
        r
        for r in client.search_runs([exp.experiment_id], "tags.`calibtune.kind` = 'trial'")
        if r.data.tags.get("calibtune.status") == "finished"
    ]


# `long`: SIGINT and SIGTERM stop a study through one handler (`calibtune.study._search`); a
# graceful stop + resume stays in `make test` as
# test_faults.py::test_second_driver_refused_sigterm_stops_cleanly_and_resume_finishes
@pytest.mark.long
def test_interrupted_study_resumes_without_duplicates(tmp_path):
    path = _study(tmp_path, "e2e_resume", num_samples=4, epochs=3)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # the third trial to start pauses there, so Ctrl-C always lands with work left, however fast
    # the first two trials are (max_concurrent 2: they pass the failpoint)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CALIBTUNE_FAILPOINT")},
        "PYTHONUNBUFFERED": "1",
        "CALIBTUNE_FAILPOINT": "trial_start",
        "CALIBTUNE_FAILPOINT_SKIP": "2",
        "CALIBTUNE_FAILPOINT_DIR": str(tmp_path),
    }
    paused = tmp_path / "trial_start.hit"
    proc = subprocess.Popen(
        [sys.executable, "-m", "calibtune", "run", str(path), "--quiet"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.time() + 240
    while time.time() < deadline and not (
        paused.exists() and len(_finished_children(uri, "e2e-e2e_resume")) >= 1
    ):
        if proc.poll() is not None:
            break
        time.sleep(1)
    assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: Tune saves its state and stops
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    done_before = len(_finished_children(uri, "e2e-e2e_resume"))
    assert 1 <= done_before < 4
    rc = main(["resume", str(tmp_path / "studies" / "e2e_resume"), "--quiet"])
    assert rc == 0
    runs = _finished_children(uri, "e2e-e2e_resume")
    trial_ids = [r.data.tags["calibtune.trial_id"] for r in runs]
    assert len(trial_ids) == 4 and len(set(trial_ids)) == 4
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("e2e-e2e_resume")
    parents = client.search_runs([exp.experiment_id], "tags.`calibtune.kind` = 'study'")
    assert len(parents) == 1  # the restored study wrote to the same parent run
    allruns = client.search_runs([exp.experiment_id], "tags.`calibtune.kind` = 'trial'")
    assert len(allruns) == 4  # no duplicate child runs
    for run in allruns:  # the driver drew every trial's figures, those of the stopped one too
        assert "calibtune.figures_pending" not in run.data.tags, run.info.run_name
        figs = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
        assert "figures/reliability.png" in figs, (run.info.run_name, figs)
    state = json.loads((tmp_path / "studies" / "e2e_resume" / "calibtune_study.json").read_text())
    assert state["parent_run_id"] == parents[0].info.run_id
    import optuna

    ot = optuna.load_study(
        study_name="e2e_resume",
        storage=f"sqlite:///{tmp_path / 'studies' / 'e2e_resume' / 'optuna.db'}",
    )
    tune_ids = [t.user_attrs["tune_trial_id"] for t in ot.trials]
    assert sorted(tune_ids) == sorted(trial_ids)  # one Optuna trial per Tune trial, no orphans
    assert {t.state.name for t in ot.trials} == {"COMPLETE"}


def test_ui_serves_the_store_on_loopback(finished):
    import json as _json
    import urllib.parse
    import urllib.request

    from calibtune.readers._ui import start_ui, stop_ui

    _, _, outcome = finished
    proc, url = start_ui(outcome.tracking_uri)
    try:
        assert url.startswith("http://127.0.0.1:")
        q = urllib.parse.urlencode({"experiment_name": "e2e-e2e"})
        with urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/get-by-name?{q}") as r:
            body = _json.loads(r.read())
        assert body["experiment"]["experiment_id"] == outcome.experiment_id
    finally:
        stop_ui(proc)
    assert proc.poll() is not None


def test_several_seeds_give_mean_std_and_one_run_per_seed(tmp_path, ray_session):
    path = _study(tmp_path, "e2e_seeds", num_samples=1, epochs=1)
    raw = yaml.safe_load(path.read_text())
    raw["search"]["seeds"] = [1, 2]
    raw["losses"] = ["cross_entropy"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    outcome = run_study(load_study(path), verbose=0)
    client = MlflowClient(outcome.tracking_uri)
    (trial,) = client.search_runs(
        [outcome.experiment_id], f"tags.`{PARENT}` = '{outcome.parent_run_id}'"
    )
    seeds = client.search_runs([outcome.experiment_id], f"tags.`{PARENT}` = '{trial.info.run_id}'")
    assert sorted(r.data.params["seed"] for r in seeds) == ["1", "2"]
    assert all(r.data.tags[TAG_KIND] == "seed" for r in seeds)
    per_seed = [r.data.metrics["test/ece"] for r in seeds]
    assert per_seed[0] != per_seed[1]  # different seeds, different models
    m = trial.data.metrics
    assert m["test/ece"] == pytest.approx(sum(per_seed) / 2)
    assert m["test/ece_std"] == pytest.approx(abs(per_seed[0] - per_seed[1]) / 2)


def test_a_study_whose_trials_all_fail_keeps_its_summary_and_each_trials_traceback(
    tmp_path, ray_session, capsys
):
    path = _study(tmp_path, "allfail", num_samples=2, epochs=1)
    raw = yaml.safe_load(path.read_text())
    raw["trial"]["optimizer"] = {"lr": 1e4, "momentum": 0.0}  # diverges in the first epoch
    raw["losses"] = raw["losses"][1:]  # focal: two trials with different γ
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    outcome = run_study(load_study(path), verbose=0)
    out = capsys.readouterr()
    assert "summary not updated" not in out.out + out.err
    client = MlflowClient(outcome.tracking_uri)
    arts = {a.path for a in client.list_artifacts(outcome.parent_run_id, "summary")}
    assert {"summary/compare.md", "summary/compare.csv"} <= arts, arts
    children = client.search_runs(
        [outcome.experiment_id], f"tags.`{PARENT}` = '{outcome.parent_run_id}'"
    )
    assert len(children) == 2
    for child in children:
        assert child.data.tags["calibtune.error"].startswith("non-finite loss at epoch 1, step ")
        names = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert "error.txt" in names, names
