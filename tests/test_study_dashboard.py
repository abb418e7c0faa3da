"""The study's dashboards without Ray: experiment tags, adaptive summaries, parent-run summary,
Optuna storage; real MLflow SQLite stores and real Optuna storages."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from calibtune.metrics import keys as K
from calibtune.record._tracking import EXPERIMENT_TAGS, MlflowTrialCallback, experiment_id


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


# ----------------------------------------------------------------------------- parent-run summary

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _study_file(tmp, objectives=(("val/ece@ts", "min"),)):
    import yaml

    raw = {
        "name": "dash",
        "trial": {"data": {"name": "digits"}, "model": {"name": "mlp"}, "train": {"epochs": 2}},
        "losses": [
            "cross_entropy",
            {"name": "focal", "space": str(ROOT / "search_spaces" / "focal.yaml")},
        ],
        "search": {
            "sampler": "random",
            "num_samples": 4,
            "objectives": [{"metric": m, "mode": d} for m, d in objectives],
        },
        "storage": str(tmp / "studies"),
    }
    path = tmp / "dash.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    from calibtune.study import load_study

    return load_study(path)


def _fake_trials(uri, exp_id, parent, rows):
    """Child runs as the trainable writes them: tags, params, final metrics."""
    from calibtune.record._tracking import PARENT, TAG_KIND, TAG_STATUS, TAG_TRIAL, log_metrics

    client = MlflowClient(uri)
    for i, (loss, gamma, status, metrics) in enumerate(rows):
        run = client.create_run(
            exp_id,
            tags={
                PARENT: parent,
                TAG_KIND: "trial",
                TAG_TRIAL: f"t{i}",
                TAG_STATUS: status,
                "calibtune.loss_label": loss,
            },
        )
        client.log_param(run.info.run_id, "loss", loss)
        client.log_param(run.info.run_id, "loss_label", loss)
        if gamma is not None:
            client.log_param(run.info.run_id, "loss.gamma", str(gamma))
        log_metrics(uri, run.info.run_id, metrics)


def test_parent_run_summarises_the_study(tmp_path):
    from calibtune.readers._summary import best_key, load_optuna_study, summarize_study
    from calibtune.record._optuna import persist_ended

    study = _study_file(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp_id = experiment_id(uri, "calibtune/dash")
    client = MlflowClient(uri)
    parent = client.create_run(exp_id).info.run_id
    m = lambda e, t: {"val/ece": e, "val/ece@ts": t, "test/ece": e, "test/error": 0.1}  # noqa: E731
    _fake_trials(
        uri,
        exp_id,
        parent,
        [
            ("cross_entropy", None, "finished", m(0.05, 0.03)),
            ("focal", 1.0, "finished", m(0.04, 0.02)),
            ("focal", 3.0, "finished", m(0.06, 0.025)),
            ("focal", 2.0, "failed", {}),
        ],
    )
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    ended = [
        ("t0", {"loss": "cross_entropy"}, {"calibtune/done": 1, "val/ece@ts": 0.03}, False),
        (
            "t1",
            {"loss": "focal", "focal": {"gamma": 1.0}},
            {"calibtune/done": 1, "val/ece@ts": 0.02},
            False,
        ),
        (
            "t2",
            {"loss": "focal", "focal": {"gamma": 3.0}},
            {"calibtune/done": 1, "val/ece@ts": 0.025},
            False,
        ),
        ("t3", {"loss": "focal", "focal": {"gamma": 2.0}}, None, True),
    ]
    assert persist_ended(study, storage, ended) == 4
    assert persist_ended(study, storage, ended) == 0  # once per Tune trial
    ot = load_optuna_study("dash", storage)
    notes = summarize_study(study, uri, exp_id, parent, ot)
    run = client.get_run(parent)
    assert best_key("val/ece@ts") == "study/best_val_ece@ts"
    assert run.data.metrics["study/best_val_ece.ts"] == pytest.approx(0.02)
    assert run.data.tags["calibtune.best_trial"] == "t1"
    assert run.data.params["sampler"] == "random" and run.data.params["epochs"] == "2"
    assert run.data.params["objectives"] == "val/ece@ts:min"
    arts = {a.path for a in client.list_artifacts(parent, "summary")}
    for name in ("compare.md", "compare.csv", "report.md", "report.csv", "figures"):
        assert f"summary/{name}" in arts, arts
    figs = {a.path.rsplit("/", 1)[1] for a in client.list_artifacts(parent, "summary/figures")}
    assert {"objective.png", "ece_vs_params.png", "importances.png"} <= figs, (figs, notes)
    assert "pareto.png" not in figs  # single objective
    summarize_study(study, uri, exp_id, parent, ot)  # a refresh (after resume) is idempotent


def test_optuna_records_ended_trials_with_their_state(tmp_path):
    import optuna

    from calibtune.readers._summary import load_optuna_study, param_importances
    from calibtune.record._optuna import ended_state, persist_ended

    study = _study_file(tmp_path, (("val/ece@ts", "min"), ("val/error", "min")))
    assert ended_state(study, {"val/ece@ts": 0.1}, False) == ("PRUNED", None)  # ASHA stopped it
    done = {"calibtune/done": 1, "val/ece@ts": 0.1, "val/error": 0.2}
    assert ended_state(study, done, False) == ("COMPLETE", [0.1, 0.2])
    assert ended_state(study, {**done, "val/error": float("nan")}, False)[0] == "FAIL"
    assert ended_state(study, done, True)[0] == "FAIL"
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    persist_ended(study, storage, [("a", {"loss": "focal", "focal": {"gamma": 2.0}}, done, False)])
    ot = load_optuna_study("dash", storage)
    (t,) = ot.trials
    assert t.state == optuna.trial.TrialState.COMPLETE and t.values == [0.1, 0.2]
    assert t.params == {"loss": "focal", "focal/gamma": 2.0}
    assert len(ot.directions) == 2
    assert ot.metric_names == ["val/ece@ts", "val/error"]
    assert param_importances(ot) == ({}, "1 finished trial(s) in Optuna, 2 needed")
    assert param_importances(None)[1] == "no Optuna storage"


def test_running_best_and_param_positions():
    import numpy as np

    from calibtune.plots._study import param_positions, running_best

    nan = float("nan")
    np.testing.assert_allclose(running_best([nan, 3.0, nan, 1.0, 2.0], "min"), [nan, 3, 3, 1, 1])
    np.testing.assert_allclose(running_best([1.0, 3.0, 2.0], "max"), [1, 3, 3])
    x, labels = param_positions(["b", None, "a", "b"])
    assert labels == ["a", "b"]
    np.testing.assert_allclose(x, [1, nan, 0, 1])
    x, labels = param_positions([0.5, nan, 2])
    assert labels is None
    np.testing.assert_allclose(x, [0.5, nan, 2])


def test_optuna_storage_key_is_checked(tmp_path):
    from calibtune.study import load_study
    from calibtune.studyfile._config import StudyError

    path = tmp_path / "s.yaml"
    base = "name: s\nlosses: [cross_entropy]\nsearch: {num_samples: 1, optuna_storage: %s}\n"
    path.write_text(base % "postgresql://u@h/db")
    assert load_study(path).search.optuna_storage == "postgresql://u@h/db"
    path.write_text(base % "not a url")
    with pytest.raises(StudyError, match=r"search\.optuna_storage: expected a SQLAlchemy URL"):
        load_study(path)


# ----------------------------------------------------------------------------- export provenance


def test_provenance_block_round_trips_and_names_version_drift(tmp_path, capsys):
    import yaml

    from calibtune._provenance import (
        installed_versions,
        provenance_comment,
        read_provenance,
        version_drift,
    )
    from calibtune.commands._train import _warn_version_drift

    prov = {
        "git_sha": "abc",
        **installed_versions(),
        "objective": {"metric": "val/ece@ts", "value": 0.012},
        "rerun": "calibtune train x.yaml",
    }
    text = "# exported\n" + provenance_comment(prov) + "name: x\nseed: 1\n"
    assert read_provenance(text) == prov
    assert yaml.safe_load(text) == {"name": "x", "seed": 1}  # still a plain trial config
    assert read_provenance("name: x\n") is None
    assert version_drift(prov, installed_versions()) == []
    old = {**prov, "torch": "1.0.0"}
    assert version_drift(old, installed_versions()) == [
        f"torch 1.0.0 -> {installed_versions()['torch']}"
    ]
    path = tmp_path / "x.yaml"
    path.write_text(provenance_comment(old) + "name: x\n")
    _warn_version_drift(str(path))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torch 1.0.0 -> " in err
    path.write_text(provenance_comment(prov) + "name: x\n")
    _warn_version_drift(str(path))
    assert capsys.readouterr().err == ""


def test_a_config_without_provenance_imports_no_library_for_the_drift_check(tmp_path) -> None:
    """`calibtune train` on a hand-written config: no versions to compare, so the check
    imports nothing (mlflow alone took seconds of a trial's start)."""
    import subprocess
    import sys

    path = tmp_path / "plain.yaml"
    path.write_text("name: x\n")
    code = (
        "import sys; from calibtune.commands._train import _warn_version_drift; "
        f"_warn_version_drift({str(path)!r}); print('mlflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-500:]


def test_dashboard_cli_refuses_a_study_without_optuna_storage_in_one_line(tmp_path, capsys):
    from calibtune.cli import main
    from calibtune.studyfile._studydir import StudyDir, StudyState

    study = _study_file(tmp_path)
    sd = StudyDir.at(study.name, study.storage)
    sd.path.mkdir(parents=True)
    sd.write_study(study)
    sd.write_state(StudyState(f"sqlite:///{tmp_path / 'mlflow.db'}", "1", "r", None))
    assert main(["dashboard", str(sd.path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expected the study's Optuna storage sqlite:///" in err[0], err
    assert main(["dashboard", "no_such_study", "--storage", str(tmp_path)]) == 2
    assert "expected a study folder (holding calibtune_study.json) or a study name" in (
        capsys.readouterr().err
    )


@pytest.mark.timeout(180)
def test_ui_server_stops_when_the_command_is_terminated(tmp_path):
    """`calibtune ui` runs `mlflow ui` in a session of its own (Ctrl-C reaches only calibtune);
    a SIGTERM to calibtune (a `kill`, a service manager) must stop the server too, not leave it
    serving with no parent."""
    import os
    import re
    import signal
    import socket
    import subprocess
    import sys
    import time

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    MlflowClient(uri).search_experiments()  # an existing (empty) store
    proc = subprocess.Popen(
        [sys.executable, "-m", "calibtune", "ui", "--tracking-uri", uri],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        seen = []  # the URL line, after any warnings the libraries print first
        while not (m := re.search(r"http://127\.0\.0\.1:(\d+)", line := proc.stdout.readline())):
            seen.append(line)
            assert line or proc.poll() is None, seen[-5:]
        port = int(m.group(1))
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the server answers
        proc.send_signal(signal.SIGTERM)  # calibtune only, not its server's session
        assert proc.wait(timeout=60) == 0
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the MLflow UI still serves after calibtune ended: {line}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
