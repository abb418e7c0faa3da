"""The training loop: epochs, cached-logit evaluation passes, adaptive-loss updates, reports.

Pure PyTorch (no Ray): the trial adapter passes in the (possibly DDP-wrapped) model, the data,
a learning-rate function and an ``on_epoch_end`` callback that reports and checkpoints.

Per epoch ``e`` (1-based):
  1. train over the rank's batches of the global permutation for ``(seed, e)`` (for a
     mixup-family loss `DeviceBatches` mixes each one with the loss's ``batch_transform``);
     an adaptive loss with integer ``update_every`` is updated after every ``update_every``
     batches from a fresh validation pass, after which the model goes back to ``train()``;
  2. one validation pass (cached logits) feeds both the epoch-end adaptive update
     (``update_every == "epoch"``) and the validation ``calibration_report`` (and, for the
     ``epoch_posthoc`` methods, their fit and ``val/<m>@<name>`` report on the same logits;
     with ``epoch_selective`` also AURC/AUGRC/refinement NLL, else those wait for the end);
  3. optionally one test pass; then ``on_epoch_end(e, metrics, cache)``.
AdaFocal (Ghosh et al., NeurIPS 2022, Alg. 1) updates γ from validation-bin statistics once per
epoch; all ranks score the full validation set (sharded + all-gathered), so every rank computes
the same update, and ``broadcast_state(src=0)`` removes any floating-point doubt.
With W > 1 ranks every inference pass starts from rank 0's buffers (`_sync_buffers`: BatchNorm
running statistics), so the gathered logits are rank 0's model's, the one its checkpoint holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.utils.data import Dataset

from calibtune.metrics import calibration_report
from calibtune.metrics import keys as K
from calibtune.training._batches import DeviceBatches, epoch_index_batches, infer_logits
from calibtune.training._final import posthoc_val_metrics
from calibtune.training._precision import Precision
from calibtune.training._uncertainty import selective_metrics
from calibtune.training._utilisation import DeviceMonitor

__all__ = [
    "EpochCache",
    "LoopSpec",
    "NonFiniteLossError",
    "Progress",
    "epoch_metrics",
    "lr_schedule",
    "train_epochs",
]


class NonFiniteLossError(FloatingPointError):
    """Raised when the training loss becomes NaN/inf; the message names epoch and step."""


def _non_finite(epoch: int, step: int, loss: float, lr: float) -> NonFiniteLossError:
    return NonFiniteLossError(
        f"non-finite loss at epoch {epoch}, step {step} (loss={loss}, lr={lr:g}); "
        "lower optimizer.lr or set train.grad_clip"
    )


@dataclass
class Progress:
    """Where the loop is (plain Python numbers, no device read): a failure names it."""

    epoch: int = 0
    step: int = 0
    phase: str = "build"  # build, training, evaluation, final evaluation

    def where(self) -> str:
        if self.phase == "training":
            return f"epoch {self.epoch}, step {self.step}"
        if self.phase == "evaluation":
            return f"epoch {self.epoch}, evaluation"
        return self.phase


@dataclass
class EpochCache:
    """Logits from this epoch's evaluation passes (float32 CPU), reused by every consumer."""

    val_logits: Tensor
    val_labels: Tensor
    test_logits: Tensor | None = None
    test_labels: Tensor | None = None
    updates: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LoopSpec:
    """Everything `train_epochs` needs; ``batch_size`` is the global batch (all ranks)."""

    model: nn.Module  # the (possibly DDP-wrapped) model used for training steps
    loss_fn: nn.Module
    optimizer: torch.optim.Optimizer
    lr_at: Callable[[int], float]  # epoch (1-based) -> learning rate
    train_set: Dataset
    val_set: Dataset
    test_set: Dataset | None
    epochs: int
    batch_size: int
    eval_batch_size: int = 1024
    n_bins: int = 15
    seed: int = 1
    grad_clip: float | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    augment: Callable[[Tensor], Tensor] | None = None
    test_every_epoch: bool = True
    loader_workers: int = 0
    rank: int = 0
    world: int = 1
    eval_model: nn.Module | None = None  # unwrapped module for inference (no DDP hooks)
    # post-hoc methods fitted and scored on validation every epoch (``val/<m>@<name>``)
    epoch_posthoc: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # val/{aurc,augrc,refinement_nll}[@<name>] every epoch (`K.is_final_only`; else final only)
    epoch_selective: bool = False
    # autocast dtype, GradScaler (fp16) and memory format of training and inference forwards
    precision: Precision = field(default_factory=Precision)
    progress: Progress = field(default_factory=Progress)  # updated in place as the loop runs


def lr_schedule(
    base_lr: float,
    kind: str,
    epochs: int,
    milestones: tuple[int, ...] = (),
    gamma: float = 0.1,
    warmup_epochs: int = 0,
) -> Callable[[int], float]:
    """Learning rate of epoch ``e`` (1-based) as a pure function, so resuming needs only ``e``.

    ``step``: ``base · gamma^{#{m ∈ milestones : m < e}}`` (the seeds decay after epochs 150 and
    250 of 350); ``cosine``: ``base · ½(1 + cos(π (e−1)/E))``; ``constant``: ``base``. A linear
    warm-up over the first ``warmup_epochs`` epochs multiplies each.
    """

    def lr_at(e: int) -> float:
        if kind == "step":
            lr = base_lr * gamma ** sum(1 for m in milestones if m < e)
        elif kind == "cosine":
            lr = base_lr * 0.5 * (1.0 + math.cos(math.pi * (e - 1) / epochs))
        elif kind == "constant":
            lr = base_lr
        else:
            raise ValueError(f"schedule: expected one of step, cosine, constant, got {kind!r}")
        if warmup_epochs and e <= warmup_epochs:
            lr *= e / (warmup_epochs + 1)
        return lr

    return lr_at


def epoch_metrics(
    prefix: str, logits: Tensor, labels: Tensor, n_bins: int, *, selective: bool = False
) -> dict[str, float]:
    """``{prefix/<key>: value}`` for every scalar of ``calibration_report`` on cached logits;
    with ``selective`` also ``prefix/{aurc,augrc,refinement_nll}`` (`K.FINAL_ONLY_KEYS`)."""
    report = calibration_report(logits=logits, labels=labels, n_bins=n_bins)
    out: dict[str, float] = {}
    for k, v in report.items():
        if isinstance(v, Tensor) and v.numel() == 1:
            v = v.item()
        if isinstance(v, int | float):
            out[K.key(prefix, k)] = float(v)
    if selective:
        probs = torch.softmax(logits.double(), 1)
        out.update(selective_metrics(probs, labels, prefix, logits=logits))
    return out


def _sync_buffers(model: nn.Module, src: int = 0) -> None:
    """Give every rank rank ``src``'s buffers (BatchNorm running mean/var and batch count), in
    place: one ``broadcast`` of the flattened buffers per dtype (two for a BatchNorm network:
    float statistics and int64 counts, instead of one per buffer, 159 for ResNet-50); call on all
    ranks. After a training step each rank's running statistics include its own batch, so
    without this the all-gathered logits would come from W slightly different models while the
    checkpoint holds rank 0's."""
    groups: dict[torch.dtype, list[Tensor]] = {}
    for buf in model.buffers():
        groups.setdefault(buf.dtype, []).append(buf)
    for bufs in groups.values():  # the same dtypes in the same order on every rank
        flat = _flatten_dense_tensors([b.detach() for b in bufs])
        dist.broadcast(flat, src=src)
        for buf, synced in zip(bufs, _unflatten_dense_tensors(flat, bufs), strict=True):
            buf.copy_(synced)


def _adaptive(loss_fn: nn.Module) -> bool:
    return bool(getattr(loss_fn, "adaptive", False))


def _update_loss(loss_fn: nn.Module, logits: Tensor, labels: Tensor) -> dict[str, Any]:
    record = loss_fn.update(torch.softmax(logits, dim=1), labels)
    if dist.is_available() and dist.is_initialized():
        loss_fn.broadcast_state(src=0)
    return record


@dataclass
class _Sources:
    """The trial's three `DeviceBatches` (uploaded once per `train_epochs` call)."""

    train: DeviceBatches
    val: DeviceBatches
    test: DeviceBatches | None

    @classmethod
    def of(cls, spec: LoopSpec) -> _Sources:
        def owner(ds: Dataset, augment: Any = None) -> DeviceBatches:
            return DeviceBatches(
                ds,
                spec.device,
                augment=augment,
                num_workers=spec.loader_workers,
                channels_last=spec.precision.channels_last,
            )

        test = None if spec.test_set is None else owner(spec.test_set)
        train = owner(spec.train_set, spec.augment)
        # a mixup-family loss (issue 23) mixes each training batch: the owner applies it
        train.mix = getattr(spec.loss_fn, "batch_transform", None)
        return cls(train, owner(spec.val_set), test)


def train_epochs(
    spec: LoopSpec,
    *,
    start_epoch: int = 0,
    on_epoch_end: Callable[[int, dict[str, Any], EpochCache], None] | None = None,
) -> EpochCache | None:
    """Train epochs ``start_epoch+1 .. spec.epochs``; return the last epoch's cache.

    The host reads device values once per epoch (the totals and the first non-finite step),
    never per step; a non-finite loss raises `NonFiniteLossError` naming the epoch and the first
    bad step once that epoch's training pass (or an adaptive update inside it) ends."""
    eval_model = spec.eval_model if spec.eval_model is not None else spec.model
    sources = _Sources.of(spec)
    cache: EpochCache | None = None

    def infer(ds: DeviceBatches) -> tuple[Tensor, Tensor]:
        if spec.world > 1:
            _sync_buffers(eval_model)
        return infer_logits(
            eval_model,
            ds,
            batch_size=spec.eval_batch_size,
            device=spec.device,
            rank=spec.rank,
            world=spec.world,
            autocast=spec.precision.autocast,
        )

    for epoch in range(start_epoch + 1, spec.epochs + 1):
        t0 = time.perf_counter()
        lr = spec.lr_at(epoch)
        for group in spec.optimizer.param_groups:
            group["lr"] = lr
        with DeviceMonitor(spec.device) as monitor:  # its thread ends if the epoch raises
            totals, updates = _train_epoch(spec, sources, epoch, lr, infer)
            train_time = time.perf_counter() - t0
            busy = monitor.stop()
        metrics, cache = _evaluate_epoch(spec, sources, epoch, lr, totals, updates, infer)
        metrics["train_time"] = train_time
        metrics["samples_per_s"] = len(sources.train) / train_time  # all ranks together
        metrics.update(busy)
        metrics["epoch_time"] = time.perf_counter() - t0
        if on_epoch_end is not None:
            on_epoch_end(epoch, metrics, cache)
    return cache


def _update_every(loss_fn: nn.Module) -> int | str | None:
    """None for a loss without state; else its ``update_every`` (batches, or ``"epoch"``)."""
    return getattr(loss_fn, "update_every", "epoch") if _adaptive(loss_fn) else None


class _Totals:
    """This rank's per-step losses (float64) and wrong counts, written into preallocated device
    buffers without a host read; `check` reduces them once (Σ per-sample loss, #wrong, #seen)
    and finds the first non-finite step. Two small writes per step: cheaper than running sums
    plus a first-bad-step tracker (measured on the CPU, bench/README.md)."""

    def __init__(self, device: torch.device, sizes: list[int], summed: bool = False) -> None:
        self.sizes = sizes  # the epoch's batch sizes (host)
        self.losses = torch.zeros(len(sizes), dtype=torch.float64, device=device)
        self.wrong = torch.zeros(len(sizes), dtype=torch.int64, device=device)
        self.summed = summed  # the loss is already Σ over the batch (``loss.reduction: sum``)
        self.steps = 0

    def add(self, step: int, loss: Tensor, logits: Tensor, y: Tensor) -> None:
        self.losses[step - 1] = loss.detach()
        self.wrong[step - 1] = (logits.detach().argmax(1) != y).sum()
        self.steps = step

    def check(self, epoch: int, lr: float, world: int) -> Tensor:
        """Raise `NonFiniteLossError` if any rank saw a non-finite loss (one host read; under
        DDP every rank learns the lowest bad step, so all stop together); return the float64
        ``[Σ per-sample loss, #wrong, #seen]`` of all ranks."""
        n = self.steps
        losses = self.losses[:n]
        weights = losses.new_tensor(self.sizes[:n]) if not self.summed else None
        bad = ~torch.isfinite(losses)
        first = torch.where(bad.any(), bad.to(torch.int64).argmax() + 1, 0)
        total = losses.sum() if weights is None else (losses * weights).sum()
        seen = float(sum(self.sizes[:n]))
        sums = torch.stack([total, self.wrong[:n].sum().double(), losses.new_tensor(seen)])
        if world > 1:
            step_t = torch.where(first > 0, first.double(), math.inf).reshape(1)
            dist.all_reduce(sums)
            dist.all_reduce(step_t, op=dist.ReduceOp.MIN)
            step, loss = step_t.item(), math.nan  # the loss itself stays on its rank
        else:
            step, loss = 0, 0
            if n:  # a tensor index: ``losses[first - 1]`` would read ``first`` to the host
                at = (first - 1).clamp(min=0).reshape(1)
                step, loss = torch.cat([first.double().reshape(1), losses[at]]).cpu().tolist()
            step = step if step > 0 else math.inf
        if math.isfinite(step):
            raise _non_finite(epoch, int(step), loss, lr)
        return sums


def _train_epoch(
    spec: LoopSpec,
    sources: _Sources,
    epoch: int,
    lr: float,
    infer: Callable[[DeviceBatches], tuple[Tensor, Tensor]],
) -> tuple[Tensor, list[dict[str, Any]]]:
    """One pass over this rank's batches of epoch ``epoch``; returns the float64
    ``[Σ loss·B, #wrong, #seen]`` of all ranks and the adaptive-loss updates made every
    ``update_every`` batches (each from a fresh validation pass)."""
    every = _update_every(spec.loss_fn)
    spec.model.train()
    n_train = len(sources.train)
    batches = epoch_index_batches(
        n_train, spec.batch_size, seed=spec.seed, epoch=epoch, rank=spec.rank, world=spec.world
    )
    summed = getattr(spec.loss_fn, "reduction", "mean") == "sum"
    totals = _Totals(spec.device, [len(b) for b in batches], summed)
    updates: list[dict[str, Any]] = []
    progress = spec.progress
    progress.epoch, progress.step, progress.phase = epoch, 0, "training"
    for step, (x, y) in enumerate(sources.train.batches(batches, train=True), start=1):
        progress.step = step
        logits, loss = _step(spec, x, y)
        clean = getattr(y, "labels", y)  # mixed batches: the clean rows come first
        totals.add(step, loss, logits[: clean.shape[0]], clean)
        if isinstance(every, int) and step % every == 0:
            totals.check(epoch, lr, spec.world)  # never bin a diverged model's validation
            v_logits, v_labels = infer(sources.val)
            updates.append(_update_loss(spec.loss_fn, v_logits, v_labels))
            # the official AdaFocal code left the model in eval() after this pass
            spec.model.train()
    sums = totals.check(epoch, lr, spec.world)
    progress.phase = "evaluation"
    return sums, updates


def _step(spec: LoopSpec, x: Tensor, y: Any) -> tuple[Tensor, Tensor]:
    """One optimizer step on the batch ``(x, y)`` (on ``spec.device``, no host read); returns
    its float32 logits and loss. A non-finite loss is found later, in `_Totals.check`; under
    DDP its NaN gradients reach every rank, so all ranks stop at the same epoch. ``y``: labels,
    or a mixup-family loss's targets (`DeviceBatches` mixed the batch)."""
    logits = spec.precision.forward(spec.model, x)
    loss = spec.loss_fn(logits, y)
    spec.precision.step(loss, spec.optimizer, spec.model.parameters(), spec.grad_clip)
    return logits, loss


def _evaluate_epoch(
    spec: LoopSpec,
    sources: _Sources,
    epoch: int,
    lr: float,
    totals: Tensor,
    updates: list[dict[str, Any]],
    infer: Callable[[DeviceBatches], tuple[Tensor, Tensor]],
) -> tuple[dict[str, Any], EpochCache]:
    """The epoch's end: one validation pass (the epoch-end adaptive update, the validation
    report, the ``epoch_posthoc`` methods), the optional test pass, and the metrics to report
    (training loss and error over all ranks' ``totals``)."""
    val_logits, val_labels = infer(sources.val)
    if _update_every(spec.loss_fn) == "epoch":
        updates.append(_update_loss(spec.loss_fn, val_logits, val_labels))
    loss_sum, wrong, seen = totals.tolist()
    metrics: dict[str, Any] = {
        "epoch": epoch,
        "lr": lr,
        K.key("train", "loss"): loss_sum / seen,
        K.key("train", "error"): wrong / seen,
    }
    sel = spec.epoch_selective
    metrics.update(epoch_metrics("val", val_logits, val_labels, spec.n_bins, selective=sel))
    if spec.epoch_posthoc:
        metrics.update(
            posthoc_val_metrics(
                val_logits, val_labels, spec.epoch_posthoc, spec.n_bins, selective=sel
            )
        )
    cache = EpochCache(val_logits, val_labels, updates=updates)
    if sources.test is not None and (spec.test_every_epoch or epoch == spec.epochs):
        cache.test_logits, cache.test_labels = infer(sources.test)
        metrics.update(epoch_metrics("test", cache.test_logits, cache.test_labels, spec.n_bins))
    if _adaptive(spec.loss_fn) and updates:
        metrics.update(_adaptive_metrics(updates))
    return metrics, cache


def _adaptive_metrics(updates: list[dict[str, Any]]) -> dict[str, Any]:
    """The last update's per-bin γ, edges and gap (confidence − accuracy) and their summary."""
    last = updates[-1]
    gammas = _floats(last.get("gammas"))
    gap = [
        c - a for c, a in zip(_floats(last.get("c_val")), _floats(last.get("a_val")), strict=True)
    ]
    return {
        K.key("adaptive", "gammas"): gammas,
        K.key("adaptive", "edges"): _floats(last.get("edges")),
        K.key("adaptive", "gap"): gap,
        **K.adaptive_summary(gammas, gap, len(updates)),
    }


def _floats(v: Any) -> list[float]:
    if v is None:
        return []
    if isinstance(v, Tensor):
        return [float(x) for x in v.detach().cpu().reshape(-1).tolist()]
    if isinstance(v, Mapping):
        return [float(x) for x in v.values()]
    return [float(x) for x in v]
