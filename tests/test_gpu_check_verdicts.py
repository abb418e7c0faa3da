"""The pass/fail rules of `make gpu-check` (bench/_gpu_verdicts.py) turn red on what a wrong or
slow GPU path measures: a slow loop, a sync per step, a slow epoch end, disagreeing logits, a
drifting bf16 inference, a resume that changes the history, memory past the device, an eager
fallback, and DDP on one GPU (never a green row, and the summary says it is unproven)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import _gpu_verdicts as V


def test_a_loop_slower_than_the_floor_is_red_and_the_ratio_is_printed():
    slow = V.speed(trial_sps=800.0, reference_sps=1000.0)
    assert slow.ok is False and slow.row().startswith("FAILED: ") and "0.80×" in slow.text
    at_floor = V.speed(850.0, 1000.0)
    assert at_floor.ok and "0.85×" in at_floor.text and "goal 0.95× not met" in at_floor.text
    assert "goal 0.95× met" in V.speed(960.0, 1000.0).text
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        assert V.speed(bad, 1000.0).ok is False and V.speed(1000.0, bad).ok is False


def test_a_sync_per_step_is_red_the_epochs_own_reads_are_not():
    assert V.syncs(count=2, steps=15).ok
    assert V.syncs(count=V.SYNC_BUDGET, steps=15).ok
    per_step = V.syncs(count=15 + 2, steps=15)
    assert per_step.ok is False and "17 host sync(s)" in per_step.text
    # too few steps to tell a sync per step from the epoch's reads: not a green row
    assert V.syncs(count=0, steps=V.SYNC_BUDGET).ok is False


def test_an_epoch_end_slower_than_its_bound_is_red():
    assert V.epoch_bound(epoch_sps=800.0, train_sps=1000.0, bound=1.35).ok  # 1.25×
    slow = V.epoch_bound(epoch_sps=700.0, train_sps=1000.0, bound=1.35)  # 1.43×
    assert slow.ok is False and "1.43×" in slow.text
    assert V.epoch_bound(0.0, 1000.0, 1.35).ok is False


def test_disagreeing_logits_are_red():
    g = torch.Generator().manual_seed(0)
    want = torch.randn(1000, 10, generator=g) * 5
    assert V.logits(want + 1e-5, want).ok
    off = V.logits(want + 0.1, want)  # one checkpoint, other numbers
    assert off.ok is False and "max |Δ| 1.00e-01" in off.text
    flipped = want.clone()
    flipped[:5] = -flipped[:5]  # 5 of 1000 rows change their class: past the 0.1 %
    assert V.logits(flipped, want).ok is False
    assert V.logits(want[:, :9], want).ok is False  # shapes differ
    nan = want.clone()
    nan[0, 0] = float("nan")
    assert V.logits(nan, want).ok is False


def test_a_bf16_inference_outside_the_ece_or_nll_bound_is_red():
    assert V.calibration(0.035, 0.030, 0.505, 0.500).ok
    assert V.calibration(0.045, 0.030, 0.500, 0.500).ok is False  # |ΔECE| 0.015
    assert V.calibration(0.030, 0.030, 0.520, 0.500).ok is False  # |ΔNLL| 4 %
    assert V.calibration(float("nan"), 0.03, 0.5, 0.5).ok is False


def test_a_resume_that_changes_the_history_is_red_timings_aside():
    full = [{"epoch": e, "val/ece": 0.1 * e, "train_time": 1.0, "samples_per_s": 9.0,
             "gpu_util": 50.0} for e in (1, 2, 3)]  # fmt: skip
    same = [{**r, "train_time": 2.0, "samples_per_s": 4.0, "gpu_util": 1.0} for r in full]
    assert V.history(full, same).ok
    other = [dict(r) for r in same]
    other[2]["val/ece"] = 0.30000001
    red = V.history(full, other)
    assert red.ok is False and red.text.startswith("epoch 3 val/ece:")
    assert V.history(full, same[:2]).ok is False
    missing = [dict(r) for r in same]
    del missing[1]["val/ece"]
    assert V.history(full, missing).ok is False
    assert V.history([], []).ok is False


def test_packed_memory_past_a_share_or_the_device_is_red():
    gib = 2**30
    assert V.memory({1: 3 * gib, 2: 3.5 * gib}, 6.5 * gib, 16 * gib, 0.25, [3 * gib]).ok
    over = V.memory({1: 3 * gib, 2: 4.5 * gib}, 7.5 * gib, 16 * gib, 0.25)
    assert over.ok is False and "pids [2]" in over.text
    assert V.memory({1: 3 * gib}, 17 * gib, 16 * gib, 0.25).ok is False  # the sum
    assert V.memory({1: 3 * gib}, 3 * gib, 16 * gib, 0.25, [5 * gib]).ok is False  # reserved
    assert V.memory({}, 0.0, 16 * gib, 0.25).ok is False  # nothing seen is nothing shown


def test_an_eager_fallback_or_a_silent_compile_is_red():
    assert V.compiled(3, 0, 2, 8, [], False).ok
    fallback = V.compiled(0, 0, 0, 8, ["loss focal: torch.compile failed (no triton)"], False)
    assert fallback.ok is False and "eager fallback" in fallback.text
    assert V.compiled(3, 0, 2, 8, [], True).ok is False  # suppress_errors would hide it
    assert V.compiled(0, 0, 0, 8, [], False).ok is False  # nothing compiled
    assert V.compiled(3, 1, 2, 8, [], False).ok is False  # a graph break
    assert V.compiled(9, 0, 8, 8, [], False).ok is False  # past the limit: eager


@pytest.mark.parametrize("gpus", [0, 1])
def test_with_fewer_than_two_gpus_the_ddp_rows_are_not_shown_and_the_summary_says_unproven(gpus):
    hidden = V.ddp(gpus)
    assert hidden is not None and hidden.ok is None
    assert hidden.row() == f"not shown ({gpus} GPU)"
    rows = [("trial", "ok (x)", 1.0), ("ddp", hidden.row(), 0.0), ("syncbn", hidden.row(), 0.0)]
    line = V.summary(rows, ["ddp", "syncbn"])
    assert line == "gpu-check: 1 ok, 0 FAILED, 2 not shown; the DDP path is unproven (needs 2 GPUs)"


def test_the_ddp_path_is_shown_only_when_every_ddp_row_ran_green_on_gpus():
    assert V.ddp(2) is None and V.ddp(0, cpu=True) is None
    ok = [("ddp", "ok (2 ranks)", 1.0), ("syncbn", "ok (x)", 1.0)]
    assert V.summary(ok, ["ddp", "syncbn"]).endswith("the DDP path is shown")
    assert "unproven (a CPU dry run" in V.summary(ok, ["ddp", "syncbn"], dry=True)
    half = [("ddp", "ok (2 ranks)", 1.0), ("syncbn", "not shown (1 GPU)", 0.0)]
    assert V.summary(half, ["ddp", "syncbn"]).endswith("unproven (needs 2 GPUs)")
    assert V.summary([], ["ddp"]).endswith("unproven (needs 2 GPUs)")
    red = [("ddp", "FAILED: rank 1 hung", 1.0)]
    assert V.summary(red, ["ddp"], dry=True).endswith("the DDP path FAILED")
