"""Loose ends of issues 28 and 29: worker-mode checkpoint folders removed, Tune's error text
read as Ray 2.60 gives it, the progress line's slots, Ray's warnings kept off a quiet terminal."""

from __future__ import annotations

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
