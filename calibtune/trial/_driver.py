"""Run one trial through Ray Train (`TorchTrainer`), locally or on workers, resumably.

``scaling.num_workers == 0`` uses Ray Train's local mode (the same training function and
``ray.train.report``/``get_context`` API, run in this process: ~no start-up cost); ``>= 1`` starts
that many Train workers (DDP: gloo on CPU, nccl on GPU). Ray Train V2 is the default in Ray 2.60,
so inside a Tune trial the driver is a function trainable calling `run`, which adds
``ray.tune.integration.ray_train.TuneReportCallback`` to forward rank 0's reports (local mode
reports to Tune directly, since its reports never leave the process).

This module is the driver side (validation, resume checks, the trainer, the result); the training
function itself is `calibtune.trial._worker`, the artifact files `calibtune.trial._artifacts`.

Checkpoints: with workers, rank 0 writes ``state.pt`` to a temp dir and reports it; Ray persists it
under ``<storage_path>/<name>/`` and hands it back through ``ray.train.get_checkpoint()`` after a
worker failure (``scaling.max_failures``) or when the same ``(storage_path, name)`` runs again.
Local mode keeps them in ``<storage_path>/<name>/checkpoints/epoch_NNNNNN`` and resumes from the
latest one the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from calibtune import data as D
from calibtune._io import atomic_write
from calibtune._names import check_name
from calibtune._raysettings import apply_train_env, train_runtime_env
from calibtune.data import DatasetNotFoundError
from calibtune.metrics import keys as K
from calibtune.storage import Storage, StorageError, open_storage
from calibtune.training import NonFiniteLossError, cuda_unavailable_reason
from calibtune.trial._artifacts import jsonable, staged_copy
from calibtune.trial._config import TrialConfig, config_from_dict, config_to_dict
from calibtune.trial._errors import TrialStepError
from calibtune.trial._metrics import shift_sets
from calibtune.trial._placement import check_placement_on_cluster, worker_bundle
from calibtune.trial._worker import train_loop_per_worker

# Lazy: Ray (`ray.train`, Tune's session and report callback) only where a trial is launched,
# so that `import calibtune.trial` (the `train` command, study config checks) does not load Ray.

__all__ = [
    "TrialCallback",
    "TrialFailedError",
    "TrialResult",
    "check_data_files",
    "check_resources",
    "local_machine",
    "run",
    "saved_result",
]


class TrialFailedError(RuntimeError):
    """A trial stopped with an error; the message carries the worker's reason."""


@runtime_checkable
class TrialCallback(Protocol):
    """Hook run on rank 0 inside the training process (e.g. MLflow logging by the study service).

    It must be picklable (it travels to the Train worker). ``on_epoch`` receives each epoch's
    report (flat names: ``train/loss``, ``val/ece``, ``test/ece``, ``lr``, ``epoch_time``; list
    values only under ``adaptive/``); ``on_trial_end`` the final metrics and the artifacts folder.
    """

    def on_epoch(self, epoch: int, metrics: Mapping[str, Any]) -> None: ...

    def on_trial_end(self, metrics: Mapping[str, float], artifacts_dir: Path) -> None: ...


@dataclass
class TrialResult:
    """What a finished trial returns.

    ``metrics``: final metrics (``test/ece``, ``test/ece@ts``, ``posthoc/ts/T``,
    ``ood/<set>[/s<k>]/auroc[_msp][@ts]`` …); ``history``: one report dict per epoch;
    ``artifacts_dir``: config.yaml, metrics.json, history.jsonl, reliability.json,
    gamma_history.json, roc.json, logits.pt and figures/.
    """

    config: TrialConfig
    metrics: dict[str, float]
    history: list[dict[str, Any]]
    trial_dir: Storage
    artifacts_dir: Path
    epochs_completed: int
    resumed_from_epoch: int = 0
    wall_time_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- driver side


def local_machine() -> tuple[dict[str, float], str]:
    """What a local Ray started here would hold, known before starting it, and how to name it
    in an error: every CPU (`os.cpu_count`, as `calibtune.cluster._raycluster.init_ray` sizes
    it) and every GPU this process may use (`torch.cuda.device_count` honours
    ``CUDA_VISIBLE_DEVICES``)."""
    have = {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = "" if visible is None or have["GPU"] else f"; CUDA_VISIBLE_DEVICES={visible!r}"
    return have, f"this machine (a local Ray{hidden})"


def _no_cuda_here() -> str:
    return cuda_unavailable_reason() or "torch sees no CUDA device"


def check_resources(
    cfg: TrialConfig, available: Mapping[str, float], where: str = "the Ray cluster"
) -> None:
    """Fail fast when ``available`` (a Ray cluster's resources, or `local_machine`'s before a
    local Ray starts) cannot hold the trial: Ray would wait forever instead. The trial takes
    `worker_bundle` once per worker, or once in local mode (its own process)."""
    s = cfg.scaling
    n = max(s.num_workers, 1)
    for res, amount in sorted(worker_bundle(s).items()):
        need, have = amount * n, float(available.get(res, 0.0))
        if amount <= 0 or need <= have + 1e-9:
            continue
        if res == "GPU" and have == 0:
            key = "resources_per_worker.GPU" if "GPU" in s.resources_per_worker else "use_gpu"
            why = f" ({_no_cuda_here()})" if where.startswith("this machine") else ""
            raise ValueError(
                f"scaling.{key}: expected a visible GPU on {where}, found none{why}; set "
                "scaling.use_gpu: false, or run where there is one"
            )
        workers = f"{s.num_workers} workers × {amount:g}" if s.num_workers else "local mode"
        gpu = ", or set scaling.use_gpu: false" if res == "GPU" else ""
        raise ValueError(
            f"scaling: expected a trial that fits the {have:g} {res} of {where}, got one that "
            f"needs {need:g} {res} ({workers}); lower scaling.num_workers or "
            f"scaling.resources_per_worker{gpu}"
        )


def _absolute(cfg: TrialConfig, storage_path: str | None) -> tuple[TrialConfig, Storage]:
    # relative paths would resolve inside Ray's per-worker temp dirs; a URI stays one
    key = "storage_path"
    try:
        storage = open_storage(storage_path or cfg.storage_path, key)
    except StorageError as exc:
        raise ValueError(str(exc)) from None
    data = cfg.data
    if data.root is not None:
        data = dataclasses.replace(data, root=str(Path(data.root).expanduser().resolve()))
    return cfg.replace(storage_path=storage.uri, data=data), storage


def run(
    config: TrialConfig | Mapping[str, Any],
    *,
    callbacks: Sequence[TrialCallback] = (),
    storage_path: str | os.PathLike[str] | None = None,
    name: str | None = None,
    train_callbacks: Sequence[Any] = (),
) -> TrialResult:
    """Run one trial through Ray Train and return its `TrialResult`.

    Re-running with the same ``(storage_path, name)`` resumes from the latest checkpoint (a
    finished trial is then only re-evaluated). ``callbacks`` run on rank 0 (see `TrialCallback`);
    ``train_callbacks`` are ``ray.train.UserCallback`` objects for the Train controller (they see
    every rank's report; workers mode only). In local mode, ``scaling.max_failures`` retries the
    training function in-process from the latest checkpoint, like Ray's ``FailureConfig``.
    Raises `TrialFailedError` when training fails (e.g. ``non-finite loss at epoch e, step s``).
    """
    import ray

    cfg = config if isinstance(config, TrialConfig) else config_from_dict(config)
    if name is not None:
        cfg = cfg.replace(name=name)
    cfg, storage = _absolute(cfg, None if storage_path is None else os.fspath(storage_path))
    trial_dir = storage / check_name(cfg.name, "name")  # never outside storage
    local = cfg.scaling.num_workers == 0

    from ray.tune.trainable.trainable_fn_utils import _in_tune_session

    in_tune = _in_tune_session()
    run_callbacks: list[Any] = list(train_callbacks)
    if not local:
        if not ray.is_initialized():
            # a cluster only when asked for (RAY_ADDRESS), never a stale one found on disk
            address = os.environ.get("RAY_ADDRESS") or "local"
            remote = {"runtime_env": train_runtime_env(address)} if address != "local" else {}
            apply_train_env()
            ray.init(address=address, include_dashboard=False, log_to_driver=True, **remote)
        check_resources(cfg, ray.cluster_resources())
        check_placement_on_cluster(cfg.scaling)  # STRICT_* strategies need fitting nodes
        if in_tune:
            from ray.tune.integration.ray_train import TuneReportCallback

            run_callbacks.append(TuneReportCallback())
    elif worker_bundle(cfg.scaling).get("GPU", 0.0) > 0 and not torch.cuda.is_available():
        raise ValueError(
            f"scaling.use_gpu: expected a visible GPU for local mode, got none ({_no_cuda_here()})"
        )
    check_data_files(cfg, splits=True)
    trial_dir.mkdir(parents=True, exist_ok=True)
    check_same_trial(cfg, trial_dir)
    done = finished_result(cfg, trial_dir)
    if done is not None:  # finished before (e.g. its study was interrupted right after)
        return done

    with _quiet_local_mode(local):
        result = _run(cfg, storage, trial_dir, local, in_tune, run_callbacks, callbacks)
    _save_result(result)
    return result


RESULT_FILE = "result.json"


def _save_result(result: TrialResult) -> None:
    """Record a finished trial (atomically): running it again returns this, untouched."""
    payload = {
        "config": config_to_dict(result.config),
        "metrics": result.metrics,
        "history": result.history,
        "artifacts_dir": str(result.artifacts_dir),
        "epochs_completed": result.epochs_completed,
        "resumed_from_epoch": result.resumed_from_epoch,
        "wall_time_s": result.wall_time_s,
    }
    atomic_write(result.trial_dir / RESULT_FILE, json.dumps(jsonable(payload)))


def _artifacts_here(trial_dir: Storage, recorded: str) -> Path:
    """The local folder of a finished trial's artifacts on this machine: the recorded one where
    it exists, else (a bucket's trial, finished on another node or its stage dropped) a fresh
    local copy (`staged_copy`)."""
    if trial_dir.is_local or Path(recorded).is_dir():
        return Path(recorded)
    return staged_copy(trial_dir / "artifacts")


def finished_result(cfg: TrialConfig, trial_dir: Storage) -> TrialResult | None:
    """The saved result of this exact config in ``trial_dir``, if it finished there."""
    path = trial_dir / RESULT_FILE
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except ValueError:  # never written half (atomic), but a hand-edited file is not trusted
        return None
    if saved.get("config") != json.loads(json.dumps(jsonable(config_to_dict(cfg)))):
        return None
    nan = float("nan")
    return TrialResult(
        config=cfg,
        metrics={k: nan if v is None else v for k, v in saved["metrics"].items()},
        history=saved["history"],
        trial_dir=trial_dir,
        artifacts_dir=_artifacts_here(trial_dir, saved["artifacts_dir"]),
        epochs_completed=saved["epochs_completed"],
        resumed_from_epoch=saved["resumed_from_epoch"],
        wall_time_s=saved["wall_time_s"],
    )


def saved_result(
    cfg: TrialConfig, storage_path: str | os.PathLike[str], name: str
) -> TrialResult | None:
    """The saved result of trial ``name`` under ``storage_path`` if it finished with ``cfg``
    (names aside), else None: a study's trial reuses it instead of training the same again."""
    twin, storage = _absolute(cfg.replace(name=name), os.fspath(storage_path))
    return finished_result(twin, storage / check_name(name, "name"))


# Ray Train's local mode logs "Running in local mode" and every report's full metrics at INFO
_LOCAL_MODE_LOGGERS = ("ray.train.v2.api.config", "ray.train.v2._internal.execution.train_fn_utils")


@contextlib.contextmanager
def _quiet_local_mode(local: bool) -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in _LOCAL_MODE_LOGGERS] if local else []
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _run(
    cfg: TrialConfig,
    storage: Storage,
    trial_dir: Storage,
    local: bool,
    in_tune: bool,
    run_callbacks: list[Any],
    callbacks: Sequence[TrialCallback],
) -> TrialResult:
    payload = {
        "config": config_to_dict(cfg),
        "trial_dir": str(trial_dir),
        "callbacks": list(callbacks),
        "tune_report": bool(local and in_tune),
    }
    trainer = _trainer(cfg, storage, payload, run_callbacks)
    t0 = time.perf_counter()
    try:
        result = _fit(trainer, retries=cfg.scaling.max_failures if local else 0)
    except Exception as e:  # Ray wraps worker errors; keep the worker's reason readable
        cause: BaseException | None = e
        while cause is not None:
            if isinstance(cause, DatasetNotFoundError):  # bad input, not a training failure
                raise cause from None
            cause = cause.__cause__ or cause.__context__
        raise TrialFailedError(_reason(e)) from e
    out = result.return_value
    if not isinstance(out, dict):
        raise TrialFailedError(f"trial {cfg.name!r}: training function returned no result")
    return TrialResult(
        config=cfg,
        metrics=out["metrics"],
        history=out["history"],
        trial_dir=trial_dir,
        artifacts_dir=Path(out["artifacts_dir"]),
        epochs_completed=out["epochs_completed"],
        resumed_from_epoch=out["resumed_from_epoch"],
        wall_time_s=time.perf_counter() - t0,
        extra={"workers": out.get("workers", [])},  # where each rank ran (workers.json)
    )


def _trainer(cfg: TrialConfig, storage: Storage, payload: dict, run_callbacks: list[Any]) -> Any:
    """Ray Train's `TorchTrainer` for the trial (gloo on CPU, nccl with GPUs)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    workers = cfg.scaling.num_workers
    scaling = ray.train.ScalingConfig(
        num_workers=workers,
        use_gpu=cfg.scaling.use_gpu,
        # local mode trains in this process, on what Tune (or the caller) gave it
        resources_per_worker=(dict(cfg.scaling.resources_per_worker) or None) if workers else None,
        placement_strategy=cfg.scaling.placement_strategy,
    )
    # Ray's own local file system for a disk (as before); the owner's for a bucket
    path, fs = (str(storage.local_path()), None) if storage.is_local else storage.ray_args()
    run_config = ray.train.RunConfig(
        name=cfg.name,
        storage_path=path,
        storage_filesystem=fs,
        failure_config=ray.train.FailureConfig(max_failures=cfg.scaling.max_failures),
        checkpoint_config=_checkpoint_config(cfg),
        callbacks=run_callbacks or None,
    )
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=payload,
        scaling_config=scaling,
        run_config=run_config,
        torch_config=TorchConfig(backend="nccl" if cfg.scaling.use_gpu else "gloo"),
    )


def _checkpoint_config(cfg: TrialConfig) -> Any:
    """Ray keeps ``train.keep_checkpoints`` checkpoints and the latest: the latest ones, or with
    ``eval.select_epoch: best`` the best-scoring by ``eval.select_metric``
    (`calibtune.trial._select`)."""
    import ray.train

    keep = cfg.train.keep_checkpoints
    if cfg.eval.select_epoch != "best":
        return ray.train.CheckpointConfig(num_to_keep=keep)
    metric = cfg.eval.select_metric
    order = K.direction(metric)
    return ray.train.CheckpointConfig(
        num_to_keep=keep, checkpoint_score_attribute=metric, checkpoint_score_order=order
    )


def _fit(trainer: Any, retries: int) -> Any:
    for attempt in range(retries + 1):
        try:
            return trainer.fit()
        except (ValueError, NonFiniteLossError):
            raise  # bad input or divergence: a retry would fail the same way
        except Exception:
            if attempt == retries:
                raise
    raise AssertionError("unreachable")


def _reason(e: BaseException) -> str:
    """The worker's one-line reason: its own exception in-process (local mode), else the line
    of Ray's error text that carries it (a worker's error arrives as text)."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, TrialStepError | NonFiniteLossError):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    text = str(e)
    for line in text.splitlines():
        if "non-finite loss at epoch" in line:
            return line.split("NonFiniteLossError: ")[-1].strip()
        if "TrialStepError: " in line:
            return line.split("TrialStepError: ", 1)[-1].strip()
    return text.strip().splitlines()[-1] if text.strip() else type(e).__name__


IDENTITY_FILE = "trial_identity.json"


def _identity(cfg: TrialConfig) -> dict[str, Any]:
    """What a checkpoint depends on: resuming with anything else would mix two trials."""
    d = config_to_dict(cfg)
    ident = {k: d[k] for k in ("seed", "data", "model", "loss", "optimizer", "schedule")}
    ident["train.batch_size"] = cfg.train.batch_size
    return json.loads(json.dumps(ident))


def _diff(old: Any, new: Any, path: str = "") -> str | None:
    if isinstance(old, dict) and isinstance(new, dict):
        for k in sorted(set(old) | set(new)):
            found = _diff(old.get(k), new.get(k), f"{path}.{k}" if path else k)
            if found:
                return found
        return None
    return None if old == new else f"{path}: {old!r} then, {new!r} now"


def check_same_trial(cfg: TrialConfig, trial_dir: Storage) -> None:
    """Refuse to resume a trial folder whose checkpoints came from a different config."""
    marker = trial_dir / IDENTITY_FILE
    ident = _identity(cfg)
    if marker.is_file() and any((trial_dir / "checkpoints").glob("*")) | any(
        trial_dir.glob("checkpoint_*")
    ):
        found = _diff(json.loads(marker.read_text()), ident)
        if found:
            raise ValueError(
                f"trial {cfg.name!r} in {trial_dir.parent} was started with another config "
                f"({found}); re-run it unchanged to resume, or choose another name"
            )
        return
    atomic_write(marker, json.dumps(ident, indent=1, sort_keys=True))  # a full disk: no half


def check_data_files(cfg: TrialConfig, splits: bool = False) -> None:
    """Load every configured OOD and shift set (and, with ``splits``, the dataset) so that
    missing files raise `DatasetNotFoundError` before any training starts rather than after it;
    with ``splits``, also refuse a ``train.batch_size`` larger than the training split."""
    if splits:
        loaded = D.load_splits(
            cfg.data.name,
            root=cfg.data.root,
            seed=cfg.data.split_seed,
            val_fraction=cfg.data.val_fraction,
        )
        n_train = len(loaded.train)
        if cfg.train.batch_size > n_train:
            raise ValueError(
                f"train.batch_size: expected at most the {n_train} examples of the "
                f"{cfg.data.name} training split, got {cfg.train.batch_size}"
            )
    names = cfg.data.ood if cfg.data.ood is not None else tuple(D.default_ood(cfg.data.name))
    for name in names:
        D.load_ood(name, root=cfg.data.root, in_distribution=cfg.data.name)
    for name in shift_sets(cfg):  # the test sides' files (validation sides need no files)
        D.load_shift(name, "shift", 5, root=cfg.data.root)
