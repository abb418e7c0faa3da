"""``train.deterministic`` and ``scaling.sync_batchnorm`` (issue 27, items 4 and 7): the flags a
deterministic trial trains under, SyncBatchNorm conversion, and their bad input."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from calibtune.cli import main
from calibtune.trial import config_from_dict, run
from calibtune.trial._worker import determinism, sync_norm

cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul


def _flags() -> dict[str, Any]:
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn.benchmark": cudnn.benchmark,
        "cudnn.deterministic": cudnn.deterministic,
        "cudnn.allow_tf32": cudnn.allow_tf32,
        "matmul.allow_tf32": matmul.allow_tf32,
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


DETERMINISTIC = {
    "deterministic_algorithms": True,
    "cudnn.benchmark": False,
    "cudnn.deterministic": True,
    "cudnn.allow_tf32": False,
    "matmul.allow_tf32": False,
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}


def test_deterministic_sets_every_flag_and_restores_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = _flags()
    with determinism(True, use_gpu=True):
        assert _flags() == DETERMINISTIC
    assert _flags() == before  # a Tune actor's next trial starts from the process's flags
    with determinism(False, use_gpu=True):
        assert cudnn.benchmark and not torch.are_deterministic_algorithms_enabled()
    with determinism(False, use_gpu=False):
        assert not cudnn.benchmark
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's valid choice stays
    with determinism(True, use_gpu=True):
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


class _Flags:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_epoch(self, epoch: int, metrics: Any) -> None:
        self.seen.append(_flags())

    def on_trial_end(self, metrics: Any, artifacts_dir: Path) -> None:
        pass


def test_a_deterministic_trial_trains_under_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    flags = _Flags()
    cfg = {
        "name": "det",
        "storage_path": str(tmp_path),
        "data": {"name": "digits", "ood": [], "shift": []},
        "model": {"name": "mlp"},
        "train": {"epochs": 1, "batch_size": 256, "deterministic": True},
        "eval": {"posthoc": ["ts"], "bootstrap": 0, "figures": False},
    }
    run(config_from_dict(cfg), callbacks=[flags])
    assert flags.seen == [DETERMINISTIC]
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the trial


def test_sync_batchnorm_converts_every_batchnorm_with_several_workers() -> None:
    from calibtune.models import build_model

    def count(net: torch.nn.Module, kind: type) -> int:
        return sum(isinstance(m, kind) for m in net.modules())

    on = config_from_dict({"scaling": {"use_gpu": True, "sync_batchnorm": True}})
    off = config_from_dict({"scaling": {"use_gpu": True}})

    def net() -> torch.nn.Module:
        return build_model("small_cnn", 10, (1, 8, 8))

    n_bn = count(net(), torch.nn.BatchNorm2d)
    assert n_bn > 0 and off.scaling.sync_batchnorm is False  # off by default
    assert count(sync_norm(net(), on, 2), torch.nn.SyncBatchNorm) == n_bn
    assert count(sync_norm(net(), on, 1), torch.nn.SyncBatchNorm) == 0  # one worker: nothing
    assert count(sync_norm(net(), off, 2), torch.nn.SyncBatchNorm) == 0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"train": {"deterministic": "yes"}},
            "train.deterministic: expected a boolean (true/false), got 'yes'",
        ),
        (
            {"scaling": {"sync_batchnorm": 1}},
            "scaling.sync_batchnorm: expected a boolean (true/false), got 1",
        ),
        (
            {"scaling": {"num_workers": 2, "sync_batchnorm": True}},
            "scaling.sync_batchnorm: expected false without scaling.use_gpu (torch's "
            "SyncBatchNorm runs on CUDA only), got True",
        ),
    ],
)
def test_bad_values_are_refused_in_one_line(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as err:
        config_from_dict(raw)
    assert str(err.value) == message


def test_cli_refuses_sync_batchnorm_on_the_cpu_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "t.yaml"
    cfg.write_text("data: {name: digits, ood: []}\ntrain: {epochs: 1}\n")
    code = main(["train", str(cfg), "--set", "scaling.sync_batchnorm=true"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "scaling.sync_batchnorm: expected false without" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]  # nothing written
