"""The driver's cost per ended trial does not grow with the trials a study already has (issue 29
item 5): a per-trial refresh of the parent run reads the ended trial's own runs (its learning
curve, its Optuna record), not every run of the study; the tables that do read every run are
rewritten now and then (`calibtune.study._progress._tables`) and at the study's end. Real MLflow
and Optuna SQLite stores, no Ray; what is counted is what the stores hand back."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from calibtune.record._optuna import flat_params
from calibtune.record._tracking import (
    PARENT,
    TAG_KIND,
    TAG_STATUS,
    TAG_TRIAL,
    experiment_id,
    log_metrics,
)
from calibtune.study._progress import _refresher, drain_summaries
from calibtune.study._trainable import StudyPayload
from calibtune.studyfile._config import load_study


def _trial(client: MlflowClient, uri: str, exp: str, parent: str, i: int) -> tuple:
    """A finished child run as the trainable leaves it (two epochs, final metrics) and the
    ended-trial tuple the driver's refresh gets for it."""
    tags = {PARENT: parent, TAG_KIND: "trial", TAG_TRIAL: f"t{i}", TAG_STATUS: "finished"}
    run = client.create_run(exp, tags=tags).info.run_id
    client.log_param(run, "loss", "cross_entropy")
    client.log_param(run, "loss_label", "cross_entropy")
    for step in (1, 2):
        client.log_metric(run, "val/ece.ts", 0.1 / step + i * 1e-3, step=step)
    log_metrics(uri, run, {"val/ece": 0.1, "val/ece@ts": 0.05 + i * 1e-3})
    result = {"calibtune/done": 1, "val/ece@ts": 0.05 + i * 1e-3}
    return (f"t{i}", {"loss": "cross_entropy"}, result, False)


def _read_by_one_refresh(tmp: Path, n: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Runs and Optuna trials the stores hand back to the refresh after the ``n + 1``-th trial
    of a study that has ``n`` (all of them refreshed before)."""
    import optuna

    study = load_study("studies/quickstart.yaml")
    uri, storage = f"sqlite:///{tmp / 'mlflow.db'}", f"sqlite:///{tmp / 'optuna.db'}"
    exp = experiment_id(uri, f"scale{n}")
    client = MlflowClient(uri)
    parent = client.create_run(exp).info.run_id
    drain_summaries()  # no throttle left for a parent run by an earlier test
    _, refresh = _refresher(study, StudyPayload(study, uri, exp, parent, str(tmp)), storage)
    refresh([_trial(client, uri, exp, parent, i) for i in range(n)])  # the first: all at once
    last = _trial(client, uri, exp, parent, n)

    read = {"runs": 0, "optuna_trials": 0}
    search_runs = MlflowClient.search_runs
    get_all = optuna.storages.RDBStorage.get_all_trials

    def counted_search(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = search_runs(self, *args, **kwargs)
        read["runs"] += len(out)
        return out

    def counted_trials(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = get_all(self, *args, **kwargs)
        read["optuna_trials"] += len(out)
        return out

    monkeypatch.setattr(MlflowClient, "search_runs", counted_search)
    monkeypatch.setattr(optuna.storages.RDBStorage, "get_all_trials", counted_trials)
    refresh([last])  # a trial that ended right after: inside the tables' window
    monkeypatch.undo()
    drain_summaries()
    ot = optuna.load_study(study_name=study.name, storage=storage)
    assert len(ot.trials) == n + 1  # every ended trial recorded once
    curve = ot.trials[-1].intermediate_values  # its learning curve, from its own run
    assert curve[1] == pytest.approx(0.1 + n * 1e-3) and curve[2] == pytest.approx(0.05 + n * 1e-3)
    return read


@pytest.mark.timeout(300)
def test_a_trials_refresh_reads_only_its_own_runs(tmp_path: Path, monkeypatch) -> None:
    small = _read_by_one_refresh(tmp_path / "small", 2, monkeypatch)
    large = _read_by_one_refresh(tmp_path / "large", 24, monkeypatch)
    # the code before: every run of the study (curves, tables) and every Optuna trial per record
    assert small == large, (small, large)
    assert large["runs"] <= 2 and large["optuna_trials"] == 0


def _forced_saves(tmp: Path, n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list, int]:
    """Tune's full state saves forced while ``n`` one-report trials run one after another under
    the study's scheduler, and the sizes of the start records written."""
    from ray import tune
    from ray.tune.execution.tune_controller import TuneController

    from calibtune.study._scheduling import STARTS, DurableFIFOScheduler

    forced = []
    checkpoint = TuneController.checkpoint

    def counted(self: Any, force: bool = False, wait: bool = False) -> None:
        forced.append(force)
        checkpoint(self, force=force, wait=wait)

    monkeypatch.setattr(TuneController, "checkpoint", counted)
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "100000")  # no periodic save in between

    def trainable(config: dict[str, Any]) -> None:
        tune.report({"score": float(config["i"])})

    tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={"i": tune.grid_search(list(range(n)))},
        tune_config=tune.TuneConfig(scheduler=DurableFIFOScheduler(), max_concurrent_trials=1),
        run_config=tune.RunConfig(name="starts", storage_path=str(tmp), verbose=0),
    ).fit()
    monkeypatch.undo()
    records = sorted((tmp / "starts" / STARTS).glob("*/*.json"))
    state = json.loads(max((tmp / "starts").glob("experiment_state-*.json")).read_text())
    first = len(state["trial_data"]) - len(records)
    return sum(forced), [p.stat().st_size for p in records], first


@pytest.mark.usefixtures("ray_session")
@pytest.mark.timeout(300)
def test_a_trial_start_does_not_save_the_whole_study(tmp_path: Path, monkeypatch) -> None:
    few, few_sizes, _ = _forced_saves(tmp_path / "few", 2, monkeypatch)
    many, many_sizes, first = _forced_saves(tmp_path / "many", 8, monkeypatch)
    # the code before: one full save (every trial, the searcher) per start, so 8 against 2
    assert few == many, (few, many)
    assert 1 <= first < 8  # the session's one full save holds the first; each later, its record
    assert max(many_sizes) < 1.5 * max(few_sizes)  # a record is the trial's state alone


def _stub_trial(metrics: int) -> Any:
    """A Tune trial (a stub: no trainable, no Ray) that reported ``metrics`` metrics twice."""
    from ray.tune.experiment import Trial

    trial = Trial("study_trainable", stub=True, config={"loss": "focal"})
    for step in (1, 2):
        result = {f"test/m{i}": i / step for i in range(metrics)} | {"val/ece": 0.1 / step}
        trial.update_last_result(result | {"training_iteration": step})
    return trial


@pytest.mark.timeout(120)
def test_a_finished_trial_keeps_the_objectives_summaries_only() -> None:
    from calibtune.study._scheduling import make_scheduler

    study = load_study("studies/quickstart.yaml")
    (objective,) = [o.metric for o in study.search.objectives]
    trial, marked = _stub_trial(200), []
    trial.update_last_result(trial.last_result | {objective: 0.05, "training_iteration": 3})
    before_json, last = len(trial.get_json_state()[1]), dict(trial.last_result)

    class Controller:  # the controller's one call here: Tune's cached JSON rebuilt at a save
        def _mark_trial_to_checkpoint(self, t: Any) -> None:
            marked.append(t)

    make_scheduler(study).on_trial_complete(Controller(), trial, last)
    # the code before: every reported metric's min/max/mean/last-5/last-10 and their windows
    assert set(trial.run_metadata.metric_analysis) == {objective}
    assert set(trial.run_metadata.metric_n_steps) == {objective}
    assert trial.last_result == last and marked == [trial]  # what `ResultGrid` reports stays
    assert len(trial.get_json_state()[1]) < before_json / 5


class _NoPass(list):
    def __iter__(self) -> Any:
        raise AssertionError("a pass over every trial")


@pytest.mark.timeout(120)
def test_the_next_trial_is_fifos_without_a_pass_over_every_trial() -> None:
    from types import SimpleNamespace

    from ray.tune.schedulers import FIFOScheduler

    from calibtune.study._scheduling import first_waiting

    trials = [_stub_trial(1) for _ in range(6)]
    statuses = ["TERMINATED", "PAUSED", "TERMINATED", "PENDING", "PAUSED", "PENDING"]
    for t, status in zip(trials, statuses, strict=True):
        t.set_status(status)
    found = []
    for pending in (True, False):  # the first PENDING in the trials' order, else the first PAUSED
        if not pending:
            for t in trials:
                t.set_status("TERMINATED" if t.status == "PENDING" else t.status)
        controller = SimpleNamespace(
            _pending_trials={t for t in trials if t.status == "PENDING"},
            _paused_trials={t for t in trials if t.status == "PAUSED"},
            get_trials=lambda: list(trials),
        )
        expected = FIFOScheduler().choose_trial_to_run(controller)
        controller.get_trials = lambda: _NoPass(trials)
        found.append(first_waiting(controller, None, controller))
        assert found[-1] is expected
    assert found == [trials[3], trials[1]]


@pytest.mark.timeout(120)
def test_tune_logs_each_result_once_and_a_state_pickled_before_keeps_its_loggers(
    tmp_path: Path,
) -> None:
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, LoggerCallback
    from ray.tune.utils.callback import _create_default_callbacks

    from calibtune.study._search import _json_log_only, _tuner, study_dir
    from calibtune.study._tunelog import ResultJsonLogger

    def loggers(tuner: Any) -> set[type]:
        with _json_log_only(tuner):
            given = list(tuner._local_tuner.get_run_config().callbacks or [])
            made = _create_default_callbacks(given)
        return {type(c) for c in made if isinstance(c, LoggerCallback)}

    study = load_study("studies/quickstart.yaml")
    payload = StudyPayload(study, "sqlite:///unused.db", "0", "parent", str(tmp_path / "trials"))
    tuner = _tuner(study, study_dir(study, tmp_path), payload, [], 0)
    # the code before: Tune's defaults, progress.csv and TensorBoard events beside result.json
    # `ResultGrid.metrics_dataframe` reads its result.json
    assert loggers(tuner) == {ResultJsonLogger} and issubclass(ResultJsonLogger, JsonLoggerCallback)
    old = tune.Tuner(lambda config: None, run_config=tune.RunConfig(storage_path=str(tmp_path)))
    assert CSVLoggerCallback in loggers(old)  # no result.json of its own: Tune's defaults stay
    assert "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS" not in os.environ


@pytest.mark.usefixtures("ray_session")
@pytest.mark.timeout(300)
def test_a_trial_folder_in_the_storage_holds_its_results_alone(tmp_path: Path) -> None:
    """Tune copies every trial folder to the storage again at each state save: the code before
    kept ``params.json`` and ``params.pkl`` beside ``result.json`` (3,000 files per save at
    1,000 trials); the results stay readable as `ResultGrid` reads them."""
    from ray import tune

    from calibtune.storage import atomic_filesystem
    from calibtune.study._search import _json_log_only, _result_log

    def trainable(config: dict[str, Any]) -> None:
        for step in range(2):
            tune.report({"score": config["i"] + step})

    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space={"i": tune.grid_search([10, 20])},
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=tune.RunConfig(
            name="logs",
            storage_path=str(tmp_path),
            storage_filesystem=atomic_filesystem(),
            callbacks=_result_log(),
            verbose=0,
        ),
    )
    with _json_log_only(tuner):
        grid = tuner.fit()
    folders = [p for p in (tmp_path / "logs").iterdir() if p.is_dir() and "trainable" in p.name]
    assert len(folders) == 2
    assert [sorted(q.name for q in p.iterdir()) for p in folders] == [["result.json"]] * 2
    assert sorted(r.metrics_dataframe["score"].tolist() for r in grid) == [[10, 11], [20, 21]]
    assert sorted(r.config["i"] for r in grid) == [10, 20]


class _Restored:
    """What `replay` uses of a restored Tune controller: its trial list, its searcher (Tune's
    `SearchGenerator` over the study's own), its storage."""

    def __init__(self, storage: Any, trials: list, search_alg: Any) -> None:
        self._storage, self._trials, self._search_alg = storage, trials, search_alg

    def get_trials(self) -> list:
        return self._trials

    def add_trial(self, trial: Any) -> None:
        self._trials.append(trial)


@pytest.mark.usefixtures("ray_session")  # a replayed trial makes its local folder in Ray's
@pytest.mark.parametrize("searcher_saved", ["before the second start", "after it"])
def test_a_replayed_start_counts_once_however_new_the_searchers_state(
    tmp_path: Path, searcher_saved: str
) -> None:
    """A resume whose Tune trial list holds trial ``a`` and whose start records hold ``a`` and
    ``b``. The searcher's state was saved either before ``b`` started (``b`` is news to it) or
    after (a full disk stopped Tune's save between the searcher's files and the trial list:
    issue 29's note of stop 37). Either way the round has taken 2 samples and Optuna holds one
    trial per Tune trial; the code before counted ``b`` twice when the searcher already knew it
    (the round ended a trial early: "1 not run") and left a second Optuna trial RUNNING."""
    from ray.train._internal.storage import StorageContext
    from ray.tune import PlacementGroupFactory
    from ray.tune.experiment import Trial
    from ray.tune.registry import register_trainable
    from ray.tune.search import SearchGenerator

    from calibtune.storage import open_storage
    from calibtune.study._scheduling import record_start, replay
    from calibtune.study._search import _searcher

    study = load_study(Path(__file__).parents[1] / "studies" / "quickstart.yaml")
    limiter = _searcher(study, [])
    search_alg = SearchGenerator(limiter)
    known = "ab" if searcher_saved == "after it" else "a"  # what the searcher's state holds
    config = {i: limiter.suggest(i) for i in known}  # the study's own configs
    config.setdefault("b", _searcher(study, []).suggest("b"))
    search_alg._counter = len(known)
    register_trainable("replayed_trainable", lambda config: None)
    storage = StorageContext(storage_path=str(tmp_path), experiment_dir_name="exp")
    trials, cpu = {}, PlacementGroupFactory([{"CPU": 1}])
    for i in "ab":
        trials[i] = Trial(
            "replayed_trainable", config=config[i], trial_id=i, placement_group_factory=cpu
        )
        trials[i].set_storage(storage)
        trials[i].create_placement_group_factory()  # as Tune adds a trial
    folder = open_storage(tmp_path / "starts")
    for i in "ab":
        record_start(folder, trials[i])
    controller = _Restored(storage, [trials["a"]], search_alg)
    assert replay(controller, folder) == {"a", "b"}
    assert [t.trial_id for t in controller.get_trials()] == ["a", "b"]
    assert search_alg._counter == 2
    ot = limiter.searcher._ot_study
    assert [t.state.name for t in ot.trials] == ["RUNNING", "RUNNING"]
    assert sorted(limiter.searcher._ot_trials) == ["a", "b"]
    assert limiter.live_trials == {"a", "b"}
    b = ot.trials[limiter.searcher._ot_trials["b"].number]
    assert b.params and b.params.items() <= flat_params(config["b"]).items()
