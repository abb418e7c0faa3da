"""Trial checkpoints: one ``state.pt`` per checkpoint directory, loadable with weights_only=True.

Contents (tensors, numbers, strings, lists, dicts and tuples only, so the safe unpickler reads
them): model and optimiser state, the adaptive loss's state (AdaFocal γ, edges and γ history),
each rank's torch and Python RNG states and its trial device's CUDA RNG state, the number of
completed epochs and the per-epoch reports. The learning-rate schedule is a pure function of
the epoch (see `calibtune.training.lr_schedule`), so the epoch is its whole state.

Every read and write goes through the storage owner (`calibtune.storage`), so a trial folder
may be a local path or a bucket (``s3://…``).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
from typing import Any

import torch
from torch import nn

from calibtune.storage import Storage, open_storage

__all__ = [
    "CHECKPOINT_FILE",
    "capture_rng",
    "latest_local_checkpoint",
    "load_state",
    "prune_local_checkpoints",
    "restore_rng",
    "save_state",
    "save_tensors",
]

CHECKPOINT_FILE = "state.pt"
FORMAT_VERSION = 1
_EPOCH_DIR = re.compile(r"^epoch_(\d{6})$")


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """This process's torch and Python RNG states and, on a CUDA ``device`` (the trial's), that
    device's state only: a checkpoint does not depend on how many GPUs were visible."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore `capture_rng`'s states; the CUDA state goes to ``device`` (the trial's, whatever
    its index at save time) and is skipped on a CPU ``device`` (a GPU checkpoint resumes on the
    CPU). A checkpoint of an older calibtune holds every visible device's state: ``device``'s
    index picks one, where it has that many."""
    torch.set_rng_state(state["torch"])
    random.setstate(_tuplify(state["python"]))
    cuda = state.get("cuda")
    if cuda is None or device is None or device.type != "cuda":
        return
    if isinstance(cuda, list | tuple):
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= len(cuda):
            return
        cuda = cuda[index]
    torch.cuda.set_rng_state(cuda, device)


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, list | tuple) else x


def save_state(
    directory: str | os.PathLike[str] | Storage,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    epoch: int,
    history: list[dict[str, Any]],
    rngs: list[dict[str, Any]] | None = None,
    scaler: dict[str, Any] | None = None,
) -> Storage:
    """Write ``directory/state.pt`` atomically through the storage owner (temp file, fsync and
    rename on a disk; one complete upload to a bucket) and return where it is.

    ``rngs``: every rank's RNG state (rank order), so that each rank of a restarted
    multi-worker trial restores its own; default: this process's only."""
    state = {
        "format": FORMAT_VERSION,
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "loss": loss_fn.state_dict(),
        "rng": capture_rng() if rngs is None else rngs[0],
        "rngs": [capture_rng()] if rngs is None else rngs,
        "history": history,
        "scaler": dict(scaler or {}),  # fp16's GradScaler (`calibtune.training.Precision`)
    }
    path = open_storage(directory) / CHECKPOINT_FILE
    save_tensors(state, path)
    return path


def save_tensors(obj: Any, path: str | os.PathLike[str] | Storage) -> None:
    """``torch.save(obj, path)`` through a file object of the storage owner, atomically.

    Given a path, PyTorch's zip writer reports a full disk as ``RuntimeError: … unexpected pos``;
    through a file object the write raises ``OSError(ENOSPC)``, which the study recognises as a
    full disk (one line, resumable) instead of a failed trial."""
    with open_storage(path).open_output() as f:
        torch.save(obj, f)


def load_state(directory: str | os.PathLike[str] | Storage) -> dict[str, Any]:
    """Read a checkpoint written by `save_state` with the safe (weights-only) unpickler.

    Every tensor is mapped to the CPU: a checkpoint written on a GPU resumes on a CPU-only
    machine, and ``load_state_dict`` copies each tensor to its module's (or, for the optimiser
    state, its parameter's) device, so a CPU-written one resumes on a GPU."""
    path = open_storage(directory) / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint: expected {path} to exist")
    with path.open_input() as f:
        state = torch.load(f, map_location="cpu", weights_only=True)
    if state.get("format") != FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {path}: expected format {FORMAT_VERSION}, got {state.get('format')!r}"
        )
    return state


def _epoch_dirs(root: Storage) -> list[tuple[int, Storage]]:
    return sorted(
        (int(m.group(1)), root / name) for name in root.listdir() if (m := _EPOCH_DIR.match(name))
    )


def latest_local_checkpoint(checkpoint_root: str | os.PathLike[str] | Storage) -> Storage | None:
    """The ``epoch_NNNNNN`` folder with the highest epoch holding a complete ``state.pt``."""
    found = [d for _, d in _epoch_dirs(open_storage(checkpoint_root))]
    return next((d for d in reversed(found) if (d / CHECKPOINT_FILE).is_file()), None)


def epoch_dir(checkpoint_root: str | os.PathLike[str] | Storage, epoch: int) -> Storage:
    return open_storage(checkpoint_root) / f"epoch_{epoch:06d}"


def prune_local_checkpoints(
    checkpoint_root: str | os.PathLike[str] | Storage,
    keep: int,
    keep_epochs: set[int] | None = None,
) -> None:
    """Remove all but the ``keep`` latest ``epoch_NNNNNN`` folders, or, with ``keep_epochs``,
    all but those epochs' (`calibtune.trial._select.keep_local`)."""
    dirs = _epoch_dirs(open_storage(checkpoint_root))
    if keep_epochs is not None:
        drop = [d for e, d in dirs if e not in keep_epochs]
    else:
        drop = [d for _, d in dirs[:-keep]]
    for d in drop:
        with contextlib.suppress(OSError):
            d.delete()
