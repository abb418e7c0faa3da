"""Loose ends of issues 28 and 29: worker-mode checkpoint folders removed, Tune's error text
read as Ray 2.60 gives it, the progress line's slots, Ray's warnings kept off a quiet terminal."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch


def _worker_trial(tmp_path: Path) -> Any:
    from calibtune.training import Precision
    from calibtune.trial import config_from_dict
    from calibtune.trial._worker import _Trial

    cfg = config_from_dict(
        {
            "name": "ckpt-tmp",
            "storage_path": str(tmp_path / "store"),
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "loss": {"name": "cross_entropy"},
            "train": {"epochs": 2, "batch_size": 64},
            "eval": {"posthoc": [], "test_every_epoch": False},
            "scaling": {"num_workers": 1},
        }
    )
    net = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    cpu = torch.device("cpu")
    return _Trial(
        cfg, tmp_path, [], False, 0, 1, cpu, None, net, net, torch.nn.CrossEntropyLoss(), opt,
        Precision("fp32", cpu), None,
    )  # fmt: skip


@pytest.mark.parametrize("fails", [False, True])
def test_worker_mode_removes_its_temporary_checkpoint_folder_after_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    """Ray Train copies a reported checkpoint to the run's storage within ``ray.train.report``;
    the folder the worker wrote it to is removed afterwards (also when the report raises), so
    a long study does not leave one per epoch in the temp folder."""
    import ray.train

    from calibtune.trial._worker import EpochReporter

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    seen: list[bool] = []

    def report(metrics: dict, checkpoint: Any = None) -> None:
        seen.append(checkpoint is not None and any(Path(checkpoint.path).iterdir()))
        if fails:
            raise RuntimeError("the driver went away")

    monkeypatch.setattr(ray.train, "report", report)
    reporter = EpochReporter(_worker_trial(tmp_path))
    for epoch in (1, 2):
        try:
            reporter(epoch, {"epoch": epoch, "val/loss": 1.0 / epoch}, None)
        except RuntimeError:
            assert fails
    assert seen == [True, True]  # the checkpoint was there while Ray copied it
    assert list(tmpdir.glob("calibtune-ckpt-*")) == []


class _TuneTrial:
    """What `_trial_error` reads of a Tune trial: ``get_error()``."""

    def __init__(self, error: Any) -> None:
        self.error = error

    def get_error(self) -> Any:
        if isinstance(self.error, Exception) and str(self.error) == "unreadable":
            raise self.error
        return self.error


def test_a_trials_error_reads_as_ray_2_60_returns_it() -> None:
    """Ray 2.60's ``Trial.get_error`` returns its error file's text (a traceback, one entry per
    failure): the line shown is the last failure's exception, not an AttributeError."""
    import inspect

    from ray.tune.experiment.trial import Trial

    from calibtune.study._progress import _trial_error

    assert ".decode()" in inspect.getsource(Trial.get_error)  # the text, as here
    text = (
        "Failure # 1 (occurred at 2026-11-27)\nTraceback (most recent call last):\n"
        '  File "x.py", line 1\nray.exceptions.ActorDiedError: The actor died\n\n'
        "Failure # 2 (occurred at 2026-11-27)\nTraceback (most recent call last):\n"
        '  File "y.py", line 2\nValueError: loss became NaN at epoch 3\n'
    )
    assert _trial_error(_TuneTrial(text)) == "ValueError: loss became NaN at epoch 3"
    assert _trial_error(_TuneTrial(RuntimeError("boom"))) == "RuntimeError: boom"
    for missing in (None, "", "\n", RuntimeError("unreadable")):
        assert _trial_error(_TuneTrial(missing)) == "the trial's process failed (no details)"


def test_the_status_line_shows_slots_used_of_available() -> None:
    from calibtune.study._display import Counts, status_line

    line = status_line(Counts(3, 2, 0, 8), "val/ece", 0.02134, 65.0, (4, 4))
    assert line == (
        "trials 3 done, 2 running, 0 failed of 8 | slots 4/4 | best val/ece 0.0213 | "
        "1:05 elapsed, ETA 1:48"
    )
    assert "slots" not in status_line(Counts(3, 2, 0, 8), "val/ece", None, 65.0, None)


def test_slots_are_read_from_the_cluster_at_most_every_few_seconds() -> None:
    """Each reading is two GCS reads: drawn every second (or at every trial's end), the line
    reuses the last one for ``every_s``; an unreadable cluster leaves the slots out."""
    from calibtune.study._display import SlotReading

    now = [100.0]
    reads: list[float] = []

    def read() -> tuple[int, int]:
        reads.append(now[0])
        if now[0] >= 120:
            raise ConnectionError("GCS gone")
        return (len(reads), 4)

    slots = SlotReading(read, every_s=5.0, clock=lambda: now[0])
    seen = []
    for t in (100.0, 101.0, 104.9, 105.0, 106.0, 120.0, 121.0):
        now[0] = t
        seen.append(slots())
    assert reads == [100.0, 105.0, 120.0]
    assert seen == [(1, 4), (1, 4), (1, 4), (2, 4), (2, 4), None, None]
    now[0] = 50.0  # a clock behind the last reading (unpickled in another process): re-read
    slots()
    assert reads[-1] == 50.0


NO_RAY = """
import ray
from calibtune.studyfile._config import study_from_text
from calibtune.study._display import study_slots
study = study_from_text("name: s\\nlosses: [cross_entropy]", "s")
assert study_slots(study)() is None
assert not ray.is_initialized()  # reading the slots never starts a Ray
print("ok")
"""


def test_without_a_connected_ray_the_line_goes_on_without_slots() -> None:
    # a fresh interpreter: another test of this process may have left a Ray session connected
    run = subprocess.run(
        [sys.executable, "-c", NO_RAY], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


LATE_RESULT = """
import sys
if sys.argv[1] == "quiet":
    from calibtune.cluster._quiet import quiet_output
    quiet_output()
from ray import tune
from ray.tune.search.optuna import OptunaSearch
searcher = OptunaSearch({"lr": tune.uniform(0.0, 1.0)}, metric="m", mode="min", seed=1)
searcher.suggest("t1")
searcher.on_trial_complete("t1", {"m": 0.5, "training_iteration": 3})
searcher.on_trial_result("t1", {"m": 0.4, "training_iteration": 4, "config": {"big": 1}})
import logging
logging.getLogger("ray.tune.search.optuna.optuna_search").warning("another warning")
"""


@pytest.mark.parametrize("mode", ["quiet", "verbose"])
def test_a_late_result_of_a_finished_trial_is_not_printed_unless_verbose(mode: str) -> None:
    """OptunaSearch warns with the whole result dict for each result Tune replays on `resume`
    of a trial it already completed: quiet, that warning is dropped, no other."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", LATE_RESULT, mode],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "another warning" in out.stderr, out.stderr
    late = "Received additional result for trial t1" in out.stderr
    assert late == (mode == "verbose"), out.stderr
