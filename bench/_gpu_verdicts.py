"""The pass/fail rules of `make gpu-check` (bench/gpu_check.py) as pure functions.

Each takes thresholds and measured numbers and returns a `Verdict`: ``ok`` (a green row with what
was measured), red (``FAILED: why``) or not shown (the machine cannot show it, e.g. DDP on one
GPU). No rule reads a device: tests feed them a slow loop, a sync per step, disagreeing logits,
an eager fallback or a one-GPU machine and see red (tests/test_gpu_check_verdicts.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the trial's training throughput against the plain-PyTorch loop: the floor and the goal
SPEED_FLOOR, SPEED_GOAL = 0.85, 0.95
#: host syncs allowed in one training pass (the loop's one end-of-epoch read of its totals and
#: the epoch's index upload); none per step
SYNC_BUDGET = 3
#: a whole epoch (training, evaluation, metrics, checkpoint) against its training pass
EPOCH_BOUND_GPU, EPOCH_BOUND_CPU = 1.35, 2.0
#: GPU fp32 logits against CPU fp32 logits of one checkpoint: max |Δ| / max(1, max |logit|),
#: and the share of rows whose argmax may differ (ties broken by rounding)
LOGITS_RTOL, ARGMAX_FLIPS = 1e-3, 1e-3
#: bf16 against fp32 inference of one checkpoint: |ΔECE| (absolute), |ΔNLL| / NLL_fp32
ECE_ATOL, NLL_RTOL = 0.01, 0.02
#: history keys that measure time or the machine, not the model (excluded from resume equality)
TIMING_MARKS = ("time", "per_s", "gpu_")


@dataclass(frozen=True)
class Verdict:
    """``ok``: True (green), False (red) or None (not shown on this machine); ``text``: why."""

    ok: bool | None
    text: str

    def row(self) -> str:
        """The table cell: ``ok (text)``, ``FAILED: text`` or ``not shown (text)``.

        >>> Verdict(False, "0.5× of plain PyTorch").row()
        'FAILED: 0.5× of plain PyTorch'
        """
        if self.ok is None:
            return f"not shown ({self.text})"
        return f"ok ({self.text})" if self.ok else f"FAILED: {self.text}"


def _finite_positive(*xs: float) -> bool:
    return all(isinstance(x, int | float) and math.isfinite(x) and x > 0 for x in xs)


def speed(
    trial_sps: float, reference_sps: float, floor: float = SPEED_FLOOR, goal: float = SPEED_GOAL
) -> Verdict:
    """Red unless ``trial_sps / reference_sps ≥ floor`` (training samples per second of the
    trial and of the plain-PyTorch loop, same model, batch, precision, memory format and
    resident data, same run); the text gives the ratio and whether the goal is met.

    >>> speed(900.0, 1000.0).row()
    'ok (trial 900 img/s, plain PyTorch 1,000 img/s: 0.90× (floor 0.85×; goal 0.95× not met))'
    >>> speed(500.0, 1000.0).ok
    False
    """
    if not _finite_positive(trial_sps, reference_sps):
        return Verdict(False, f"no throughput measured (trial {trial_sps}, plain {reference_sps})")
    ratio = trial_sps / reference_sps
    met = "met" if ratio >= goal else "not met"
    text = (
        f"trial {trial_sps:,.0f} img/s, plain PyTorch {reference_sps:,.0f} img/s: "
        f"{ratio:.2f}× (floor {floor:.2f}×; goal {goal:.2f}× {met})"
    )
    return Verdict(ratio >= floor, text)


def syncs(count: int, steps: int, budget: int = SYNC_BUDGET) -> Verdict:
    """Red if a training pass of ``steps`` steps synced with the host more than ``budget``
    times (a sync per step shows as ``count ≥ steps``), or if ``steps ≤ budget`` (too few
    steps to tell a sync per step from the epoch's own reads: the check shows nothing).

    >>> syncs(1, 15).ok, syncs(16, 15).ok, syncs(0, 3).ok
    (True, False, False)
    """
    if steps <= budget:
        return Verdict(False, f"{steps} steps: need more than {budget} to tell a sync per step")
    text = (
        f"{count} host sync(s) in a training pass of {steps} steps (budget {budget}, none per step)"
    )
    return Verdict(count <= budget, text)


def epoch_bound(epoch_sps: float, train_sps: float, bound: float) -> Verdict:
    """Red unless the whole epoch's time (training, evaluation, metrics, checkpoint; from its
    throughput ``epoch_sps``) is at most ``bound`` × its training pass's (``train_sps``).

    >>> epoch_bound(800.0, 1000.0, 1.35).ok, epoch_bound(500.0, 1000.0, 1.35).ok
    (True, False)
    """
    if not _finite_positive(epoch_sps, train_sps):
        return Verdict(False, f"no epoch throughput (epoch {epoch_sps}, training {train_sps})")
    ratio = train_sps / epoch_sps
    text = f"whole epoch {ratio:.2f}× its training pass (bound {bound:.2f}×)"
    return Verdict(ratio <= bound, text)


def logits(got: Any, want: Any, rtol: float = LOGITS_RTOL, flips: float = ARGMAX_FLIPS) -> Verdict:
    """Red unless two (N, K) logit arrays of one checkpoint agree: ``max |got − want| ≤ rtol ·
    max(1, max |want|)`` and at most a ``flips`` share of rows change their argmax.

    >>> import torch
    >>> logits(torch.ones(4, 3), torch.ones(4, 3)).ok, logits(torch.eye(3), -torch.eye(3)).ok
    (True, False)
    """
    import torch

    a, b = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    if a.shape != b.shape or a.ndim != 2:
        return Verdict(False, f"expected two (N, K) arrays of one shape, got {a.shape}, {b.shape}")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return Verdict(False, "non-finite logits")
    diff = (a - b).abs().max().item() if a.numel() else 0.0
    scale = max(1.0, b.abs().max().item() if b.numel() else 1.0)
    changed = int((a.argmax(1) != b.argmax(1)).sum().item()) if a.numel() else 0
    allowed = math.floor(flips * a.shape[0])
    text = (
        f"max |Δ| {diff:.2e} (≤ {rtol * scale:.1e}), argmax differs on {changed} of "
        f"{a.shape[0]} rows (≤ {allowed})"
    )
    return Verdict(diff <= rtol * scale and changed <= allowed, text)


def calibration(
    ece: float,
    ece_ref: float,
    nll: float,
    nll_ref: float,
    ece_atol: float = ECE_ATOL,
    nll_rtol: float = NLL_RTOL,
) -> Verdict:
    """Red unless a low-precision inference (``ece``, ``nll``) of a checkpoint stays within
    ``|ΔECE| ≤ ece_atol`` and ``|ΔNLL| ≤ nll_rtol · NLL_ref`` of its fp32 inference.

    >>> calibration(0.031, 0.030, 0.501, 0.500).ok, calibration(0.06, 0.03, 0.5, 0.5).ok
    (True, False)
    """
    values = (ece, ece_ref, nll, nll_ref)
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        return Verdict(False, f"non-finite ECE/NLL: {values}")
    d_ece, d_nll = abs(ece - ece_ref), abs(nll - nll_ref)
    text = (
        f"ECE {ece:.4f} vs {ece_ref:.4f} (|Δ| {d_ece:.4f} ≤ {ece_atol}), NLL {nll:.4f} vs "
        f"{nll_ref:.4f} (|Δ| {d_nll:.4f} ≤ {nll_rtol * abs(nll_ref):.4f})"
    )
    return Verdict(d_ece <= ece_atol and d_nll <= nll_rtol * abs(nll_ref), text)


def _model_keys(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if not any(m in k for m in TIMING_MARKS)}


def history(full: Sequence[Mapping[str, Any]], resumed: Sequence[Mapping[str, Any]]) -> Verdict:
    """Red unless an uninterrupted run's per-epoch history equals a resumed run's exactly, key
    by key (timings and device readings — keys containing one of `TIMING_MARKS` — excluded).

    >>> history([{"epoch": 1, "loss": 0.5, "train_time": 2.0}], [{"epoch": 1, "loss": 0.5}]).ok
    True
    """
    e_full = [r.get("epoch") for r in full]
    e_res = [r.get("epoch") for r in resumed]
    if e_full != e_res or not e_full:
        return Verdict(False, f"expected the same epochs, got {e_full} and {e_res}")
    for a, b in zip(full, resumed, strict=True):
        ma, mb = _model_keys(a), _model_keys(b)
        for key in sorted(set(ma) | set(mb)):
            if ma.get(key, "missing") != mb.get(key, "missing"):
                return Verdict(
                    False,
                    f"epoch {a['epoch']} {key}: {ma.get(key, 'missing')!r} uninterrupted vs "
                    f"{mb.get(key, 'missing')!r} resumed",
                )
    n = len(_model_keys(full[-1]))
    return Verdict(True, f"epochs {e_full} identical, {n} values each")


def memory(
    nvml_peak: Mapping[int, float],
    nvml_sum_peak: float,
    total: float,
    share: float,
    reserved_peak: Sequence[float] = (),
) -> Verdict:
    """Packed trials on one device of ``total`` bytes, each holding ``share`` of it: red unless
    every process's NVML peak (context and workspaces included; ``nvml_peak`` pid -> bytes) is
    within its ``share × total`` and the sum over the processes at any one sample
    (``nvml_sum_peak``) is within the device. ``reserved_peak``: each trial's peak
    ``memory_reserved`` (its caching allocator), which must fit its share too.

    >>> memory({1: 3e9, 2: 3e9}, 6e9, 16e9, 0.25).ok, memory({1: 5e9}, 5e9, 16e9, 0.25).ok
    (True, False)
    """
    if not nvml_peak:
        return Verdict(False, "NVML saw no trial process on the device")
    cap = share * total
    over = {pid: b for pid, b in nvml_peak.items() if b > cap}
    res_over = [b for b in reserved_peak if b > cap]
    gib = 2**30
    text = (
        f"{len(nvml_peak)} processes, NVML peak {max(nvml_peak.values()) / gib:.2f} GiB each "
        f"(cap {cap / gib:.2f}), sum {nvml_sum_peak / gib:.2f} of {total / gib:.1f} GiB"
    )
    if reserved_peak:
        text += f", memory_reserved peak {max(reserved_peak) / gib:.2f} GiB"
    if over:
        text += f"; over the cap: pids {sorted(over)}"
    if res_over:
        text += f"; memory_reserved over the cap in {len(res_over)} trial(s)"
    return Verdict(not over and not res_over and nvml_sum_peak <= total, text)


def compiled(
    frames_ok: int,
    graph_breaks: int,
    recompiles: int,
    recompile_limit: int,
    fallbacks: Sequence[str],
    suppress_errors: bool,
) -> Verdict:
    """Red unless the compiled path really ran: dynamo compiled at least one frame, with no
    graph break, no eager fallback (calibtune's warning ``torch.compile failed … using the eager
    path``, listed in ``fallbacks``), ``suppress_errors`` off (else a failure turns eager
    silently) and fewer recompiles than dynamo's limit (past it a frame runs eager).

    >>> compiled(2, 0, 1, 8, [], False).ok, compiled(0, 0, 0, 8, ["no triton"], False).ok
    (True, False)
    """
    why = []
    if suppress_errors:
        why.append("torch._dynamo.config.suppress_errors is on")
    if fallbacks:
        why.append(f"eager fallback: {fallbacks[0][:200]}")
    if frames_ok < 1:
        why.append("dynamo compiled no frame")
    if graph_breaks:
        why.append(f"{graph_breaks} graph break(s)")
    if recompiles >= recompile_limit:
        why.append(f"{recompiles} recompiles reach the limit {recompile_limit}")
    text = f"{frames_ok} frame(s) compiled, {recompiles} recompile(s), {graph_breaks} graph breaks"
    return Verdict(not why, "; ".join([*why, text]) if why else text)


def ddp(device_count: int, cpu: bool = False) -> Verdict | None:
    """None when the DDP rows can run (2+ GPUs, or the CPU dry run with gloo); else a not-shown
    verdict: one GPU shows nothing about DDP.

    >>> ddp(1).row(), ddp(2), ddp(0, cpu=True)
    ('not shown (1 GPU)', None, None)
    """
    if cpu or device_count >= 2:
        return None
    return Verdict(None, f"{device_count} GPU")


def summary(
    rows: Sequence[tuple[str, str, float]], ddp_titles: Sequence[str], dry: bool = False
) -> str:
    """The closing line: how many rows passed, failed and were not shown, and whether the DDP
    path is proven (every DDP row ``ok`` on GPUs) — never without a DDP row run, never by a
    ``dry`` run (the CPU's gloo shows nothing of nccl).

    >>> summary([("a", "ok (x)", 1.0), ("ddp", "not shown (1 GPU)", 0.0)], ["ddp"])
    'gpu-check: 1 ok, 0 FAILED, 1 not shown; the DDP path is unproven (needs 2 GPUs)'
    """
    ok = sum(r.startswith("ok") for _, r, _ in rows)
    bad = sum(r.startswith("FAILED") for _, r, _ in rows)
    hidden = sum(r.startswith(("not shown", "skipped")) for _, r, _ in rows)
    ddp_rows = [r for n, r, _ in rows if n in ddp_titles]
    if any(r.startswith("FAILED") for r in ddp_rows):
        state = "the DDP path FAILED"
    elif dry:
        state = "the DDP path is unproven (a CPU dry run: gloo, not nccl)"
    elif ddp_rows and all(r.startswith("ok") for r in ddp_rows):
        state = "the DDP path is shown"
    else:
        state = "the DDP path is unproven (needs 2 GPUs)"
    return f"gpu-check: {ok} ok, {bad} FAILED, {hidden} not shown; {state}"
