"""The trial config: a frozen, validated description of one training run.

Built from YAML (or a dict) at the boundary; unknown keys are rejected and every error names the
key path and the broken rule, e.g. ``train.epochs: expected an integer >= 1, got 'ten'``.
Defaults live here and only here (the seeds' SGD recipe: momentum 0.9, weight decay 5e-4, step
decays by 10× after 3/7 and 5/7 of training — epochs 150 and 250 of 350 in Mukhoti et al. 2020
and Ghosh et al. 2022). The format is documented in ``docs/trial.md``.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from calibtune import data as _d
from calibtune import models as _m
from calibtune import posthoc as _p
from calibtune._names import check_name
from calibtune._validate import (
    ValidationError,
    check_bool,
    check_choice,
    check_choices,
    check_float,
    check_int,
    check_keys,
    check_mapping,
    check_str,
    fail,
)
from calibtune._yaml import cut, excerpt, load_file, load_text
from calibtune.losses import LOSSES, compile_mode
from calibtune.metrics import keys as K
from calibtune.trial._metrics import epoch_shift_sets, metric_keys
from calibtune.trial._placement import worker_bundle

__all__ = [
    "LOSS_REDUCTIONS",
    "DataConfig",
    "EvalConfig",
    "LossConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ScalingConfig",
    "ScheduleConfig",
    "TrainConfig",
    "TrialConfig",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "save_config",
]

DEFAULT_POSTHOC: tuple[str, ...] = ("ts", "ts_nll", "focal_ts", "ets", "spline")
OPTIMIZERS = ("sgd", "adam", "adamw", "adagrad")
#: ``loss.reduction`` choices ("none" would hand the loop a vector)
LOSS_REDUCTIONS = ("mean", "sum")
#: no value above these can be meant (a typo such as ``epochs: 1e30`` would train forever)
MAX_EPOCHS = 100_000
MAX_BATCH = 1 << 24
SCHEDULES = ("step", "cosine", "constant")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # `calibtune.training.Precision`
SELECT_EPOCHS = ("last", "best")
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")  # Ray placement groups


@dataclass(frozen=True)
class DataConfig:
    """``name`` from ``calibtune.data.list_datasets()``; ``root`` where its files live.

    ``split_seed`` draws the train/validation split, separately from the trial ``seed`` (model
    initialisation, batch order, augmentation): the seed papers fix the split (seed 1) and vary
    the initialisation, so a seed spread measures initialisation variance alone.
    """

    name: str = "digits"
    root: str | None = None
    val_fraction: float = 0.1
    split_seed: int = 1
    ood: tuple[str, ...] | None = None  # None: calibtune.data.default_ood(name); (): none
    shift: tuple[str, ...] | None = None  # None: calibtune.data.default_shift(name); (): none


@dataclass(frozen=True)
class ModelConfig:
    """``init``: ``auto`` (the network's authors' scheme, `calibtune.models.model_init`) or one of
    `calibtune.models.INIT_SCHEMES`; ``params``: the network's own parameters as given (e.g.
    ``{hidden: 512}`` for ``mlp``: `calibtune.models.list_models` documents them), validated
    against the registry; the rest keep their defaults. ``num_classes`` and ``input_shape``
    come from the data."""

    name: str = "mlp"
    init: str = "auto"
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LossConfig:
    """``params`` are resolved (defaults filled) through ``LOSSES.get(name).resolve``.

    ``reduction`` (`LOSS_REDUCTIONS`) combines a batch's per-sample losses: ``mean`` (default)
    or ``sum``, as the seed papers' code does for most arms — one SGD step on the sum is B times
    the step on the mean (before ``train.grad_clip``), so an arm trains as its authors' code
    only with their reduction and clip norm (docs/trial.md, docs/papers.md).
    ``compile`` (`calibtune.losses.compile_mode`) runs the loss's per-step computation through
    ``torch.compile``: ``auto`` (default) on CUDA only, ``on`` everywhere, ``off`` never; a
    failed compile falls back to the eager path with one warning (`calibtune.losses.compile_loss`).
    """

    name: str = "cross_entropy"
    params: Mapping[str, Any] = field(default_factory=dict)
    reduction: str = "mean"
    compile: str = "auto"

    def build(self) -> Any:
        """The loss module (`calibtune.losses.CalibrationLoss`) from the resolved ``params``,
        which are not checked a second time, reducing a batch by ``reduction``.

        >>> LossConfig("focal", {"gamma": 2.0}).build()
        FocalLoss(gamma=2.0, reduction='mean')
        >>> LossConfig("focal", {"gamma": 3.0}, reduction="sum").build()
        FocalLoss(gamma=3.0, reduction='sum')
        """
        return LOSSES.get(self.name).factory.from_params(self.reduction, **self.params)


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "sgd"
    lr: float = 0.1  # per batch of `train.batch_size` examples
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False


@dataclass(frozen=True)
class ScheduleConfig:
    """``step``: lr × gamma after each milestone epoch (None: round(3E/7), round(5E/7))."""

    name: str = "step"
    milestones: tuple[int, ...] | None = None
    gamma: float = 0.1
    warmup_epochs: int = 0


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 10
    batch_size: int = 128
    grad_clip: float | None = None  # max global L2 norm of the gradients; None: off
    checkpoint_every: int = 1  # epochs
    keep_checkpoints: int = 2
    loader_workers: int = 0  # DataLoader processes for file-based sets (in-memory sets: unused)
    precision: str = "fp32"  # fp32 | tf32 | bf16 | fp16 (fp32: TF32 off; autocast for bf16/fp16)
    channels_last: bool = False  # NHWC model and batches (tensor-core convolutions)
    # deterministic algorithms, cuBLAS workspace, no cuDNN autotuning, no TF32 (a bit-reproducible
    # GPU run; `calibtune.trial._worker.determinism`)
    deterministic: bool = False


@dataclass(frozen=True)
class EvalConfig:
    batch_size: int = 1024
    n_bins: int = 15
    test_every_epoch: bool = True
    figures: bool = True  # render figures/ from the artifacts at the end (matplotlib)
    # bootstrap resamples of the test set for test/<m>[@method]_ci_{low,high} (0 = off)
    bootstrap: int = 200
    # MLflow gets every bin of adaptive/{gammas,edges,gap} (default: the adaptive_summary series)
    log_adaptive_bins: bool = False
    # post-hoc methods also fitted on validation every epoch, reporting val/<m>@<name>
    # (studies that select on e.g. val/ece@ts need it in every report)
    epoch_posthoc: tuple[str, ...] = ()
    # the val_shift/ keys of data.shift every epoch, uncalibrated and after epoch_posthoc
    # (studies that select on e.g. val_shift/digits_noise/ece@ts need them in every report)
    epoch_shift: bool = False
    # val/{aurc,augrc,refinement_nll}[@epoch_posthoc] every epoch (default: at the end only;
    # studies that select on one need it in every report)
    epoch_selective: bool = False
    posthoc: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: {name: {} for name in DEFAULT_POSTHOC}
    )
    # which epoch's model the final (post-hoc, OOD, shift) evaluation uses: the last, or the best
    # by select_metric (a validation key every epoch reports; "refine, then calibrate")
    select_epoch: str = "last"
    select_metric: str = "val/nll"


@dataclass(frozen=True)
class ScalingConfig:
    """``num_workers=0``: Ray Train local mode (in-process); ``>= 1``: Ray Train workers (DDP)."""

    num_workers: int = 0
    use_gpu: bool = False
    resources_per_worker: Mapping[str, float] = field(default_factory=dict)
    max_failures: int = 0
    placement_strategy: str = "PACK"  # of the workers' bundles; SPREAD: one node each if possible
    # BatchNorm statistics over the global batch instead of each worker's share (CUDA only)
    sync_batchnorm: bool = False


@dataclass(frozen=True)
class TrialConfig:
    name: str = "trial"
    seed: int = 1
    storage_path: str = "runs/trials"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)

    def milestones(self) -> tuple[int, ...]:
        """Epochs at which the step schedule multiplies the learning rate by ``schedule.gamma``."""
        if self.schedule.milestones is not None:
            return self.schedule.milestones
        e = self.train.epochs
        return tuple(sorted({max(1, round(3 * e / 7)), max(1, round(5 * e / 7))}))

    def replace(self, **changes: Any) -> TrialConfig:
        return dataclasses.replace(self, **changes)

    def metric_keys(self, *, posthoc_params: bool = True) -> frozenset[str]:
        """Every metric key a trial with this config reports (`calibtune.metrics.keys`)."""
        return metric_keys(self, posthoc_params=posthoc_params)


# --------------------------------------------------------------------------- parsing


def _data(d: Mapping[str, Any]) -> DataConfig:
    check_keys(d, DataConfig, "data")
    name = check_str(d.get("name", "digits"), "data.name")
    if name not in _d.list_datasets():
        raise fail("data.name", "one of " + ", ".join(_d.list_datasets()), name)
    root = d.get("root")
    if root is not None:
        root = check_str(root, "data.root")
    ood = d.get("ood")
    if ood is not None:
        if isinstance(ood, str) or not isinstance(ood, Sequence):
            raise fail("data.ood", "a list of OOD set names (or null for the defaults)", ood)
        known = _d.list_ood()
        for i, o in enumerate(ood):
            if o not in known:
                raise fail(f"data.ood[{i}]", "one of " + ", ".join(known), o)
        ood = tuple(ood)
        if ood and {"text", "trees"} & set(_d.DATASETS.get(name).tags):
            # every OOD set is images or signals: a text network cannot read them
            why = f"[] ({name} is text; the OOD sets are images or signals)"
            raise fail("data.ood", why, list(ood))
    shift = d.get("shift")
    if shift is not None:  # a set corrupts one dataset's splits: only its sets are choices
        shift = check_choices(shift, "data.shift", _d.shift_sets_for(name), f"{name} shift sets")
    vf = check_float(d.get("val_fraction", 0.1), "data.val_fraction", 0.0, low_open=True, high=0.5)
    split_seed = check_int(d.get("split_seed", DataConfig.split_seed), "data.split_seed", 0)
    return DataConfig(
        name=name, root=root, val_fraction=vf, split_seed=split_seed, ood=ood, shift=shift
    )


_MODEL_FROM_DATA = {"num_classes", "input_shape", "embeddings"}


def _model(d: Mapping[str, Any]) -> ModelConfig:
    check_keys(d, ModelConfig, "model")
    name = check_str(d.get("name", "mlp"), "model.name")
    if name not in _m.list_models():
        raise fail("model.name", "one of " + ", ".join(_m.list_models()), name)
    init = check_choice(d.get("init", "auto"), "model.init", ("auto", *_m.INIT_SCHEMES))
    params = dict(check_mapping(d.get("params"), "model.params"))
    for key in _MODEL_FROM_DATA & set(params):
        raise fail(f"model.params.{key}", "no value (it comes from the dataset)", params[key])
    try:
        resolved = _m.MODELS.get(name).resolve(**params)
    except ValueError as e:
        raise ValidationError(f"model.params: {cut(str(e), 200)}") from None
    return ModelConfig(name=name, init=init, params={k: resolved[k] for k in params})


def _loss(d: Mapping[str, Any]) -> LossConfig:
    check_keys(d, LossConfig, "loss")
    name = check_str(d.get("name", "cross_entropy"), "loss.name")
    if name not in LOSSES:
        raise fail("loss.name", "one of " + ", ".join(LOSSES.names()), name)
    params = dict(check_mapping(d.get("params"), "loss.params"))
    try:
        resolved = LOSSES.get(name).resolve(**params)
    except ValueError as e:
        raise ValidationError(f"loss.params: {cut(str(e), 200)}") from None
    reduction = check_choice(d.get("reduction", "mean"), "loss.reduction", LOSS_REDUCTIONS)
    mode = compile_mode(d.get("compile", "auto"), "loss.compile")
    return LossConfig(name=name, params=resolved, reduction=reduction, compile=mode)


def _optimizer(d: Mapping[str, Any]) -> OptimizerConfig:
    check_keys(d, OptimizerConfig, "optimizer")
    o = OptimizerConfig()
    return OptimizerConfig(
        name=check_choice(d.get("name", o.name), "optimizer.name", OPTIMIZERS),
        lr=check_float(d.get("lr", o.lr), "optimizer.lr", 0.0, low_open=True),
        momentum=check_float(d.get("momentum", o.momentum), "optimizer.momentum", 0.0, high=1.0),
        weight_decay=check_float(
            d.get("weight_decay", o.weight_decay), "optimizer.weight_decay", 0.0
        ),
        nesterov=check_bool(d.get("nesterov", o.nesterov), "optimizer.nesterov"),
    )


def _schedule(d: Mapping[str, Any], epochs: int) -> ScheduleConfig:
    check_keys(d, ScheduleConfig, "schedule")
    s = ScheduleConfig()
    ms = d.get("milestones")
    if ms is not None:
        if isinstance(ms, str) or not isinstance(ms, Sequence):
            raise fail("schedule.milestones", "a list of epoch numbers (or null)", ms)
        ms = tuple(check_int(m, f"schedule.milestones[{i}]", 1) for i, m in enumerate(ms))
        if list(ms) != sorted(set(ms)):
            raise fail("schedule.milestones", "strictly increasing epoch numbers", list(ms))
    warm = check_int(d.get("warmup_epochs", 0), "schedule.warmup_epochs", 0)
    if warm >= epochs and warm > 0:
        raise fail("schedule.warmup_epochs", f"an integer < train.epochs ({epochs})", warm)
    return ScheduleConfig(
        name=check_choice(d.get("name", s.name), "schedule.name", SCHEDULES),
        milestones=ms,
        gamma=check_float(d.get("gamma", s.gamma), "schedule.gamma", 0.0, low_open=True, high=1.0),
        warmup_epochs=warm,
    )


def _train(d: Mapping[str, Any]) -> TrainConfig:
    check_keys(d, TrainConfig, "train")
    t = TrainConfig()
    clip = d.get("grad_clip")
    return TrainConfig(
        epochs=check_int(d.get("epochs", t.epochs), "train.epochs", 1, MAX_EPOCHS),
        batch_size=check_int(d.get("batch_size", t.batch_size), "train.batch_size", 1, MAX_BATCH),
        grad_clip=None
        if clip is None
        else check_float(clip, "train.grad_clip", 0.0, low_open=True),
        checkpoint_every=check_int(
            d.get("checkpoint_every", t.checkpoint_every), "train.checkpoint_every", 1
        ),
        keep_checkpoints=check_int(
            d.get("keep_checkpoints", t.keep_checkpoints), "train.keep_checkpoints", 1
        ),
        loader_workers=check_int(d.get("loader_workers", 0), "train.loader_workers", 0),
        precision=check_choice(d.get("precision", t.precision), "train.precision", PRECISIONS),
        channels_last=check_bool(d.get("channels_last", False), "train.channels_last"),
        deterministic=check_bool(d.get("deterministic", False), "train.deterministic"),
    )


def _eval(d: Mapping[str, Any]) -> EvalConfig:
    check_keys(d, EvalConfig, "eval")
    e = EvalConfig()
    raw = d.get("posthoc", list(DEFAULT_POSTHOC))
    if raw is None:
        raw = []
    if isinstance(raw, Mapping):
        items = [(k, check_mapping(v, f"eval.posthoc.{k}")) for k, v in raw.items()]
    elif isinstance(raw, Sequence) and not isinstance(raw, str):
        items = [(k, {}) for k in raw]
    else:
        raise fail("eval.posthoc", "a list of post-hoc names or a mapping name -> params", raw)
    posthoc: dict[str, dict[str, Any]] = {}
    for name, params in items:
        if name not in _p.list_posthoc():
            raise fail("eval.posthoc", "names from " + ", ".join(_p.list_posthoc()), name)
        try:
            _p.build_posthoc(name, **params)
        except (TypeError, ValueError) as err:
            raise ValidationError(f"eval.posthoc.{name}: {cut(str(err), 200)}") from None
        posthoc[name] = dict(params)
    return EvalConfig(
        batch_size=check_int(d.get("batch_size", e.batch_size), "eval.batch_size", 1, MAX_BATCH),
        n_bins=check_int(d.get("n_bins", e.n_bins), "eval.n_bins", 1),
        test_every_epoch=check_bool(
            d.get("test_every_epoch", e.test_every_epoch), "eval.test_every_epoch"
        ),
        figures=check_bool(d.get("figures", True), "eval.figures"),
        bootstrap=check_int(d.get("bootstrap", e.bootstrap), "eval.bootstrap", 0, 100_000),
        log_adaptive_bins=check_bool(d.get("log_adaptive_bins", False), "eval.log_adaptive_bins"),
        posthoc=posthoc,
        epoch_posthoc=_epoch_posthoc(d.get("epoch_posthoc")),
        epoch_shift=check_bool(d.get("epoch_shift", False), "eval.epoch_shift"),
        epoch_selective=check_bool(d.get("epoch_selective", False), "eval.epoch_selective"),
        select_epoch=check_choice(
            d.get("select_epoch", e.select_epoch), "eval.select_epoch", SELECT_EPOCHS
        ),
        select_metric=check_str(d.get("select_metric", e.select_metric), "eval.select_metric"),
    )


def _epoch_posthoc(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        raise fail("eval.epoch_posthoc", "a list of post-hoc method names", raw)
    for i, name in enumerate(raw):
        if name not in _p.list_posthoc():
            raise fail(f"eval.epoch_posthoc[{i}]", "one of " + ", ".join(_p.list_posthoc()), name)
    return tuple(raw)


def _scaling(d: Mapping[str, Any]) -> ScalingConfig:
    check_keys(d, ScalingConfig, "scaling")
    rpw = check_mapping(d.get("resources_per_worker"), "scaling.resources_per_worker")
    res = {
        check_str(k, "scaling.resources_per_worker"): check_float(
            v, f"scaling.resources_per_worker.{k}", 0.0
        )
        for k, v in rpw.items()
    }
    workers = check_int(d.get("num_workers", 0), "scaling.num_workers", 0)
    gpu = res.get("GPU", 0.0)
    if workers > 1 and 0.0 < gpu < 1.0:
        raise fail(
            "scaling.resources_per_worker.GPU",
            f"a whole GPU per worker with num_workers={workers} (NCCL refuses two ranks on one "
            "GPU; pack fractional GPUs with num_workers: 0 or 1)",
            gpu,
        )
    use_gpu = check_bool(d.get("use_gpu", False), "scaling.use_gpu")
    sync_bn = check_bool(d.get("sync_batchnorm", False), "scaling.sync_batchnorm")
    if sync_bn and not use_gpu:
        raise fail(
            "scaling.sync_batchnorm",
            "false without scaling.use_gpu (torch's SyncBatchNorm runs on CUDA only)",
            sync_bn,
        )
    return ScalingConfig(
        num_workers=workers,
        use_gpu=use_gpu,
        resources_per_worker=res,
        max_failures=check_int(d.get("max_failures", 0), "scaling.max_failures", 0),
        placement_strategy=check_choice(
            d.get("placement_strategy", "PACK"), "scaling.placement_strategy", PLACEMENT_STRATEGIES
        ),
        sync_batchnorm=sync_bn,
    )


def config_from_dict(d: Mapping[str, Any]) -> TrialConfig:
    """Validate a nested mapping (as read from YAML) into a `TrialConfig`.

    Raises ``ValueError("<key.path>: expected <rule>, got <value>")`` on the first problem.
    """
    d = check_mapping(d, "")
    check_keys(d, TrialConfig, "")

    def sub(key: str) -> Mapping[str, Any]:
        return check_mapping(d.get(key), key)

    train = _train(sub("train"))
    cfg = TrialConfig(
        name=check_name(d.get("name", "trial"), "name"),
        seed=check_int(d.get("seed", 1), "seed", 0),
        storage_path=check_str(d.get("storage_path", "runs/trials"), "storage_path"),
        data=_data(sub("data")),
        model=_model(sub("model")),
        loss=_loss(sub("loss")),
        optimizer=_optimizer(sub("optimizer")),
        schedule=_schedule(sub("schedule"), train.epochs),
        train=train,
        eval=_eval(sub("eval")),
        scaling=_scaling(sub("scaling")),
    )
    _check_select_metric(cfg)
    _check_tree_inputs(cfg)
    _check_loader_cpus(cfg)
    return cfg


def _check_loader_cpus(cfg: TrialConfig) -> None:
    """A streamed data set (`calibtune.data.dataset_streams`: ImageNet) is decoded by
    ``train.loader_workers`` processes beside the trial's own, all inside the trial's Ray bundle
    (`worker_bundle`): refused when ``loader_workers + 1`` exceeds its CPUs, so Ray never packs
    more decoding processes on a node than it has counted (in-memory sets: not checked)."""
    if not _d.dataset_streams(cfg.data.name):
        return
    cpus = worker_bundle(cfg.scaling).get("CPU", 1.0)
    n = cfg.train.loader_workers
    if n + 1 > cpus:
        raise fail(
            "train.loader_workers",
            f"at most {max(int(cpus) - 1, 0)} ({cfg.data.name} decodes in the loader workers "
            f"beside the trial's own process, all counted in its Ray bundle of CPU {cpus:g}; "
            f"set scaling.resources_per_worker.CPU to {n + 1} or lower train.loader_workers)",
            n,
        )


def _check_tree_inputs(cfg: TrialConfig) -> None:
    """Encoded parse trees (a dataset tagged ``trees``: SST) are read by tree networks only
    (tagged ``trees``: ``treelstm``) and those read nothing else; a trees set takes no
    mixup-family loss (it mixes inputs: trees do not mix). OOD sets: refused in `_data`."""
    trees = "trees" in _d.DATASETS.get(cfg.data.name).tags
    tree_nets = [m.name for m in _m.MODELS if "trees" in m.tags]
    if trees != (cfg.model.name in tree_nets):
        want = (
            f"one of {', '.join(tree_nets)} (data.name {cfg.data.name} is encoded parse trees)"
            if trees
            else f"a network for data.name {cfg.data.name}, not one for parse trees"
        )
        raise fail("model.name", want, cfg.model.name)
    if trees and hasattr(cfg.loss.build(), "batch_transform"):
        raise fail(
            "loss.name",
            f"a loss that does not mix inputs ({cfg.data.name} inputs are parse trees)",
            cfg.loss.name,
        )


def _check_select_metric(cfg: TrialConfig) -> None:
    """``eval.select_metric`` is checked like a study objective: a validation key with a
    direction that every epoch reports (``@method`` needs the method in ``eval.epoch_posthoc``,
    AURC-like keys ``eval.epoch_selective``)."""
    m = cfg.eval.select_metric
    if (why := K.selection_refusal(m)) is not None:
        raise fail("eval.select_metric", why.removeprefix("expected "), m)
    try:
        K.direction(m)
    except ValueError:
        raise fail("eval.select_metric", "a metric with a direction (e.g. val/nll)", m) from None
    every_epoch = K.epoch_keys(
        epoch_posthoc=cfg.eval.epoch_posthoc,
        selective=cfg.eval.epoch_selective,
        epoch_shift=epoch_shift_sets(cfg),
    )
    if m not in every_epoch:
        raise fail(
            "eval.select_metric",
            "a key every epoch reports (e.g. val/nll, val/ece; val/<m>@<method> needs the method "
            "in eval.epoch_posthoc)",
            m,
        )


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, tuple | list):
        return [_plain(x) for x in v]
    return v


def config_to_dict(cfg: TrialConfig) -> dict[str, Any]:
    """Plain nested dict (lists, not tuples) that `config_from_dict` maps back to ``cfg``."""
    return _plain(dataclasses.asdict(cfg))


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> TrialConfig:
    """Read a trial YAML file (through `calibtune._yaml.load_file`: size, encoding, alias and
    duplicate-key checks), apply ``key.path=value`` overrides, validate."""
    if not Path(path).exists():  # the CLI answers "PATH: no such file"
        raise FileNotFoundError(path)
    raw = load_file(path, "trial config file")
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return config_from_dict(apply_overrides(raw, overrides))
    except ValueError as exc:
        if overrides:  # name the file only when the problem is the file's, not an override's
            try:
                config_from_dict(raw)
            except ValueError as own:
                if str(own) == str(exc):
                    raise ValidationError(f"{path}: {exc}") from None
            raise
        raise ValidationError(f"{path}: {exc}") from None


def save_config(cfg: TrialConfig, path: str | os.PathLike[str]) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``a.b.c=value`` set (value parsed as YAML)."""
    out = copy.deepcopy(dict(raw))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key or any(not p for p in key.split(".")):
            raise ValueError(f"--set: expected key.path=value, got {excerpt(item)}")
        node = out
        parts = key.split(".")
        for i, p in enumerate(parts[:-1]):
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ValueError(
                    f"--set {cut(key)}: {cut('.'.join(parts[: i + 1]))} is not a mapping"
                )
            node = nxt
        node[parts[-1]] = load_text(value, f"--set {cut(key)}") if value else None
    return out
