"""An exclusive lock on a storage location, held by one process for a block.

On the local disk (and NFS with lock support) the lock is an advisory ``flock`` on an open file:
the kernel drops it when the holder dies, so a lock left by a killed process is stale at once.
An object store has no ``flock``: the lock is an object holding its holder's token and a lease
(``expires``, wall-clock seconds), renewed by a heartbeat thread every third of the lease
(`lease_s`, ``$CALIBTUNE_LOCK_LEASE_S``, default 60 s). A holder that dies stops renewing, and
its lock is free once the lease has expired, or at once for a process on the same host whose
holder is no longer alive (a driver SIGKILLed and resumed on the same machine; host names are
unique per machine or pod, as Kubernetes and the Ray cluster launcher make them). Taking it
writes the object and reads it back after a short pause (last writer wins: a process that
reads another's token lost); without a conditional PUT in pyarrow two processes starting within
that pause could both believe they won, which a person starting the same study twice within a
second does not do. Clocks of the machines
involved must agree to well within the lease (NTP does that).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from calibtune.storage._storage import Storage

__all__ = ["StorageLockedError", "hold_lock", "lease_s"]

LEASE_ENV = "CALIBTUNE_LOCK_LEASE_S"
DEFAULT_LEASE_S = 60.0
CONFIRM_S = 0.5  # the pause between writing the lock object and reading it back


class StorageLockedError(OSError):
    """Another live process holds the lock; ``holder``: its record (pid, host, since), or None."""

    def __init__(self, where: str, holder: dict[str, Any] | None) -> None:
        super().__init__(errno.EWOULDBLOCK, "locked", where)
        self.holder = holder


def lease_s() -> float:
    """The lease of an object-store lock: ``$CALIBTUNE_LOCK_LEASE_S`` (default 60 s)."""
    raw = os.environ.get(LEASE_ENV) or ""
    try:
        value = float(raw) if raw else DEFAULT_LEASE_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{LEASE_ENV}: expected a number of seconds > 0, got {raw!r}")
    return value


def _record(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), **(extra or {})}


@contextlib.contextmanager
def hold_lock(target: Storage) -> Iterator[None]:
    """Hold the lock ``target`` (a file) for the block; `StorageLockedError` if another live
    process holds it. The lock file (local) stays; the lock object (a store) is deleted."""
    cm = _flock(target) if target.is_local else _lease(target)
    with cm:
        yield


@contextlib.contextmanager
def _flock(target: Storage) -> Iterator[None]:
    path = target.local_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise StorageLockedError(target.uri, _parse(os.pread(fd, 4096, 0))) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(_record()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _parse(raw: bytes | str) -> dict[str, Any] | None:
    try:
        holder = json.loads(raw or b"{}")
    except ValueError:
        return None
    return holder if isinstance(holder, dict) and "pid" in holder else None


def _holder(target: Storage) -> dict[str, Any] | None:
    try:
        return _parse(target.read_bytes())
    except FileNotFoundError:
        return None


def _stale(held: dict[str, Any]) -> bool:
    """Whether a lock object no longer holds: its lease expired, or its holder was a process of
    this host that has ended."""
    if float(held.get("expires", 0)) <= time.time():
        return True
    if held.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(held["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, TypeError, ValueError):
        return False
    return False


@contextlib.contextmanager
def _lease(target: Storage) -> Iterator[None]:
    lease = lease_s()
    token = uuid.uuid4().hex
    held = _holder(target)
    if held and not _stale(held):
        raise StorageLockedError(target.uri, held)
    mine = _record({"token": token, "expires": time.time() + lease})
    target.write_text(json.dumps(mine))
    time.sleep(CONFIRM_S)
    held = _holder(target)
    if not held or held.get("token") != token:
        raise StorageLockedError(target.uri, held)
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat, args=(target, mine, lease, stop), name="calibtune-lock", daemon=True
    )
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        with contextlib.suppress(OSError):
            if (_holder(target) or {}).get("token") == token:
                target.delete()


def _heartbeat(target: Storage, mine: dict[str, Any], lease: float, stop: threading.Event) -> None:
    """Renew the lease every third of it until ``stop``; a failed renewal is retried at the
    next beat (the lease leaves two more)."""
    while not stop.wait(lease / 3):
        with contextlib.suppress(OSError):
            target.write_text(json.dumps({**mine, "expires": time.time() + lease}))
