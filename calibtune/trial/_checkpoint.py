"""Trial checkpoints: one ``state.pt`` per checkpoint directory, loadable with weights_only=True.

Contents (tensors, numbers, strings, lists, dicts and tuples only, so the safe unpickler reads
them): model and optimiser state, the adaptive loss's state (AdaFocal γ, edges and γ history),
each rank's torch and Python RNG states and its trial device's CUDA RNG state, the number of
completed epochs and the per-epoch reports. The learning-rate schedule is a pure function of
the epoch (see `calibtune.training.lr_schedule`), so the epoch is its whole state.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

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
    directory: str | os.PathLike[str],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    epoch: int,
    history: list[dict[str, Any]],
    rngs: list[dict[str, Any]] | None = None,
    scaler: dict[str, Any] | None = None,
) -> Path:
    """Write ``directory/state.pt`` atomically (temp file + rename) and return its path.

    ``rngs``: every rank's RNG state (rank order), so that each rank of a restarted
    multi-worker trial restores its own; default: this process's only."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
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
    tmp = d / (CHECKPOINT_FILE + ".tmp")
    save_tensors(state, tmp)
    os.replace(tmp, d / CHECKPOINT_FILE)
    return d / CHECKPOINT_FILE


def save_tensors(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save(obj, path)`` through a Python file object.

    Given a path, PyTorch's zip writer reports a full disk as ``RuntimeError: … unexpected pos``;
    through a file object the write raises ``OSError(ENOSPC)``, which the study recognises as a
    full disk (one line, resumable) instead of a failed trial."""
    with open(path, "wb") as f:
        torch.save(obj, f)


def load_state(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint written by `save_state` with the safe (weights-only) unpickler.

    Every tensor is mapped to the CPU: a checkpoint written on a GPU resumes on a CPU-only
    machine, and ``load_state_dict`` copies each tensor to its module's (or, for the optimiser
    state, its parameter's) device, so a CPU-written one resumes on a GPU."""
    path = Path(directory) / CHECKPOINT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint: expected {path} to exist")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("format") != FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {path}: expected format {FORMAT_VERSION}, got {state.get('format')!r}"
        )
    return state


def latest_local_checkpoint(checkpoint_root: str | os.PathLike[str]) -> Path | None:
    """The ``epoch_NNNNNN`` directory with the highest epoch holding a complete ``state.pt``."""
    root = Path(checkpoint_root)
    if not root.is_dir():
        return None
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _EPOCH_DIR.match(p.name)) and (p / CHECKPOINT_FILE).is_file()
    ]
    return max(found)[1] if found else None


def epoch_dir(checkpoint_root: str | os.PathLike[str], epoch: int) -> Path:
    return Path(checkpoint_root) / f"epoch_{epoch:06d}"


def prune_local_checkpoints(
    checkpoint_root: str | os.PathLike[str], keep: int, keep_epochs: set[int] | None = None
) -> None:
    """Remove all but the ``keep`` latest ``epoch_NNNNNN`` folders, or, with ``keep_epochs``,
    all but those epochs' (`calibtune.trial._select.keep_local`)."""
    root = Path(checkpoint_root)
    dirs = sorted(p for p in root.iterdir() if _EPOCH_DIR.match(p.name)) if root.is_dir() else []
    if keep_epochs is not None:
        drop = [p for p in dirs if int(p.name.split("_")[1]) not in keep_epochs]
    else:
        drop = dirs[:-keep]
    for p in drop:
        shutil.rmtree(p, ignore_errors=True)
