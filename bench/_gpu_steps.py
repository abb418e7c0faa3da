"""The measuring steps of `make gpu-check` that run in its own process (bench/gpu_check.py).

Each runs real code on the check's device (CUDA, or the CPU in the dry run) and hands its
numbers to a rule of `_gpu_verdicts`; a step returns its green text or raises `Red`:

- `speed_step`: the trial's training throughput against `reference_throughput`, a plain-PyTorch
  loop on the same model, batch, precision, memory format and resident data, in the same
  process; and the whole epoch's time against its training pass;
- `sync_step`: one epoch's training passes with every host sync counted (`CudaSyncs`:
  ``torch.cuda.set_sync_debug_mode("warn")``; on the CPU `HostReads` counts the reads that
  would sync a device: ``item``, ``tolist``, ``cpu``, …);
- `numbers_step`: one checkpoint's logits on the device against the CPU's (fp32), and its bf16
  inference's ECE and NLL against fp32's;
- `resume_step`: 3 uninterrupted epochs against 2 + 1 resumed, ``train.deterministic: true``;
- `compile_step`: ``loss.compile: on`` really compiled (dynamo counters, no eager fallback).

Trials run in this process (local mode, `calibtune.trial.run`), so the counters see them.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import _gpu_verdicts as V
import torch
import torch.nn.functional as F


class Red(RuntimeError):
    """A rule said no: the row is ``FAILED: <message>``."""


def require(verdict: V.Verdict) -> str:
    """``verdict.text`` if it is green, else raise `Red` with it."""
    if verdict.ok is not True:
        raise Red(verdict.text)
    return verdict.text


def run_trial(cfg: dict, storage: Any, name: str | None = None) -> Any:
    """`calibtune.trial.run` in this process (local mode); its `TrialResult`."""
    from calibtune.trial import run

    return run(copy.deepcopy(cfg), storage_path=storage, name=name)


# --- host syncs -------------------------------------------------------------------------------


class HostReads:
    """Counts calls that read a tensor's value to the host (``with HostReads() as r: …;
    r.count``): on a GPU each of them syncs, so on the CPU they stand for the syncs."""

    METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")

    def __init__(self) -> None:
        self.count = 0
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> HostReads:
        for name in self.METHODS:
            original = self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counting(original))
        return self

    def _counting(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return original(tensor, *args, **kwargs)

        return read

    def __exit__(self, *exc: object) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)


class CudaSyncs:
    """Counts CUDA host syncs: ``torch.cuda.set_sync_debug_mode("warn")`` makes every
    synchronizing call warn ("called a synchronizing CUDA operation"); each is counted. Warn,
    not error: the loop's one end-of-epoch read is by design, and a count tells it from a sync
    per step."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> CudaSyncs:
        self._mode = torch.cuda.get_sync_debug_mode()
        self._caught = warnings.catch_warnings(record=True)
        self._log = self._caught.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.set_sync_debug_mode(self._mode)
        self.count += sum("synchroniz" in str(w.message) for w in self._log)
        self._caught.__exit__(*exc)


def sync_counter(device: torch.device) -> HostReads | CudaSyncs:
    """The sync counter for ``device``: `CudaSyncs` on CUDA, else `HostReads`."""
    return CudaSyncs() if torch.device(device).type == "cuda" else HostReads()


@contextlib.contextmanager
def counted_training_passes(device: torch.device) -> Iterator[list[tuple[int, int]]]:
    """Yields a list that gets ``(syncs, steps)`` for each training pass run inside (the
    loop's ``_train_epoch``, wrapped with `sync_counter`)."""
    from calibtune.training import _loop

    original = getattr(_loop, "_train_epoch", None)
    if original is None:
        raise Red("cannot count syncs: calibtune.training._loop has no _train_epoch")
    passes: list[tuple[int, int]] = []

    def counted(spec: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        steps = math.ceil(len(sources.train) / spec.batch_size)
        with sync_counter(device) as counter:
            out = original(spec, sources, *args, **kwargs)
        passes.append((counter.count, steps))
        return out

    _loop._train_epoch = counted
    try:
        yield passes
    finally:
        _loop._train_epoch = original


def sync_step(cfg: dict, storage: Any, device: torch.device) -> str:
    """One epoch of ``cfg``'s trial with every host sync of its training pass counted; red past
    `_gpu_verdicts.SYNC_BUDGET` (a sync per step) or with too few steps to tell."""
    cfg = copy.deepcopy(cfg)
    cfg["train"]["epochs"] = 1
    with counted_training_passes(device) as passes:
        run_trial(cfg, storage)
    if len(passes) != 1:
        raise Red(f"expected one training pass, counted {len(passes)}")
    return require(V.syncs(*passes[0]))


# --- speed --------------------------------------------------------------------------------------


def crop_flip(x: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Per-sample random translation by up to ``pad`` pixels (zero fill) and horizontal flip of
    a float ``(B, C, H, W)`` batch, by one gather: the usual CIFAR augmentation."""
    b, _, h, w = x.shape
    dev = x.device
    xp = F.pad(x, (pad, pad, pad, pad))
    i = torch.randint(0, 2 * pad + 1, (b, 1, 1), device=dev)
    j = torch.randint(0, 2 * pad + 1, (b, 1, 1), device=dev)
    cols = torch.arange(w, device=dev).view(1, 1, w)
    flip = torch.rand(b, 1, 1, device=dev) < 0.5
    cols = torch.where(flip, w - 1 - cols, cols) + j
    rows = torch.arange(h, device=dev).view(1, h, 1) + i
    out = xp[torch.arange(b, device=dev).view(b, 1, 1), :, rows, cols]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _matmul_flags(precision: str, device: torch.device) -> Iterator[None]:
    """The trial's TF32 and cuDNN autotuning flags for ``precision`` (``fp32`` is strict fp32,
    ``tf32`` turns TF32 on), restored on exit."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32)
    cudnn.benchmark = device.type == "cuda"
    if precision in ("fp32", "tf32"):
        cudnn.allow_tf32 = matmul.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = saved


@contextlib.contextmanager
def _restore_threads(threads: int) -> Iterator[None]:
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference_throughput(cfg: dict, device: torch.device, epochs: int = 2) -> float:
    """Training samples per second of a plain-PyTorch loop over ``cfg``'s training split: the
    same model, batch size, SGD, precision (autocast dtype, fp16's GradScaler) and memory
    format, intra-op threads (the trial's CPU share), the uint8 images resident on ``device``,
    augmented (`crop_flip`) and normalised per batch, cross-entropy; the fastest of ``epochs``
    epochs (the first warms up)."""
    from calibtune.data import load_splits
    from calibtune.models import build_model

    d, t, o = cfg["data"], cfg["train"], cfg["optimizer"]
    splits = load_splits(d["name"], root=d.get("root"), seed=d.get("split_seed", 1),
                         val_fraction=d.get("val_fraction", 0.1))  # fmt: skip
    train = splits.train
    x_all, y_all = train.images.to(device), train.labels.to(device)
    scale, shift = train._scale.to(device), train._shift.to(device)
    torch.manual_seed(cfg.get("seed", 1))
    model = build_model(cfg["model"]["name"], splits.num_classes, splits.input_shape).to(device)
    last = bool(t.get("channels_last"))
    if last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=o.get("momentum", 0.0),
                          weight_decay=o.get("weight_decay", 0.0))  # fmt: skip
    precision = t.get("precision", "fp32")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    n, best = x_all.shape[0], math.inf
    threads = torch.get_num_threads()  # the trial's intra-op threads: its CPU share (≥ 1)
    torch.set_num_threads(max(1, int(cfg["scaling"].get("resources_per_worker", {}).get("CPU", 1))))
    with _matmul_flags(precision, device), _restore_threads(threads):
        for _ in range(epochs):
            _sync(device)
            t0 = time.perf_counter()
            for idx in torch.randperm(n, device=device).split(t["batch_size"]):
                x = crop_flip(x_all[idx].float()) * scale + shift
                if last:
                    x = x.contiguous(memory_format=torch.channels_last)
                ctx = (
                    torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
                )
                with ctx:
                    out = model(x)
                loss = F.cross_entropy(out.float(), y_all[idx])
                opt.zero_grad(set_to_none=True)
                if scaler is None:
                    loss.backward()
                    opt.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
            _sync(device)
            best = min(best, time.perf_counter() - t0)
    return n / best


def epoch_throughput(record: dict, n_train: int, dry: bool) -> float:
    """An epoch's whole-epoch throughput: ``epoch_samples_per_s`` (training, evaluation and
    checkpoint); in the CPU dry run only, a trial without that key yet falls back to
    ``n_train / epoch_time`` (no checkpoint in it); on a GPU its absence is red."""
    if "epoch_samples_per_s" in record:
        return float(record["epoch_samples_per_s"])
    if dry and record.get("epoch_time"):
        return n_train / float(record["epoch_time"])
    raise Red("the trial reports no epoch_samples_per_s (the whole epoch's throughput)")


def speed_step(cfg: dict, storage: Any, device: torch.device, dry: bool) -> str:
    """The trial (cross-entropy, 3 epochs) against `reference_throughput` (3 epochs) on the same
    device, in this process: red below `_gpu_verdicts.SPEED_FLOOR` × the plain loop, or when
    its whole epoch takes more than the bound × its training pass (the fastest warm epoch of
    each: the first autotunes cuDNN and compiles)."""
    cfg = copy.deepcopy(cfg)
    cfg["loss"] = {"name": "cross_entropy"}
    cfg["train"]["epochs"] = 3
    ref_sps = reference_throughput(cfg, device, epochs=3)
    warm = run_trial(cfg, storage).history[1:]  # the first epoch autotunes and compiles
    last = max(warm, key=lambda r: float(r["samples_per_s"]))
    trial_sps = float(last["samples_per_s"])
    n_train = round(trial_sps * float(last["train_time"]))
    bound = V.EPOCH_BOUND_CPU if dry else V.EPOCH_BOUND_GPU
    speed = V.speed(trial_sps, ref_sps)
    whole = V.epoch_bound(epoch_throughput(last, n_train, dry), trial_sps, bound)
    if not speed.ok or not whole.ok:
        raise Red("; ".join(v.text for v in (speed, whole)))
    return f"{speed.text}; {whole.text}"


# --- numbers ------------------------------------------------------------------------------------


def latest_state(result: Any) -> dict[str, Any]:
    """The latest checkpoint of a finished local trial (`calibtune.trial.load_state`)."""
    from calibtune.trial import load_state
    from calibtune.trial._checkpoint import latest_local_checkpoint

    where = latest_local_checkpoint(result.trial_dir / "checkpoints")
    if where is None:
        raise Red(f"trial {result.config.name!r} left no checkpoint")
    return load_state(where)


def checkpoint_logits(
    cfg: dict, state: dict[str, Any], device: torch.device, precision: str = "fp32"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Test-split logits (float32, CPU) and labels of the model in ``state`` on ``device``,
    through the trial's inference path (`calibtune.training.infer_logits`); ``fp32`` with TF32
    off, ``bf16``/``fp16`` under autocast with the float32 head."""
    from calibtune.data import load_splits
    from calibtune.models import build_model
    from calibtune.training import Precision, infer_logits

    d, m = cfg["data"], cfg["model"]
    splits = load_splits(d["name"], root=d.get("root"), seed=d.get("split_seed", 1),
                         val_fraction=d.get("val_fraction", 0.1))  # fmt: skip
    model = build_model(m["name"], splits.num_classes, splits.input_shape, **m.get("params", {}))
    model.load_state_dict(state["model"])
    model.to(device)
    autocast = None if precision == "fp32" else Precision(precision, device).autocast
    with _matmul_flags("fp32" if precision == "fp32" else precision, device):
        return infer_logits(model, splits.test, batch_size=1024, device=device, autocast=autocast)


def ece_nll(logits: torch.Tensor, labels: torch.Tensor, n_bins: int = 15) -> tuple[float, float]:
    """``(ECE, NLL)`` of `calibtune.metrics.calibration_report`."""
    from calibtune.metrics import calibration_report

    report = calibration_report(logits=logits, labels=labels, n_bins=n_bins)
    return float(report["ece"]), float(report["nll"])


def numbers_step(cfg: dict, storage: Any, device: torch.device) -> str:
    """One checkpoint of ``cfg``'s trial: fp32 logits on ``device`` against the CPU's, and bf16
    inference's ECE and NLL against fp32's on ``device``; red outside the stated bounds."""
    state = latest_state(run_trial(cfg, storage))
    fp32, labels = checkpoint_logits(cfg, state, device, "fp32")
    cpu, _ = checkpoint_logits(cfg, state, torch.device("cpu"), "fp32")
    bf16, _ = checkpoint_logits(cfg, state, device, "bf16")
    agree = V.logits(fp32, cpu)
    (ece, nll), (ece_ref, nll_ref) = ece_nll(bf16, labels), ece_nll(fp32, labels)
    calib = V.calibration(ece, ece_ref, nll, nll_ref)
    where = "CPU against CPU (dry run)" if device.type == "cpu" else f"{device} against CPU"
    text = f"fp32 logits {where}: {agree.text}; bf16 against fp32: {calib.text}"
    if not (agree.ok and calib.ok):
        raise Red(text)
    return text


# --- resume, compile ------------------------------------------------------------------------------


def resume_step(cfg: dict, storage: Any) -> str:
    """``train.deterministic: true``: 3 uninterrupted epochs against 2 then 1 resumed from the
    checkpoint; red unless the histories are identical (timings aside)."""
    cfg = copy.deepcopy(cfg)
    cfg["train"]["deterministic"] = True
    cfg["train"]["epochs"] = 3
    full = run_trial(cfg, storage, name=f"{cfg['name']}_full")
    split = f"{cfg['name']}_resumed"
    first = copy.deepcopy(cfg)
    first["train"]["epochs"] = 2
    run_trial(first, storage, name=split)
    resumed = run_trial(cfg, storage, name=split)
    if resumed.resumed_from_epoch != 2:
        raise Red(
            f"expected the second run to resume after epoch 2, got {resumed.resumed_from_epoch}"
        )
    return require(V.history(full.history, resumed.history))


def compile_step(cfg: dict, storage: Any) -> str:
    """``cfg``'s trial with ``loss.compile: on``: red unless dynamo compiled the loss (frames
    counted), with no eager fallback, no graph break, ``suppress_errors`` off and fewer
    recompiles than its limit."""
    from torch._dynamo import config as dynamo_config
    from torch._dynamo.utils import counters

    cfg = copy.deepcopy(cfg)
    cfg["loss"] = {**cfg["loss"], "compile": "on"}
    counters.clear()
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        run_trial(cfg, storage)
    fallbacks = [str(w.message) for w in log if "torch.compile failed" in str(w.message)]
    frames = int(counters["frames"]["ok"])
    limit = int(getattr(dynamo_config, "recompile_limit", dynamo_config.cache_size_limit))
    return require(
        V.compiled(
            frames_ok=frames,
            graph_breaks=int(sum(counters["graph_break"].values())),
            recompiles=max(0, frames - 1),  # one loss instance: every frame after the first
            recompile_limit=limit,
            fallbacks=fallbacks,
            suppress_errors=bool(dynamo_config.suppress_errors),
        )
    )


# --- memory ---------------------------------------------------------------------------------------


class NvmlPeaks:
    """``with NvmlPeaks(index) as nv:`` polls NVML every ``period_s``: ``nv.peak`` (pid ->
    the most device memory that process used, context and workspaces included; this process
    excluded) and ``nv.sum_peak`` (the most all processes used at one sample)."""

    def __init__(self, index: int = 0, period_s: float = 0.2) -> None:
        self.index, self.period_s = index, period_s
        self.peak: dict[int, float] = {}
        self.sum_peak = 0.0

    def __enter__(self) -> NvmlPeaks:
        import threading

        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="gpu-check-nvml")
        self._thread.start()
        return self

    def _poll(self) -> None:
        import os

        me = os.getpid()
        while not self._stop.wait(self.period_s):
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
            used = {p.pid: float(p.usedGpuMemory or 0) for p in procs}
            self.sum_peak = max(self.sum_peak, sum(used.values()))
            for pid, b in used.items():
                if pid != me:
                    self.peak[pid] = max(self.peak.get(pid, 0.0), b)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._nvml.nvmlShutdown()
