"""The worker side of a trial: the Ray Train training function, in four steps.

`train_loop_per_worker` runs on every Train worker (or in-process in local mode):

1. **build** — data, model, loss and optimiser from the validated config (`_build`);
2. **resume** — model/optimiser/loss state, this rank's RNG and the epoch history from the latest
   checkpoint, if any (`_resume`); epochs restored but never logged are logged now;
3. **report** — after each epoch: checkpoint, log (rank 0's callbacks), then report to Ray Train
   or Tune (`EpochReporter`): a report blocks until the driver takes it, so logging first keeps
   a killed driver from losing a logged epoch (a study's MLflow callback sends the batch from a
   thread while the next epoch trains; see `calibtune.record._tracking.MlflowTrialCallback`);
4. **finalize** — rank 0 fits the post-hoc methods on the cached validation logits, scores test
   and OOD sets, writes the artifacts and hands the final metrics to the callbacks (`_finalize`);
   the figures too, unless a callback ``defers_figures`` (a study's: its driver renders them
   after Tune has the result, so the trial's CPU or GPU goes to the next trial at once).

The trial's CPU threads come from its resources (``scaling.resources_per_worker.CPU``, default
1), never from the machine, so its numbers do not depend on where it runs; every rank checkpoints
its own RNG state, so a restarted multi-worker trial draws what the uninterrupted one drew.

Every rank reaches every collective, in the same order: a value that steers one (whether this
epoch checkpoints) is decided on rank 0 and broadcast (`decided_on_rank0`), and the code that
rank 0 runs alone (the epoch's ``val_shift/`` keys, the final evaluation) calls none.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from calibtune import data as D
from calibtune._failpoints import failpoint
from calibtune.data import load_splits
from calibtune.losses import compile_loss
from calibtune.metrics import keys as K
from calibtune.models import build_model
from calibtune.storage import open_storage
from calibtune.training import (
    DeviceBatches,
    LoopSpec,
    OODLogits,
    Precision,
    Progress,
    epoch_val_shift,
    evaluate_final,
    infer_logits,
    lr_schedule,
    shift_logits,
    tf32_enabled,
    train_epochs,
)
from calibtune.trial._artifacts import drop_stage, scalars, write_artifacts
from calibtune.trial._checkpoint import (
    capture_rng,
    epoch_dir,
    latest_local_checkpoint,
    load_state,
    prune_local_checkpoints,
    restore_rng,
    save_state,
)
from calibtune.trial._config import TrialConfig, config_from_dict
from calibtune.trial._errors import failure
from calibtune.trial._metrics import shift_sets
from calibtune.trial._placement import (
    hold_share,
    indexed_device,
    record_placement,
    worker_bundle,
)
from calibtune.trial._select import best_epoch, is_new_best, keep_local, score

# Lazy: Ray (`ray.train`, `ray.tune`) only inside the functions that run in a Ray Train worker,
# so that `import calibtune.trial` (the `train` command, study config checks) does not load Ray.

__all__ = [
    "data_model_inputs",
    "decided_on_rank0",
    "determinism",
    "sync_norm",
    "train_loop_per_worker",
    "trial_threads",
]


def trial_threads(cfg: TrialConfig) -> int:
    """Intra-op threads of one trial process: its CPU resources (at least 1)."""
    return max(1, int(cfg.scaling.resources_per_worker.get("CPU", 1.0)))


def train_loop_per_worker(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The Ray Train training function; returns rank 0's result (other ranks: None).

    A failure is re-raised with one line naming calibtune's innermost frame (file:line), the
    epoch and the step (`calibtune.trial._errors.failure`); the full traceback goes to the
    trial's ``artifacts/error.txt`` (and, through the callbacks, to its MLflow run)."""
    cfg = config_from_dict(payload["config"])
    before = torch.get_num_threads()
    torch.set_num_threads(trial_threads(cfg))
    try:
        with determinism(
            cfg.train.deterministic, cfg.scaling.use_gpu, tf32_enabled(cfg.train.precision)
        ):
            return _train(cfg, payload)
    finally:
        torch.set_num_threads(before)


def _train(cfg: TrialConfig, payload: dict[str, Any]) -> dict[str, Any] | None:
    progress = Progress()
    t: _Trial | None = None
    try:
        t = _build(cfg, payload, progress)
        _resume(t)
        ranks = record_placement(t.trial_dir / "artifacts", t.rank, t.world, t.start_epoch)
        if t.rank == 0:  # epochs restored from the checkpoint but never logged
            for cb in t.callbacks:
                if hasattr(cb, "on_start"):
                    cb.on_start(t.history)
        cache = train_epochs(
            _loop_spec(t), start_epoch=t.start_epoch, on_epoch_end=EpochReporter(t)
        )
        progress.phase = "final evaluation"
        return _finalize(t, cache, ranks) if t.rank == 0 else None
    except Exception as exc:
        rank = t.rank if t is not None else 0
        callbacks = t.callbacks if t is not None and rank == 0 else []
        err = failure(exc, progress, open_storage(payload["trial_dir"]), rank, callbacks)
        if err is exc:
            raise
        raise err from exc


#: cuBLAS's deterministic workspace settings (CUDA docs, "Results reproducibility")
_CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


@contextmanager
def determinism(deterministic: bool, use_gpu: bool, tf32: bool = False) -> Iterator[None]:
    """The trial's numerics flags, restored on exit (a Tune actor runs the next trial).

    TF32 in CUDA matmuls and cuDNN convolutions is on exactly when ``tf32`` (``train.precision:
    tf32``, `calibtune.training.tf32_enabled`): ``fp32`` means IEEE float32, whatever torch's
    default for cuDNN. ``deterministic``: ``torch.use_deterministic_algorithms(True)`` (an op
    without a deterministic implementation raises, naming itself),
    ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (set here, before the trial's first CUDA call; cuBLAS
    reads it once per process), cuDNN benchmark off and deterministic on. Otherwise
    ``cudnn.benchmark`` is on with a GPU (fixed input shapes: autotune once per shape), so a
    GPU run is not bit-reproducible.

    >>> with determinism(True, use_gpu=False):
    ...     torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.allow_tf32
    (True, False)
    >>> with determinism(False, use_gpu=True, tf32=True):
    ...     torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    (True, True)
    """
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn.benchmark,
        cudnn.deterministic,
        cudnn.allow_tf32,
        matmul.allow_tf32,
        os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    if deterministic:
        if saved[-1] not in _CUBLAS_DETERMINISTIC:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = _CUBLAS_DETERMINISTIC[0]
        torch.use_deterministic_algorithms(True)
        cudnn.deterministic = True
    cudnn.allow_tf32 = matmul.allow_tf32 = bool(tf32)
    cudnn.benchmark = use_gpu and not deterministic
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32, matmul.allow_tf32 = saved[2:6]
        if saved[-1] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[-1]


@dataclass
class _Trial:
    """What one rank built: its place in the group, the data, model, loss and optimiser."""

    cfg: TrialConfig
    trial_dir: Path
    callbacks: list[Any]
    via_tune: bool  # a local-mode trial inside Tune reports to Tune directly
    rank: int
    world: int
    device: torch.device
    splits: Any
    net: torch.nn.Module  # the plain model (checkpoints, evaluation)
    model: torch.nn.Module  # what trains: DDP-wrapped when world > 1
    loss_fn: torch.nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    progress: Progress
    start_epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def local(self) -> bool:
        return self.cfg.scaling.num_workers == 0


def _build(cfg: TrialConfig, payload: dict[str, Any], progress: Progress) -> _Trial:
    import ray.train
    import ray.train.torch

    # Ray 2.60 refuses ray.train.get_context/report inside a Tune session; a local-mode trial
    # there is one in-process rank
    via_tune = bool(payload["tune_report"])
    rank, world = (0, 1) if via_tune else _rank_world()
    device = torch.device("cpu")
    if cfg.scaling.use_gpu:
        # a local trial holds the indexed current device from the start (memory cap, RNG)
        device = (
            indexed_device("cuda") if cfg.scaling.num_workers == 0 else ray.train.torch.get_device()
        )
    hold_share(worker_bundle(cfg.scaling), device)  # packed trials: memory cap, compile threads
    precision = Precision(cfg.train.precision, device, cfg.train.channels_last)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    splits = load_splits(
        cfg.data.name,
        root=cfg.data.root,
        seed=cfg.data.split_seed,
        val_fraction=cfg.data.val_fraction,
    )
    net = precision.prepare(
        build_model(
            cfg.model.name,
            splits.num_classes,
            splits.input_shape,
            init=cfg.model.init,
            **cfg.model.params,
            **data_model_inputs(splits),
        ).to(device)
    )
    loss_fn = cfg.loss.build().to(device)  # params validated with the config
    loss_fn = compile_loss(loss_fn, cfg.loss.compile, device)
    optimizer = _optimizer(cfg, net.parameters())
    # augmentation draws differ per rank; model init (above) is identical on all ranks
    torch.manual_seed(cfg.seed * 7919 + 1 + rank)
    net = sync_norm(net, cfg, world)
    model = ray.train.torch.prepare_model(net) if world > 1 else net
    return _Trial(
        cfg,
        open_storage(payload["trial_dir"]),  # a disk or a bucket (`calibtune.storage`)
        list(payload["callbacks"]),
        via_tune,
        rank,
        world,
        device,
        splits,
        net,
        model,
        loss_fn,
        optimizer,
        precision,
        progress,
    )


def _rank_world() -> tuple[int, int]:
    import ray.train

    ctx = ray.train.get_context()
    return ctx.get_world_rank(), ctx.get_world_size()


def _optimizer(cfg: TrialConfig, params: Any) -> torch.optim.Optimizer:
    o = cfg.optimizer
    if o.name == "sgd":
        return torch.optim.SGD(
            params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, nesterov=o.nesterov
        )
    if o.name == "adam":
        return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)
    if o.name == "adagrad":  # Tai et al.'s Tree-LSTM recipe (SST): no momentum
        return torch.optim.Adagrad(params, lr=o.lr, weight_decay=o.weight_decay)
    return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)


def data_model_inputs(splits: Any) -> dict[str, Any]:
    """The network parameters a data set supplies (``splits.model_inputs()``: SST's initial
    word vectors for ``treelstm``); ``{}`` for every other set.

    >>> data_model_inputs(object())
    {}
    """
    own = getattr(splits, "model_inputs", None)
    return dict(own()) if callable(own) else {}


def _resume(t: _Trial) -> None:
    """Load the latest checkpoint (Ray's after a worker restart, else the local folder's)."""
    import ray.train

    state = None
    ray_ckpt = None if t.via_tune else ray.train.get_checkpoint()
    if ray_ckpt is not None:
        with ray_ckpt.as_directory() as d:
            state = load_state(d)
    elif t.local and (latest := latest_local_checkpoint(t.trial_dir / "checkpoints")) is not None:
        state = load_state(latest)
    if state is None:
        return
    t.net.load_state_dict(state["model"])
    t.optimizer.load_state_dict(state["optimizer"])
    t.loss_fn.load_state_dict(state["loss"])
    t.precision.load_state_dict(state.get("scaler") or {})
    rngs = state.get("rngs") or [state["rng"]]
    restore_rng(rngs[t.rank] if t.rank < len(rngs) else state["rng"], t.device)
    t.start_epoch = int(state["epoch"])
    t.history = list(state["history"])


def sync_norm(net: torch.nn.Module, cfg: TrialConfig, world: int) -> torch.nn.Module:
    """``scaling.sync_batchnorm`` with several workers: every BatchNorm layer becomes a
    ``torch.nn.SyncBatchNorm`` (statistics over the global batch B, not each rank's B/W; CUDA
    only, checked with the config); else ``net`` as it is.

    >>> cfg = config_from_dict({"scaling": {"use_gpu": True, "sync_batchnorm": True}})
    >>> type(sync_norm(torch.nn.Sequential(torch.nn.BatchNorm1d(3)), cfg, world=2)[0]).__name__
    'SyncBatchNorm'
    """
    if not (cfg.scaling.sync_batchnorm and world > 1):
        return net
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)


def decided_on_rank0(world: int, value: Any) -> Any:
    """Rank 0's ``value`` on every rank (one ``broadcast_object_list`` when ``world > 1``; call on
    all ranks): whatever steers a collective is decided once, so every rank reaches it.

    >>> decided_on_rank0(1, True)
    True
    """
    if world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather_rngs(world: int, device: torch.device) -> list[dict[str, Any]]:
    """Every rank's RNG state (a collective: all ranks call it at the same epochs)."""
    mine = capture_rng(device)
    if world == 1:
        return [mine]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, mine)
    return out


def whole_epoch(metrics: dict[str, Any], loop_time: float, ckpt: float, after: float) -> None:
    """The whole epoch's time and throughput, in place: ``epoch_time`` = the loop's (training
    pass, evaluation, epoch metrics) + ``after`` (this epoch's shift metrics, the checkpoint
    decision and ``checkpoint_time`` = ``ckpt``), ``epoch_samples_per_s`` = the training
    samples (``samples_per_s · train_time``) / ``epoch_time``; every rank's checkpoint wait
    counts.

    >>> m = {"train_time": 2.0, "samples_per_s": 500.0, "epoch_time": 3.0}
    >>> whole_epoch(m, 3.0, 0.5, 1.0); m["epoch_time"], m["epoch_samples_per_s"]
    (4.0, 250.0)
    """
    samples = float(metrics.get("samples_per_s", 0.0)) * float(metrics.get("train_time", 0.0))
    metrics["checkpoint_time"] = ckpt
    metrics["epoch_time"] = loop_time + after
    metrics["epoch_samples_per_s"] = samples / metrics["epoch_time"] if samples else 0.0


class EpochReporter:
    """``on_epoch_end`` of the training loop: checkpoint, log, report — in that order."""

    def __init__(self, t: _Trial) -> None:
        self.t = t

    def __call__(self, epoch: int, metrics: dict[str, Any], cache: Any) -> None:
        t = self.t
        entered, loop_time = time.perf_counter(), float(metrics.get("epoch_time", 0.0))
        if t.cfg.eval.epoch_shift and t.rank == 0:
            metrics.update(_epoch_shift(t, cache))
        t.history.append(metrics)
        failpoint("epoch_end", epoch)
        # val_shift/ keys exist on rank 0 only, and float metrics may differ in the last bits
        due = decided_on_rank0(t.world, self._due(epoch) if t.rank == 0 else None)
        whole_epoch(metrics, loop_time, 0.0, time.perf_counter() - entered)  # keys checkpointed
        started = time.perf_counter()
        tmp = self._checkpoint(epoch) if due else None
        now = time.perf_counter()
        whole_epoch(metrics, loop_time, now - started, now - entered)
        try:
            failpoint("after_checkpoint", epoch)
            if t.rank == 0:
                for cb in t.callbacks:
                    cb.on_epoch(epoch, metrics)
            if t.via_tune:
                from ray import tune

                tune.report(scalars(metrics))
            else:
                import ray.train
                from ray.train import Checkpoint

                ckpt = None if tmp is None else Checkpoint.from_directory(tmp)
                ray.train.report(metrics, checkpoint=ckpt)
        finally:  # Ray copied it to the run's storage within `report`
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def _due(self, epoch: int) -> bool:
        """Whether this epoch checkpoints: every ``train.checkpoint_every`` epochs, the last,
        and, with ``eval.select_epoch: best``, every new best epoch."""
        t = self.t
        ev = t.cfg.eval
        best = ev.select_epoch == "best" and is_new_best(t.history, ev.select_metric)
        return not (epoch % t.cfg.train.checkpoint_every) or epoch == t.cfg.train.epochs or best

    def _checkpoint(self, epoch: int) -> str | None:
        """Write this epoch's checkpoint (a collective: every rank calls it at the same epochs);
        with workers return the temporary folder it is in, for Ray to persist (the caller
        removes it after the report)."""
        t = self.t
        rngs = _gather_rngs(t.world, t.device)
        if t.rank != 0:
            return None
        state = {
            "model": t.net,
            "optimizer": t.optimizer,
            "loss_fn": t.loss_fn,
            "scaler": t.precision.state_dict(),
        }
        if t.local:
            root = t.trial_dir / "checkpoints"
            save_state(epoch_dir(root, epoch), epoch=epoch, history=t.history, rngs=rngs, **state)
            prune_local_checkpoints(root, t.cfg.train.keep_checkpoints, _kept(t, root))
            return None
        tmp = tempfile.mkdtemp(prefix="calibtune-ckpt-")
        save_state(tmp, epoch=epoch, history=t.history, rngs=rngs, **state)
        return tmp


def _kept(t: _Trial, root: Path) -> set[int] | None:
    """With ``eval.select_epoch: best``, the local checkpoints to keep (Ray's rule: the best-
    scoring and the latest); else None (the latest ``keep_checkpoints``)."""
    ev = t.cfg.eval
    if ev.select_epoch != "best":
        return None
    epochs = [int(p.name.split("_")[1]) for p in root.glob("epoch_*")]
    scores = {int(h["epoch"]): score(h, ev.select_metric) for h in t.history}
    return keep_local(epochs, t.cfg.train.keep_checkpoints, scores)


def _best_state(t: _Trial, epoch: int) -> dict[str, Any]:
    """The checkpoint of ``epoch`` (kept by the rule in `calibtune.trial._select`): Ray's
    reported checkpoints in worker mode, the trial folder's in local mode."""
    if t.local:
        return load_state(epoch_dir(t.trial_dir / "checkpoints", epoch))
    import ray.train

    for reported in ray.train.get_all_reported_checkpoints():
        if int(reported.metrics.get("epoch", -1)) == epoch:
            with reported.checkpoint.as_directory() as d:
                return load_state(d)
    raise RuntimeError(f"eval.select_epoch: no checkpoint of the best epoch {epoch} was kept")


def _select(t: _Trial, cache: Any) -> tuple[Any, dict[str, float]]:
    """The model the final evaluation uses: the last epoch's (its cached logits), or the best
    epoch's, loaded into ``t.net`` (its logits are inferred again)."""
    ev = t.cfg.eval
    if ev.select_epoch != "best":
        return cache, {}
    epoch = best_epoch(t.history, ev.select_metric) or len(t.history)
    if epoch != len(t.history) or cache is None:
        t.net.load_state_dict(_best_state(t, epoch)["model"])
        cache = None
    return cache, {K.SELECTED_EPOCH: float(epoch)}


def _epoch_shift(t: _Trial, cache: Any) -> dict[str, float]:
    """``val_shift/…`` of this epoch (`calibtune.training.epoch_val_shift`)."""
    ev = t.cfg.eval
    return epoch_val_shift(
        shift_sets(t.cfg),
        t.splits,
        lambda ds: _infer(t, ds),
        cache.val_logits,
        cache.val_labels,
        {n: ev.posthoc.get(n, {}) for n in ev.epoch_posthoc},
        ev.n_bins,
    )


def _loop_spec(t: _Trial) -> Any:
    cfg = t.cfg
    lr_at = lr_schedule(
        cfg.optimizer.lr,
        cfg.schedule.name,
        cfg.train.epochs,
        cfg.milestones(),
        cfg.schedule.gamma,
        cfg.schedule.warmup_epochs,
    )
    return LoopSpec(
        model=t.model,
        loss_fn=t.loss_fn,
        optimizer=t.optimizer,
        lr_at=lr_at,
        train_set=t.splits.train,
        val_set=t.splits.val,
        test_set=t.splits.test,
        epochs=cfg.train.epochs,
        batch_size=cfg.train.batch_size,
        eval_batch_size=cfg.eval.batch_size,
        n_bins=cfg.eval.n_bins,
        seed=cfg.seed,
        grad_clip=cfg.train.grad_clip,
        device=t.device,
        augment=t.splits.augment,
        test_every_epoch=cfg.eval.test_every_epoch,
        loader_workers=cfg.train.loader_workers,
        rank=t.rank,
        world=t.world,
        eval_model=t.net,
        epoch_posthoc={n: dict(cfg.eval.posthoc.get(n, {})) for n in cfg.eval.epoch_posthoc},
        epoch_selective=cfg.eval.epoch_selective,
        precision=t.precision,
        progress=t.progress,
    )


def _infer(t: _Trial, ds: Any) -> Any:
    """One inference pass of the plain model over ``ds`` on the trial's device (float32 CPU
    logits), at the trial's precision and memory format."""
    return infer_logits(
        t.net,
        DeviceBatches(ds, t.device, channels_last=t.precision.channels_last),
        batch_size=t.cfg.eval.batch_size,
        device=t.device,
        autocast=t.precision.autocast,
    )


def _finalize(t: _Trial, cache: Any, ranks: Any) -> dict[str, Any]:
    """Rank 0: post-hoc fits and test/OOD scores on cached logits, artifacts, callbacks."""
    cfg = t.cfg

    def infer(ds: Any) -> Any:
        return _infer(t, ds)

    cache, selected = _select(t, cache)

    if cache is None or cache.test_logits is None:  # resumed after the last epoch
        (val, val_y), (test, test_y) = infer(t.splits.val), infer(t.splits.test)
    else:
        val, val_y, test, test_y = (
            cache.val_logits,
            cache.val_labels,
            cache.test_logits,
            cache.test_labels,
        )
    failpoint("final_eval")
    ood = _ood_logits(cfg, infer)
    shift = shift_logits(shift_sets(cfg), t.splits, infer, root=cfg.data.root, reuse=ood)
    final = evaluate_final(
        val,
        val_y,
        test,
        test_y,
        posthoc=cfg.eval.posthoc,
        ood=ood,
        shift=shift,
        n_bins=cfg.eval.n_bins,
        bootstrap=cfg.eval.bootstrap,
    )
    final.metrics.update(selected)
    deferred = any(getattr(cb, "defers_figures", False) for cb in t.callbacks)
    art = write_artifacts(  # the local folder of the files (a cache copy of a bucket's)
        t.trial_dir / "artifacts",
        cfg=cfg,
        final=final,
        history=t.history,
        gamma_history=list(getattr(t.loss_fn, "history", []) or []),
        logits={"val_logits": val, "val_labels": val_y, "test_logits": test, "test_labels": test_y},
        figures=not deferred,
    )
    for cb in t.callbacks:
        cb.on_trial_end(final.metrics, art)
    if not deferred:  # a bucket's files are uploaded and logged: no local copy left behind
        drop_stage(t.trial_dir / "artifacts")
    return {
        "metrics": final.metrics,
        "history": t.history,
        "artifacts_dir": str(art),
        "epochs_completed": len(t.history),
        "resumed_from_epoch": t.start_epoch,
        "workers": ranks,
    }


def _ood_logits(cfg: TrialConfig, infer: Callable[[Any], Any]) -> list[Any]:
    """Logits of every configured OOD set and severity (one inference pass each)."""
    names = cfg.data.ood if cfg.data.ood is not None else tuple(D.default_ood(cfg.data.name))
    out = []
    for name in names:
        for sev in D.ood_severities(name) or (None,):
            ood = D.load_ood(name, root=cfg.data.root, in_distribution=cfg.data.name, severity=sev)
            out.append(OODLogits(K.ood_source(name, sev), infer(ood.dataset)[0]))
    return out
