"""Retries of lost trials, and none of a trial's own errors (`calibtune.study._scheduling`).

On the in-process Ray of the `ray_session` group: a Tune run with the study's scheduler and
``max_failures: 3`` whose trials die (their process exits, as on a lost node) or raise the trial
engine's own errors. The lost trial is retried and told to the callbacks (and the searcher) only
once, as COMPLETE; an own error ends its trial at once, told once as an error. The two-node test
(a drained node whose raylet is killed) is in tests/test_cluster_ddp.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from calibtune.study._scheduling import DurableFIFOScheduler, error_line, retryable

pytestmark = [pytest.mark.usefixtures("ray_session")]


def test_retryable_tells_lost_nodes_from_own_errors() -> None:
    from ray.exceptions import ActorDiedError

    assert retryable(ActorDiedError())
    assert retryable("ray.exceptions.NodeDiedError: node 3f... was preempted")
    assert retryable("RuntimeError: something nobody classified")  # unknown: Ray's max_failures
    assert not retryable("TrialFailedError: non-finite loss at epoch 2, step 5 (lr 1e30)")
    assert not retryable("calibtune.trial._errors.TrialStepError: KeyError: 'x' (at calibtune/")
    assert not retryable("ValueError: scaling.use_gpu: expected a visible GPU, got none")
    # a DDP rank whose peer's node died: its collective fails in the trial's own code
    assert retryable("TrialStepError: gloo closed\nActorDiedError: The actor died unexpectedly")
    assert error_line(None) == "no details"


def test_a_study_with_trials_failed_for_good_exits_3(tmp_path: Path, capsys) -> None:
    from types import SimpleNamespace

    from calibtune.commands._run import TRIALS_FAILED_EXIT, _exit_code

    def outcome(**counts: int) -> SimpleNamespace:
        base = {"finished": 0, "failed": 0, "stopped": 0, "unfinished": 0}
        return SimpleNamespace(
            name="s", storage=tmp_path, storage_full=False, stopped_by=None, budget_note=None,
            counts={**base, **counts},
        )  # fmt: skip

    # the code before: 0 (every trial ended and one finished), so automation saw no failure
    assert _exit_code(outcome(finished=2, failed=1)) == TRIALS_FAILED_EXIT == 3
    assert "found 1 failed for good" in capsys.readouterr().err
    assert _exit_code(outcome(finished=3)) == 0
    assert _exit_code(outcome(finished=2, stopped=1)) == 0  # stopped early by ASHA: no failure
    assert _exit_code(outcome(failed=3)) == 1  # none finished: as before


@pytest.mark.timeout(300)
def test_lost_trial_retried_own_error_fails_at_once(tmp_path: Path) -> None:
    from ray import tune

    # nested, so that Ray pickles it by value (the tests folder is not on the workers' path)
    def _trainable(config: dict[str, Any]) -> None:
        from ray import tune

        marks = Path(config["dir"]) / config["kind"]  # one trial per kind
        marks.mkdir(exist_ok=True)
        attempt = len(list(marks.iterdir()))
        (marks / str(attempt)).touch()
        if config["kind"] == "lost" and attempt == 0:
            os._exit(1)  # the trial's process is gone, as on a node that died
        if config["kind"] == "own":
            raise ValueError("trial.train.epochs: expected an integer >= 1, found 0")
        tune.report({"score": 1.0})

    told: dict[str, list[str]] = {"error": [], "complete": [], "recover": []}

    class Told(tune.Callback):
        def on_trial_error(self, iteration, trials, trial, **info):  # type: ignore[override]
            told["error"].append(trial.config["kind"])

        def on_trial_complete(self, iteration, trials, trial, **info):  # type: ignore[override]
            told["complete"].append(trial.config["kind"])

        def on_trial_recover(self, iteration, trials, trial, **info):  # type: ignore[override]
            told["recover"].append(trial.config["kind"])

    marks = tmp_path / "attempts"
    marks.mkdir()
    tuner = tune.Tuner(
        tune.with_resources(_trainable, {"cpu": 1}),
        param_space={"dir": str(marks), "kind": tune.grid_search(["lost", "own"])},
        tune_config=tune.TuneConfig(scheduler=DurableFIFOScheduler(), max_concurrent_trials=1),
        run_config=tune.RunConfig(
            name="retries",
            storage_path=str(tmp_path / "tune"),
            failure_config=tune.FailureConfig(max_failures=3),
            callbacks=[Told()],
            verbose=0,
        ),
    )
    grid = tuner.fit()
    errors = {r.config["kind"]: r.error for r in grid}
    assert errors["lost"] is None and errors["own"] is not None
    attempts = {kind: len(list((marks / kind).iterdir())) for kind in ("lost", "own")}
    # the code before: Tune retried the own error too (4 attempts, 3 recover notices)
    assert attempts == {"lost": 2, "own": 1}
    assert [told["error"], told["complete"]] == [["own"], ["lost"]]
    assert "lost" in told["recover"]  # (Tune tells of the requeue before the scheduler ends it)
