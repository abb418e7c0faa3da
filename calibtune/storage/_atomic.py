"""Atomic local writes without pyarrow: `AtomicWriter` (temp file beside the target, fsync,
rename on close) and the notes of writes a full disk failed (`note_full`, `full_paths`).

`calibtune.storage.Storage.open_output` writes a local file through `AtomicWriter` directly, and
`calibtune.storage._local.AtomicLocalHandler` hands one to pyarrow for Ray Tune's copies. Every
ENOSPC or EDQUOT a write sees is noted for the study's disk-full stop
(`calibtune.studyfile._diskfull`). A temp file left by a process killed mid-write
(``.NAME.XXXXXXXX.tmp``) is inert: every reader reads files by name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import uuid
from typing import Any

__all__ = [
    "FULL_ERRNOS",
    "AtomicWriter",
    "disk_full_text",
    "forget_full",
    "full_paths",
    "note_full",
]

_ENOSPC = re.compile(
    r"No space left on device|\[errno 28\]|database or disk is full|Disk quota exceeded", re.I
)


def disk_full_text(text: str | None) -> bool:
    """Whether an error's text says that a disk (or an SQLite store on it) is full.

    >>> disk_full_text("OSError: [Errno 28] No space left on device"), disk_full_text("x")
    (True, False)
    """
    return bool(text) and _ENOSPC.search(text) is not None


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # a quota that runs out fills the disk as far as we go
_FULL: set[str] = set()  # files (absolute) whose write failed with ENOSPC in this process


def note_full(path: str | os.PathLike[str]) -> None:
    """Record that a write of ``path`` failed because its disk (or quota) is full."""
    _FULL.add(os.path.abspath(path))


def full_paths(root: str | os.PathLike[str]) -> list[str]:
    """The noted full-disk writes under the folder ``root``."""
    if not getattr(root, "is_local", True):  # a bucket (`Storage`) has no disk to fill
        return []
    prefix = os.path.join(os.path.abspath(root), "")
    return [p for p in _FULL if p.startswith(prefix)]


def forget_full(root: str | os.PathLike[str]) -> None:
    _FULL.difference_update(full_paths(root))


class AtomicWriter:
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
        self._error: OSError | None = None  # the failure every later write repeats
        self._fd = self._guard(
            lambda: os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        )

    def _guard(self, op: Any) -> Any:
        try:
            return op()
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:
                note_full(self.path)
            self._error = exc
            self._abort()
            raise

    def _abort(self) -> None:
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            if fd is not None:
                os.close(fd)
            os.unlink(self.tmp)

    @property
    def error(self) -> OSError | None:
        """The error of the write (or open, fsync) that failed, if one did."""
        return self._error

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
            if self._fd is None:  # a writer's clean-up (torch's zip end record) after a failure
                if self._error is not None:
                    raise self._error
                raise ValueError(f"{self.path}: write to a closed stream")
            n = self._guard(lambda fd=self._fd, v=view: os.write(fd, v))
            view = view[n:]
        self._pos += size
        return size

    def flush(self) -> None:
        pass

    def abort(self) -> None:
        """Drop what was written: the target keeps its previous content."""
        self._abort()

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
