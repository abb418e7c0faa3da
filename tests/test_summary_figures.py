"""The parent run's study figures are redrawn now and then, not at every trial's end
(`calibtune.study._progress.FigureThrottle`): a per-trial refresh inside the window leaves the
last drawn figures (and, within 5 s, the tables) in place; the end of a study always redraws. Real
MLflow SQLite store, no Ray."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from calibtune.readers._summary import refresh_summary
from calibtune.record._tracking import (
    PARENT,
    TAG_KIND,
    TAG_STATUS,
    TAG_TRIAL,
    experiment_id,
    log_metrics,
)
from calibtune.study._progress import FigureThrottle, _refresher, drain_summaries
from calibtune.study._trainable import StudyPayload
from calibtune.studyfile._config import load_study


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_throttle_draws_first_then_after_the_wait_which_grows_with_the_drawing_time() -> None:
    clock = Clock()
    t = FigureThrottle(min_wait_s=30.0, factor=10.0, clock=clock)
    assert t.due()  # the first refresh draws
    t.drawn(took=1.0)  # wait = max(30, 10 × 1) = 30 s
    clock.now += 29.9
    assert not t.due()
    clock.now += 0.1
    assert t.due()
    t.drawn(took=5.0)  # a slow drawing: wait = 50 s
    clock.now += 49.0
    assert not t.due()
    clock.now += 1.0
    assert t.due()


def _trial(uri: str, exp: str, parent: str, i: int, ece: float) -> None:
    """A finished child run as the trainable leaves it (tags, a param, final metrics)."""
    client = MlflowClient(uri)
    run = client.create_run(
        exp,
        tags={PARENT: parent, TAG_KIND: "trial", TAG_TRIAL: f"t{i}", TAG_STATUS: "finished"},
    )
    for k, v in {"loss": "focal", "loss_label": "focal", "loss.gamma": str(1.0 + i)}.items():
        client.log_param(run.info.run_id, k, v)
    log_metrics(uri, run.info.run_id, {"val/ece": ece, "val/ece@ts": ece / 2})


def _summary(client: MlflowClient, parent: str, tmp: Path) -> dict[str, str]:
    """The parent run's logged ``summary/`` files: name -> text (tables) or SHA-256 (figures)."""
    local = Path(client.download_artifacts(parent, "summary", str(tmp)))
    files = {str(p.relative_to(local)): p.read_bytes() for p in local.rglob("*") if p.is_file()}
    return {
        k: hashlib.sha256(v).hexdigest() if k.endswith(".png") else v.decode()
        for k, v in files.items()
    }


@pytest.mark.timeout(120)
def test_a_refresh_inside_the_window_keeps_the_figures_and_the_end_redraws(tmp_path) -> None:
    study = load_study("studies/quickstart.yaml")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = experiment_id(uri, "throttle")
    client = MlflowClient(uri)
    parent = client.create_run(exp).info.run_id
    _, refresh = _refresher(study, StudyPayload(study, uri, exp, parent, str(tmp_path)), None)
    drain_summaries()  # no throttle left for this parent run by an earlier test
    figs = {"figures/objective.png", "figures/ece_vs_params.png"}

    _trial(uri, exp, parent, 0, 0.08)
    refresh([])  # the first refresh draws
    first = _summary(client, parent, tmp_path / "1")
    assert figs <= set(first), sorted(first)

    _trial(uri, exp, parent, 1, 0.02)
    refresh([])  # a second later: inside the window
    second = _summary(client, parent, tmp_path / "2")
    # the tables wait too (at most 5 s: `_progress._tables`; they read every trial run)
    assert "t1" not in second["compare.csv"] and "t1" not in first["compare.csv"]
    assert {f: second[f] for f in figs} == {f: first[f] for f in figs}  # still there, not redrawn

    # the end of `run`/`resume`: after `drain_summaries`, the same call `_search._fit` makes
    drain_summaries()
    assert refresh_summary(study, uri, exp, parent) is None
    final = _summary(client, parent, tmp_path / "3")
    assert all(final[f] != first[f] for f in figs)  # redrawn with the second trial


@pytest.mark.timeout(120)
def test_refreshes_record_ended_trials_once_through_one_open_optuna_storage(tmp_path) -> None:
    import optuna

    from calibtune.readers._summary import load_optuna_study, rdb_storage

    study = load_study("studies/quickstart.yaml")
    uri, storage = f"sqlite:///{tmp_path / 'mlflow.db'}", f"sqlite:///{tmp_path / 'optuna.db'}"
    exp = experiment_id(uri, "storage")
    parent = MlflowClient(uri).create_run(exp).info.run_id
    _trial(uri, exp, parent, 0, 0.08)
    ended = [("t0", {"loss": "cross_entropy"}, {"calibtune/done": 1, "val/ece@ts": 0.04}, False)]
    for _ in range(2):  # the second refresh finds the trial recorded
        assert refresh_summary(study, uri, exp, parent, storage, ended=ended) is None
    assert rdb_storage(storage) is rdb_storage(storage)
    trials = load_optuna_study("quickstart", storage).get_trials(deepcopy=False)
    assert [(t.state, t.values) for t in trials] == [(optuna.trial.TrialState.COMPLETE, [0.04])]


def test_a_replaced_optuna_file_gets_a_storage_of_its_own(tmp_path) -> None:
    import optuna

    from calibtune.readers._summary import load_optuna_study, rdb_storage

    db = tmp_path / "optuna.db"
    url = f"sqlite:///{db}"
    optuna.create_study(study_name="old", storage=url)
    first = rdb_storage(url)
    assert load_optuna_study("old", first) is not None
    db.unlink()  # the study folder removed, then the study run again in this process
    optuna.create_study(study_name="new", storage=url)
    second = rdb_storage(url)
    assert second is not first
    study = load_optuna_study("new", second)
    study.add_trial(optuna.trial.create_trial(value=1.0))  # writes to the new file
    assert len(study.get_trials()) == 1 and load_optuna_study("old", second) is None
