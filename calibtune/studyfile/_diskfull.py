"""A study's storage that fills up mid-study costs nothing: Ray Tune's state is written
atomically, the study stops in one line, and `calibtune resume` finishes it once space is freed.

Ray Tune 2.60 stages its experiment state (``experiment_state-*.json``, ``searcher-state-*.pkl``,
the trials' result and error files) on the driver's local disk and copies that folder onto the
storage with ``pyarrow.fs.copy_files``, which truncates each file there and rewrites it in place:
a full disk left a truncated state that Tune could not restore, and a truncated ``error.pkl``
that made ``Tuner.fit`` itself raise ``EOFError`` (issue 24). `atomic_filesystem` is the adapter:
a ``pyarrow.fs.PyFileSystem`` over the local file system, handed to Tune through its public
``storage_filesystem`` argument (``RunConfig``, ``Tuner.restore``), whose output streams write a
temp file beside the target, fsync it and rename it over the target on close; after a failed
write the temp file is removed and the last complete file stays. Every ENOSPC it sees is noted
(`storage_full`): the study's callbacks read that to stop the study (Tune's graceful stop,
`request_stop`), and the scheduler's forced save before a trial starts raises
`StorageFullError` when it failed, so that no trial starts that Tune's saved state would not
know (`calibtune.study._scheduling`). `run_study` turns either into one line and exit code 75.

Tune writes its experiment state from the driver only, so the notes live in the driver process.
A temp file left by a process killed mid-write (``.NAME.XXXXXXXX.tmp``) is inert: Tune reads
``experiment_state-*.json`` and the other state files by name.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from calibtune.storage import (
    atomic_filesystem,
    disk_full_text,
    forget_full,
    full_paths,
    note_full,
)

__all__ = [
    "StorageFullError",
    "atomic_filesystem",
    "disk_full_text",
    "full_message",
    "note_full",
    "request_stop",
    "silence_disk_full_logs",
    "stop_reason",
    "storage_full",
    "tolerate_full_store",
    "trial_error_text",
]

_STOPPED: dict[str, str] = {}  # study folder -> the one line its disk-full stop printed
_SIGNALLED: set[str] = set()  # study folders whose stop was sent to Tune


class StorageFullError(OSError):
    """Tune's state could not be saved on the storage ``args[0]`` (ENOSPC): nothing may start."""

    def __init__(self, storage: str) -> None:
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), storage)


def storage_full(storage: str | os.PathLike[str]) -> bool:
    """Whether a write under ``storage`` failed with ENOSPC in this process (or a disk-full stop
    of its study was requested)."""
    return str(storage) in _STOPPED or bool(full_paths(storage))


def full_message(storage: Path) -> str:
    try:
        free = f"{shutil.disk_usage(storage).free / 1024**2:.1f} MiB free"
    except (OSError, ValueError):  # ValueError: a bucket, which has no free space to tell
        free = "free space unknown"
    return (
        f"storage {storage} is full ({free}): the study stopped; free space and run "
        f"'calibtune resume {storage}'"
    )


def request_stop(storage: Path, message: str | None = None) -> None:
    """Stop the study the way Ctrl-C does (Tune's SIGUSR1: state kept, trials resumable), once;
    ``message``: the one line that says why (default: the disk is full). From another thread
    (a lock's heartbeat) the line is only noted: the storage guard, on Tune's loop in the main
    thread, sees it (`storage_full`) at its next step and sends the signal to Tune's handler."""
    key = str(storage)
    if key not in _STOPPED:
        _STOPPED[key] = message or full_message(storage)
    elif key in _SIGNALLED:
        return
    on_tune_loop = threading.current_thread() is threading.main_thread()
    if on_tune_loop and signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
        _SIGNALLED.add(key)
        os.kill(os.getpid(), signal.SIGUSR1)


def stop_reason(storage: Path) -> str | None:
    """The one line of a study in ``storage`` that the full disk stopped in this process (a stop
    requested, or only an ENOSPC noted), else None; read once (a later run starts afresh)."""
    line = _STOPPED.pop(str(storage), None)
    _SIGNALLED.discard(str(storage))
    if line is None and storage_full(storage):
        line = full_message(storage)
    forget_full(storage)
    return line


def trial_error_text(trial: Any) -> str:
    """The error Tune recorded for a failed trial, from its driver-local staging copy (the copy
    on the storage may be missing or old when the storage is full)."""
    with contextlib.suppress(OSError, TypeError):
        return Path(trial.error_file).read_text(errors="replace")
    return ""


@contextlib.contextmanager
def tolerate_full_store(stopping: bool) -> Iterator[None]:
    """While a study stops on a full disk, skip an MLflow write that the same full disk refuses
    (`resume` writes it again); anything else still raises."""
    try:
        yield
    except Exception as exc:
        if not (stopping and disk_full_text(f"{exc!r} {exc}")):
            raise


# ----------------------------------------------------------------------------- log lines


class _DiskFullFilter(logging.Filter):
    """Drop Ray's and MLflow's tracebacks caused by the full disk (the study's one line says
    it): a record whose text names ENOSPC (a trial's error, a failed state sync, an unhandled
    task error), and any of Ray Tune's once a disk-full stop was requested (its "trials did not
    complete", "stop signal received")."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(("ray", "mlflow")):
            return True
        if _STOPPED and record.name.startswith(("ray.tune", "ray.train")):
            return False
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {record.exc_info[1]!r} {record.exc_info[1]}"
        return not disk_full_text(text)


def silence_disk_full_logs() -> None:
    """Install `_DiskFullFilter` on the handlers of Ray's and MLflow's loggers (idempotent)."""
    for name in ("ray", "mlflow"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _DiskFullFilter) for f in handler.filters):
                handler.addFilter(_DiskFullFilter())
