"""The GPU-only steps of `make gpu-check` (bench/_gpu_steps.py) run on the CPU with tiny data
and turn red when fed what a wrong or slow GPU path would do: a training step that syncs with
the host every step, a deliberately slowed step against the plain-PyTorch loop, a checkpoint
whose logits disagree, a compiler that falls back to eager. Only what lies below a step is
replaced (the loop's optimizer step, the loss's compile hook, a checkpoint's weights)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import _gpu_steps as S  # noqa: E402
import _gpu_verdicts as V  # noqa: E402
import gpu_check  # noqa: E402

from calibtune.losses import _compile  # noqa: E402
from calibtune.training import _loop  # noqa: E402

CPU = torch.device("cpu")
pytestmark = pytest.mark.slow  # tiny trials in this process: ≈ 40 s in all on 2 busy cores


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cifar")
    gpu_check.write_cifar10(root, 500, 200)
    return root


def _cfg(data: Path, name: str, **over: object) -> dict:
    args = argparse.Namespace(cpu=True, small=True, tiny=True, precision="fp32")
    return gpu_check._quick(args, data, name, **over)


def _wrap_step(monkeypatch, after) -> None:
    """The loop's optimizer step, followed by ``after(loss)`` (what a wrong loop adds)."""
    step = _loop._step

    def wrapped(spec, x, y):
        logits, loss = step(spec, x, y)
        after(loss)
        return logits, loss

    monkeypatch.setattr(_loop, "_step", wrapped)


def test_the_training_pass_syncs_once_per_epoch_and_a_sync_per_step_turns_red(
    data, tmp_path, monkeypatch
):
    cfg = _cfg(data, "syncs", train__batch_size=32)  # 450 training images: 15 steps
    text = S.sync_step(cfg, tmp_path / "a", CPU)
    assert text.endswith("in a training pass of 15 steps (budget 3, none per step)")
    _wrap_step(monkeypatch, lambda loss: loss.item())  # a loop that logs its loss every step
    with pytest.raises(S.Red, match=r"^1[0-9] host sync\(s\) in a training pass of 15 steps"):
        S.sync_step(cfg, tmp_path / "b", CPU)


def test_a_trial_slower_than_the_plain_pytorch_loop_turns_the_speed_row_red(
    data, tmp_path, monkeypatch
):
    _wrap_step(monkeypatch, lambda loss: time.sleep(0.1))  # 4 steps: ≥ 0.4 s an epoch
    with pytest.raises(S.Red, match=r"^trial [0-9,]+ img/s, plain PyTorch [0-9,]+ img/s: 0\.") as e:
        S.speed_step(_cfg(data, "speed"), tmp_path, CPU, dry=True)
    assert "floor 0.85×" in str(e.value) and "its training pass (bound 2.00×)" in str(e.value)


def test_the_plain_loop_trains_the_same_model_and_reports_its_throughput(data):
    before = torch.get_num_threads()
    assert S.reference_throughput(_cfg(data, "plain"), CPU, epochs=1) > 0
    assert torch.get_num_threads() == before


def test_a_checkpoints_logits_agree_across_runs_and_a_perturbed_one_turns_red(data, tmp_path):
    cfg = _cfg(data, "numbers", train__epochs=1)
    text = S.numbers_step(cfg, tmp_path, CPU)
    assert text.startswith("fp32 logits CPU against CPU (dry run): max |Δ| 0.00e+00")
    assert "bf16 against fp32: ECE" in text
    state = S.latest_state(S.run_trial(cfg, tmp_path))  # finished: the same checkpoint
    want, labels = S.checkpoint_logits(cfg, state, CPU)
    assert want.shape == (200, 10) and labels.shape == (200,)
    other = {**state, "model": {k: v.clone() for k, v in state["model"].items()}}
    head = [k for k, v in other["model"].items() if v.is_floating_point()][-1]  # the fc bias
    other["model"][head] += 0.01  # another checkpoint: logits off by 0.01
    got, _ = S.checkpoint_logits(cfg, other, CPU)
    red = V.logits(got, want)
    assert red.ok is False and "max |Δ| 1.00e-02" in red.text


def test_three_epochs_and_two_plus_one_resumed_have_one_history(data, tmp_path):
    assert S.resume_step(_cfg(data, "resume"), tmp_path).startswith("epochs [1, 2, 3] identical")


def test_the_compiled_path_is_shown_and_an_eager_fallback_turns_red(data, tmp_path, monkeypatch):
    cfg = _cfg(data, "compiled", loss__name="focal", loss__params={}, train__epochs=1)
    # dynamo traces the loss as on a GPU; its eager backend spares the C++ build on this CPU
    monkeypatch.setattr(_compile, "compile_hook",
                        lambda fn: torch.compile(fn, dynamic=False, backend="eager"))  # fmt: skip
    text = S.compile_step(cfg, tmp_path / "a")
    assert "frame(s) compiled" in text and ", 0 graph breaks" in text

    def no_compiler(fn):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(_compile, "compile_hook", no_compiler)
    with pytest.raises(S.Red, match=r"^eager fallback: loss focal: torch.compile failed"):
        S.compile_step({**cfg, "name": "compiled_b"}, tmp_path / "b")
