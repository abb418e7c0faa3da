"""`make gpu-check` (bench/gpu_check.py) stays runnable where no GPU is: it says so and exits 0,
and its steps run green on the CPU with tiny data (the same commands). `make test` runs the steps
that need no Ray cluster (local trials, resume elsewhere, compile on/off: 49 s of CPU time, 164 s
of wall time at load 15 on 2 cores); the Ray steps (Train worker, study, SIGKILL, 2 workers,
packed trials) run in `make gpu-check-dry`, and what they drive is tested in the suite's Ray
tests (test_trial_workers, test_study_e2e, test_faults, test_cluster_ddp, test_packing)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_check  # noqa: E402


def test_without_a_gpu_it_says_it_needs_one_and_exits_0():
    proc = subprocess.run(
        ["make", "-s", "gpu-check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stdout.strip()
        == "gpu-check: needs a CUDA GPU (none is visible here); nothing to check"
    )


# `long`: `make gpu-check-dry` runs these steps; the verdict rules and each step's failure
# stay in `make test` (tests/test_gpu_check_verdicts.py, tests/test_gpu_check_steps.py)
@pytest.mark.long
@pytest.mark.slow
def test_the_steps_without_ray_run_green_on_the_cpu_with_tiny_data(tmp_path):
    """Local trials with OOD and TS, a checkpoint resumed with another device, compile on/off
    (``--tiny``: 500/200 images, small_cnn); all steps: `make gpu-check-dry`."""
    out = tmp_path / "table.md"
    proc = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--cpu", "--tiny", "--precision", "fp32",
         "--steps", "local,resume,compile", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = out.read_text().splitlines()
    rows = [r for r in lines if r.startswith("| ") and not r.startswith("| step |")]
    steps = [r.split(" | ")[0].lstrip("| ") for r in rows]
    assert steps == [
        "write CIFAR-10 and SVHN",
        "trial, local mode",
        "GPU checkpoint resumes elsewhere",
        "loss.compile on vs off",
    ]
    assert all(" | ok (" in r for r in rows), rows
    assert "epochs 1-2 on the CPU, 3 on the CPU" in rows[2]
    assert lines[-1] == (
        "gpu-check: 4 ok, 0 FAILED, 0 not shown; "
        "the DDP path is unproven (a CPU dry run: gloo, not nccl)"
    )


def test_every_step_is_selectable_and_runs_in_the_documented_order():
    assert [t for t, _ in gpu_check.STEPS.values()] == [
        "trial, local mode",
        "trial, Train worker",
        "study: run, compare, export",
        "worker SIGKILL, restart",
        "2 Train workers, one killed, resumed",
        "4 trials packed on one GPU",
        "GPU checkpoint resumes elsewhere",
        "loss.compile on vs off",
        "one epoch, host syncs counted",
        "training speed vs plain PyTorch",
        "one checkpoint: device vs CPU logits, bf16 vs fp32",
        "3 epochs vs 2 + 1 resumed, deterministic",
        "loss.compile on: compiled, no eager fallback",
        "paper settings: fp32, 1 worker, checkpoint_every 10",
        "trial, fp16",
        "sync_batchnorm, 2 Train workers",
        "AdaFocal, update_every 2",
    ]
    assert gpu_check.DDP_TITLES == (
        "2 Train workers, one killed, resumed",
        "sync_batchnorm, 2 Train workers",
    )
    assert gpu_check._steps("compile,local") == ["local", "compile"]
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected 'all' or steps among local"):
        gpu_check._steps("local,nccl")


def test_on_one_gpu_the_ddp_rows_are_not_shown_and_the_summary_says_the_path_is_unproven(
    tmp_path, monkeypatch
):
    """One GPU: the DDP steps (2 workers killed and resumed, sync_batchnorm) start nothing and
    say ``not shown (1 GPU)``: never a green row; the summary says the DDP path is unproven."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    args = argparse.Namespace(cpu=False, small=True, tiny=True, precision="bf16")
    c = gpu_check.Check(tmp_path, {})
    c.step("trial, local mode", lambda: "a stand-in green row")
    for key in ("ddp2", "syncbn"):
        title, fn = gpu_check.STEPS[key]
        c.step(title, lambda fn=fn: fn(c, args, tmp_path))
    assert [r for _, r, _ in c.rows[1:]] == ["not shown (1 GPU)", "not shown (1 GPU)"]
    assert not c.failed
    assert gpu_check.V.summary(c.rows, gpu_check.DDP_TITLES) == (
        "gpu-check: 1 ok, 0 FAILED, 2 not shown; the DDP path is unproven (needs 2 GPUs)"
    )
    assert not list(tmp_path.iterdir())  # nothing written, nothing run
