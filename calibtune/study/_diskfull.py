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
import re
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyarrow import PythonFile
from pyarrow.fs import FileSystemHandler, LocalFileSystem, PyFileSystem

# Imported by the study driver only when a study runs (pyarrow comes with Ray).

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

_ENOSPC = re.compile(
    r"No space left on device|\[errno 28\]|database or disk is full|Disk quota exceeded", re.I
)
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # a quota that runs out fills the disk as far as we go
_FULL: set[str] = set()  # files (absolute) whose write failed with ENOSPC in this process
_STOPPED: dict[str, str] = {}  # study folder -> the one line its disk-full stop printed


class StorageFullError(OSError):
    """Tune's state could not be saved on the storage ``args[0]`` (ENOSPC): nothing may start."""

    def __init__(self, storage: str) -> None:
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), storage)


def disk_full_text(text: str | None) -> bool:
    """Whether an error's text says that a disk (or an SQLite store on it) is full."""
    return bool(text) and _ENOSPC.search(text) is not None


def note_full(path: str | os.PathLike[str]) -> None:
    _FULL.add(os.path.abspath(path))


def storage_full(storage: str | os.PathLike[str]) -> bool:
    """Whether a write under ``storage`` failed with ENOSPC in this process (or a disk-full stop
    of its study was requested)."""
    root = os.path.join(os.path.abspath(storage), "")
    return str(storage) in _STOPPED or any(p.startswith(root) for p in _FULL)


def full_message(storage: Path) -> str:
    try:
        free = f"{shutil.disk_usage(storage).free / 1024**2:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    return (
        f"storage {storage} is full ({free}): the study stopped; free space and run "
        f"'calibtune resume {storage}'"
    )


def request_stop(storage: Path) -> None:
    """Stop the study the way Ctrl-C does (Tune's SIGUSR1: state kept, trials resumable), once."""
    key = str(storage)
    if key in _STOPPED:
        return
    _STOPPED[key] = full_message(storage)
    os.kill(os.getpid(), signal.SIGUSR1)


def stop_reason(storage: Path) -> str | None:
    """The one line of a study in ``storage`` that the full disk stopped in this process (a stop
    requested, or only an ENOSPC noted), else None; read once (a later run starts afresh)."""
    line = _STOPPED.pop(str(storage), None)
    if line is None and storage_full(storage):
        line = full_message(storage)
    root = os.path.join(os.path.abspath(storage), "")
    _FULL.difference_update({p for p in _FULL if p.startswith(root)})
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


# ----------------------------------------------------------------------------- the file system


def atomic_filesystem() -> Any:
    """The local file system for Tune's ``storage_filesystem``, with atomic output streams."""
    return PyFileSystem(AtomicLocalHandler())


class _AtomicWriter:
    """A binary file object (for ``pyarrow.PythonFile``) writing ``path`` atomically: bytes go to
    a temp file beside it, unbuffered (ENOSPC surfaces at the write that hits it); `close`
    fsyncs it and renames it over ``path``. A failed write removes the temp file at once (the
    stream may outlive the copy that failed, held by its exception) and keeps the old file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tmp = os.path.join(
            os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp"
        )
        self._pos = 0
        self._fd: int | None = None
        self._fd = self._guard(
            lambda: os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        )

    def _guard(self, op: Any) -> Any:
        try:
            return op()
        except OSError as exc:
            if exc.errno in _FULL_ERRNOS:
                note_full(self.path)
            self._abort()
            raise

    def _abort(self) -> None:
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            if fd is not None:
                os.close(fd)
            os.unlink(self.tmp)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        while view:
            if self._fd is None:
                raise ValueError(f"{self.path}: write to a closed or failed stream")
            n = self._guard(lambda fd=self._fd, v=view: os.write(fd, v))
            view = view[n:]
        self._pos += size
        return size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self._fd is None:
            return
        self._guard(lambda: os.fsync(self._fd))  # type: ignore[arg-type]
        fd, self._fd = self._fd, None
        os.close(fd)
        try:
            os.replace(self.tmp, self.path)
        except OSError:
            self._abort()
            raise

    def __del__(self) -> None:  # a stream dropped unclosed: its bytes may be partial
        self._abort()


class AtomicLocalHandler(FileSystemHandler):
    """``pyarrow.fs.LocalFileSystem`` with atomic `open_output_stream` and `copy_file`."""

    def __init__(self) -> None:
        self.fs = LocalFileSystem()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AtomicLocalHandler)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "calibtune-atomic-local"

    def normalize_path(self, path: str) -> str:
        return self.fs.normalize_path(path)

    def get_file_info(self, paths: Any) -> Any:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self.fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("calibtune's storage file system never empties the root folder")

    def delete_file(self, path: str) -> None:
        self.fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        with open(src, "rb") as f, self.open_output_stream(dest, None) as out:
            shutil.copyfileobj(f, out)

    def open_input_stream(self, path: str) -> Any:
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return PythonFile(_AtomicWriter(path), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_append_stream(path)
