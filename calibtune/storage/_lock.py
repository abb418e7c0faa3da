"""An exclusive lock on a storage location, held by one process for a block.

On the local disk (and NFS with lock support) the lock is an advisory ``flock`` on an open file:
the kernel drops it when the holder dies, so a lock left by a killed process is stale at once.

An object store has no ``flock``: the lock is an object naming its holder (host, pid, boot id,
PID namespace, a token) and the end of its lease (``expires``, wall-clock seconds; `lease_s`,
``$CALIBTUNE_LOCK_LEASE_S``, default 60 s), and every write of it is a compare-and-set (S3's
conditional PUT, which S3, MinIO and moto honour with 412 Precondition Failed):

- taking a free lock creates the object only if there is none (``If-None-Match: *``); taking over
  an expired lease, or one whose holder has ended, replaces exactly the object read
  (``If-Match: <its ETag>``): of two drivers racing, exactly one wins, the other is refused;
- the holder renews its lease every sixth of it with ``If-Match: <the ETag of its last write>``,
  each renewal one request bounded by timeouts of a twelfth of the lease (at least 0.25 s; no
  retries inside it; 5 s + 5 s of a 60 s lease): a renewal cannot outlast the lease, and one
  refused because the object changed (412) learns that its lock was taken (unless the object is
  its own write whose answer was lost);
- a holder whose last successful renewal was sent half a lease ago or longer (``GIVE_UP_AT``),
  or whose lock was taken, gives the lock up: ``on_lost(reason)`` is called once, from the lock's
  own thread, so that the holder stops its work (a study stops the graceful way a full disk
  stops it: `calibtune.studyfile._studydir`). The other half of the lease is the margin for that
  stop and for the clocks of the machines, which must agree to well within it (NTP does that):
  nobody else can take the lease before it ends. A driver paused past its lease (a stopped VM,
  a long GC pause) gives up when it wakes, and its first renewal is refused if another took
  over. Renewals go on (fenced) until the block ends; the holder deletes the object on the way
  out only if it is still its own (``If-Match``).

A holder that dies stops renewing; its lock is free once the lease has ended, or at once when its
record shows a process of this host, this boot and this PID namespace that no longer runs (its
pid free, or reused by a process started at another time: a driver SIGKILLed and resumed on the
same machine or in the same container). Containers with host networking share a host name but
not a PID namespace, where a pid means another process: such a holder, an older record without
boot id and namespace, and one on another host keep the lock until the lease ends, and the
refusal says when (`lease_note`). Acquisition first reads the object, so that a live holder is
never overwritten even on a store that ignores preconditions; such a store (a conditional write
whose condition fails answered 200, or 501) is then refused in one line (`StorageError`, exit 2
before anything starts), as is an object store reached through anything but ``s3://``.

The S3 requests go through boto3, to the store the `Storage` names (its file system's endpoint
and region), with the SDK's default credential chain (environment variables, profiles, the
node's role): no key is passed, pickled or logged here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from calibtune.storage._storage import Storage, StorageError

__all__ = ["StorageLockLostError", "StorageLockedError", "hold_lock", "lease_note", "lease_s"]

LEASE_ENV = "CALIBTUNE_LOCK_LEASE_S"
DEFAULT_LEASE_S = 60.0
RENEW_EVERY = 1 / 6  # of the lease: the heartbeat's period
REQUEST_TIMEOUT = 1 / 12  # of the lease: a renewal's connect and read timeouts (one attempt)
MIN_TIMEOUT_S = 0.25  # below this a loaded machine misses renewals that a store answered
GIVE_UP_AT = 1 / 2  # of the lease after the last renewal sent: the holder gives the lock up
ACQUIRE_TIMEOUT_S = 10.0  # a request of acquisition or release (retried by the SDK)
ACQUIRE_ROUNDS = 4  # reads and conditional writes before a driver that keeps losing races yields
_NO_ETAG = '"00000000000000000000000000000000"'  # matches no object: the If-Match probe

_log = logging.getLogger(__name__)


class StorageLockedError(OSError):
    """Another live process holds the lock; ``holder``: its record (pid, host, since, and for a
    lock object ``expires``), or None."""

    def __init__(self, where: str, holder: dict[str, Any] | None) -> None:
        super().__init__(errno.EWOULDBLOCK, "locked", where)
        self.holder = holder


class StorageLockLostError(StorageLockedError):
    """The lease of a lock held for a block was lost (not renewed in time, or taken over) and
    the block had no ``on_lost`` to stop its work; ``reason``: the one line saying so."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(where, None)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


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
def hold_lock(target: Storage, on_lost: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock ``target`` (a file) for the block; `StorageLockedError` if another live
    process holds it. The lock file (local) stays; the lock object (a store) is deleted.

    In a store the lock is a lease (see the module): when it is lost while the block runs,
    ``on_lost(reason)`` is called once, from another thread, with one line saying why; the
    block should then end its work. Without ``on_lost``, leaving the block raises
    `StorageLockLostError`. A store that cannot fence the lease is refused (`StorageError`)."""
    if target.is_local:
        with _flock(target):
            yield
        return
    lease = _Lease.acquire(target, on_lost)
    try:
        yield
    finally:
        lease.release()
    if lease.lost is not None and on_lost is None:
        raise StorageLockLostError(target.uri, lease.lost)


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


# ----------------------------------------------------------------------------- who holds it


def _read_proc(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # not Linux, or /proc hidden
        return None


def _started(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks after boot: ``/proc/PID/stat`` field 22),
    which tells a reused pid from the process that held it; None when unknown."""
    stat = _read_proc(f"/proc/{pid}/stat")
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])  # type: ignore[union-attr]
    except (AttributeError, IndexError, ValueError):
        return None


@functools.cache
def _machine() -> dict[str, Any]:
    """This process's host name, boot id and PID namespace (inode of ``/proc/self/ns/pid``)."""
    boot = _read_proc("/proc/sys/kernel/random/boot_id")
    try:
        pidns: int | None = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = None
    return {"host": socket.gethostname(), "boot_id": boot and boot.strip(), "pidns": pidns}


def _identity() -> dict[str, Any]:
    pid = os.getpid()
    return {**_machine(), "pid": pid, "pid_start": _started(pid), "since": time.time()}


def _same_pid_space(held: dict[str, Any]) -> bool:
    """Whether the holder's pid names a process of this boot of this host, in this PID
    namespace (where ``os.kill(pid, 0)`` tells whether it still runs)."""
    me = _machine()
    return (
        held.get("host") == me["host"]
        and me["boot_id"] is not None
        and me["pidns"] is not None
        and held.get("boot_id") == me["boot_id"]
        and held.get("pidns") == me["pidns"]
    )


def _gone(held: dict[str, Any]) -> bool:
    """Whether the holder is a process of this host, boot and PID namespace that has ended (its
    pid free, or taken by a process started at another time)."""
    if not _same_pid_space(held):
        return False
    try:
        pid = int(held["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it runs, as another user
        pass
    started, recorded = _started(pid), held.get("pid_start")
    return isinstance(recorded, int) and started is not None and started != recorded


def _stale(held: dict[str, Any]) -> bool:
    """Whether a lock object no longer holds: its lease ended, or its holder has ended."""
    try:
        expires = float(held.get("expires", 0))
    except (TypeError, ValueError):
        expires = 0.0
    return expires <= time.time() or _gone(held)


def lease_note(holder: dict[str, Any] | None) -> str:
    """For a message about a lock object's holder: when its lease ends, and why it may still
    run (``""`` for a record without a lease: a disk's lock).

    >>> lease_note({"pid": 1, "host": "x", "expires": time.time() + 30})  # doctest: +ELLIPSIS
    '; its lease ends at ... (in 30 s) unless it renews it'
    """
    try:
        ends = float(holder["expires"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return ""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ends))
    note = f"; its lease ends at {when} (in {max(ends - time.time(), 0):.0f} s) unless it renews it"
    if holder.get("host") == _machine()["host"] and not _same_pid_space(holder):  # type: ignore[union-attr]
        note += (
            " (a process of this host name, but of another boot or PID namespace, a container "
            "sharing the host name, or one that did not record them: whether it still runs "
            "cannot be told from here)"
        )
    return note


# ----------------------------------------------------------------------------- S3 requests


def _client(target: Storage, timeout: float, attempts: int) -> Any:
    """A boto3 S3 client of the store ``target``'s file system writes to (its endpoint, region
    and addressing), credentials from the SDK's default chain."""
    if target.scheme not in ("s3", "s3a"):
        raise StorageError(
            f"{target.uri}: expected a local or NFS path or an s3:// store for a lock (it needs "
            f"conditional writes), got {target.scheme}://; use the store's S3 endpoint "
            "(AWS_ENDPOINT_URL_S3) or a shared disk"
        )
    try:
        import boto3
        import botocore.session
        from botocore.config import Config
    except ImportError:
        raise StorageError(
            f"{target.uri}: expected boto3 for the lock of a study in a bucket (S3's conditional "
            "writes), found none installed: pip install 'boto3>=1.36'"
        ) from None
    try:  # the store Storage writes to (its URI's or the environment's endpoint); keys unread
        conf = target.fs.__reduce__()[1][0]
        host, scheme = conf.get("endpoint_override") or "", conf.get("scheme") or "https"
        region, virtual = conf.get("region") or None, bool(conf.get("force_virtual_addressing"))
    except (AttributeError, IndexError, KeyError, TypeError):
        host, scheme, region, virtual = "", "https", None, False
    env = os.environ
    session = botocore.session.get_session()  # a fresh one: today's credentials and settings
    session.register_component("data_loader", _loader())
    client = boto3.session.Session(botocore_session=session).client(
        "s3",
        endpoint_url=f"{scheme}://{host}" if host else None,
        region_name=region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
        config=Config(
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"mode": "standard", "total_max_attempts": attempts},
            # pyarrow's default: a custom endpoint (MinIO, moto) is addressed by path
            s3={"addressing_style": "virtual" if virtual or not host else "path"},
        ),
    )
    put = client.meta.service_model.operation_model("PutObject").input_shape.members
    if not {"IfMatch", "IfNoneMatch"} <= set(put):
        raise StorageError(
            f"{target.uri}: expected boto3 with S3's conditional writes (If-Match) for a lock, "
            f"found botocore {botocore.__version__}: pip install 'boto3>=1.36'"
        )
    return client


@functools.cache
def _loader() -> Any:
    """botocore's loader of service models, shared: it caches the parsed S3 model, which is
    most of the CPU time of building a client (the GIL it holds delays renewals)."""
    import botocore.session

    return botocore.session.get_session().get_component("data_loader")


def _answer(exc: Exception) -> dict[str, Any]:
    """The parsed answer of a store that refused a request (botocore's ``ClientError``)."""
    response = getattr(exc, "response", None)
    return response if isinstance(response, dict) else {}


def _status(exc: Exception) -> int:
    """The HTTP status a store answered; 0 when it did not answer (a timeout, no connection)."""
    return int(_answer(exc).get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _why(exc: Exception) -> str:
    code = _answer(exc).get("Error", {}).get("Code")
    text = f"{_status(exc)} {code}" if code else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:160]


def _lost_race(exc: Exception) -> bool:
    """A conditional write refused because the object changed (412), another conditional write
    was in flight (409 ConditionalRequestConflict), or it is gone (If-Match: 404)."""
    return _status(exc) in (404, 409, 412)


class _Object:
    """The lock object: ``BUCKET/KEY`` of a store, through ``client``."""

    def __init__(self, client: Any, target: Storage) -> None:
        self.client, self.uri = client, target.uri
        self.bucket, _, self.key = target.path.partition("/")

    def get(self) -> tuple[dict[str, Any] | None, str | None]:
        """Its holder's record (``{}`` for an unreadable one) and ETag; ``(None, None)`` when
        there is none."""
        from botocore.exceptions import ClientError

        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            if _status(exc) == 404:
                return None, None
            raise
        return _parse(r["Body"].read()) or {}, r["ETag"]

    def put(self, record: dict[str, Any], **condition: str) -> str:
        """Write ``record`` (JSON) if ``condition`` holds; its new ETag."""
        body = json.dumps(record).encode()
        return self.client.put_object(Bucket=self.bucket, Key=self.key, Body=body, **condition)[
            "ETag"
        ]

    def delete(self, **condition: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key, **condition)


def _acquire(obj: _Object, mine: dict[str, Any], lease: float) -> tuple[dict[str, Any], str, float]:
    """Write ``mine`` as the lock object if it is free or stale, by a conditional write of the
    version read: the record written, its ETag and the monotonic time the write was sent."""
    from botocore.exceptions import ClientError

    holder: dict[str, Any] | None = None
    for _ in range(ACQUIRE_ROUNDS):
        holder, etag = obj.get()
        if holder is not None and holder.get("token") != mine["token"] and not _stale(holder):
            raise StorageLockedError(obj.uri, holder)
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        sent = time.monotonic()
        record = {**mine, "expires": time.time() + lease}
        try:
            return record, obj.put(record, **condition), sent
        except ClientError as exc:
            if not _lost_race(exc):
                raise
    raise StorageLockedError(obj.uri, holder)  # it kept changing: another driver is taking it


def _check_fenced(obj: _Object, written: dict[str, Any]) -> None:
    """Refuse a store that ignores preconditions: two writes of the record just written (the
    same bytes, so that a store obeying neither changes nothing) whose conditions cannot hold
    must both be refused with 412."""
    from botocore.exceptions import ClientError

    for header, condition in (
        ("If-None-Match: *", {"IfNoneMatch": "*"}),
        ("If-Match: <another ETag>", {"IfMatch": _NO_ETAG}),
    ):
        try:
            obj.put(written, **condition)
            got = "200 OK"
        except ClientError as exc:
            if _status(exc) in (409, 412):  # 409: a racer's conditional write in flight
                continue
            got = _why(exc)
        with contextlib.suppress(Exception):
            obj.delete()
        raise StorageError(
            f"{obj.uri}: expected a store that refuses a conditional write whose condition "
            f"fails ({header} on an existing object: 412), got {got}; without it a lock cannot "
            "keep a second driver out: use S3, MinIO or another store with conditional writes, "
            "or a shared disk"
        )


class _Lease:
    """A held lock object: renewed by one thread, given up by another when not renewed in time
    (see the module)."""

    def __init__(self, obj: _Object, mine: dict[str, Any], lease: float, on_lost: Any) -> None:
        self.obj, self.mine, self.lease, self.on_lost = obj, mine, lease, on_lost
        self.etag, self.sent = "", 0.0  # the last write of ours: its ETag, when it was sent
        self.lost: str | None = None
        self.taken = False  # another holder's write replaced ours
        self.last_error = "none in time"
        self.mutex = threading.Lock()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=f, name=f"calibtune-lock-{f.__name__}", daemon=True)
            for f in (self._renew_loop, self._watch_loop)
        ]

    @classmethod
    def acquire(cls, target: Storage, on_lost: Any) -> _Lease:
        from botocore.exceptions import BotoCoreError, ClientError

        lease = lease_s()
        timeout = max(lease * REQUEST_TIMEOUT, MIN_TIMEOUT_S)
        obj = _Object(_client(target, ACQUIRE_TIMEOUT_S, 3), target)
        self = cls(_Object(_client(target, timeout, 1), target), {}, lease, on_lost)
        self.mine = {**_identity(), "token": uuid.uuid4().hex}
        try:
            written, self.etag, self.sent = _acquire(obj, self.mine, lease)
            _check_fenced(obj, written)
        except (BotoCoreError, ClientError) as exc:
            raise StorageError(
                f"{target.uri}: expected a store that answers, got {_why(exc)}"
            ) from None
        self._renew()  # the lease from now, not from before the checks (a slow store)
        for t in self.threads:
            t.start()
        return self

    def _renew_loop(self) -> None:
        while not self.stop.wait(self.lease * RENEW_EVERY) and not self.taken:
            self._renew()

    def _renew(self) -> None:
        sent = time.monotonic()
        try:
            etag = self.obj.put(
                {**self.mine, "expires": time.time() + self.lease}, IfMatch=self.etag
            )
        except Exception as exc:  # a thread must not die of a store's error: the watch decides
            self.last_error = _why(exc)
            if _lost_race(exc):
                self._check_taken()
            return
        with self.mutex:
            self.etag, self.sent = etag, sent

    def _check_taken(self) -> None:
        """After a refused renewal: adopt our own write whose answer was lost, else give up."""
        try:
            holder, etag = self.obj.get()
        except Exception as exc:
            self.last_error = _why(exc)
            return
        if holder is not None and holder.get("token") == self.mine["token"]:
            with self.mutex:
                self.etag = etag or self.etag
            return
        self.taken = True
        who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder else "its removal"
        self._lose(f"{self.obj.uri}: lock taken over by {who} while this process held it")

    def _watch_loop(self) -> None:
        while True:
            with self.mutex:
                left = self.sent + self.lease * GIVE_UP_AT - time.monotonic()
            if left <= 0:
                self._lose(
                    f"{self.obj.uri}: lock lease not renewed for {self.lease * GIVE_UP_AT:g} s "
                    f"(last answer: {self.last_error}); given up at half of its {self.lease:g} s "
                    "lease, before another driver could take it"
                )
                return
            if self.stop.wait(left):
                return

    def _lose(self, reason: str) -> None:
        with self.mutex:
            if self.lost is not None:
                return
            self.lost = reason
        if self.on_lost is not None:
            try:
                self.on_lost(reason)
            except Exception:  # the holder's own stop failed: say so, the lease still ends
                _log.exception("stopping after a lost lock failed")

    def release(self) -> None:
        """Stop renewing and delete the lock object if it is still ours (``If-Match``)."""
        self.stop.set()
        for t in self.threads:
            t.join()
        try:
            self.obj.delete(IfMatch=self.etag)
        except Exception as exc:
            if _lost_race(exc) or _status(exc) == 0 or self.lost is not None:
                return  # not ours, or not reachable: the lease ends by itself
            if time.monotonic() < self.sent + self.lease * GIVE_UP_AT:
                with contextlib.suppress(Exception):  # a store without conditional deletes:
                    self.obj.delete()  # our lease is live, so nobody else can hold it
