"""The lock of a study in a bucket (`calibtune.storage.hold_lock` on moto, 127.0.0.1) is a
lock: conditional writes make exactly one of racing drivers win and fence renewals and
takeovers; a holder that cannot renew stops its study before its lease can pass on; a store
that ignores preconditions is refused; a holder's liveness is judged only where its pid means
the same process.

The store sits behind a gate (a WSGI layer in front of moto's server, below everything calibtune
does) that serialises requests, as S3 applies a conditional write atomically where moto's
server checks and then writes, and can hang (a partition), slow PUTs down (a far store), drop the
precondition headers (a store without them) or run a write just before a conditional PUT."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _s3 import start_s3

from calibtune.storage import Storage, StorageError, StorageLockedError, hold_lock, open_storage
from calibtune.studyfile._studydir import StudyDir, StudyLockedError

BUCKET = "locks"
LEASE_S = 3.0


class Gate:
    """A WSGI layer in front of moto's server (see the module)."""

    def __init__(self, app: Any, serial: threading.Lock) -> None:
        self.app, self.serial = app, serial
        self.reset()

    def reset(self) -> None:
        self.hang = threading.Event()
        self.put_delay_s = 0.0
        self.ignore_conditions = False
        self.before_if_match: Callable[[], None] | None = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        method = environ["REQUEST_METHOD"]
        if self.hang.is_set():  # no answer until the partition ends, then an error
            while self.hang.is_set():
                time.sleep(0.02)
            start_response("503 Service Unavailable", [("Content-Length", "0")])
            return [b""]
        if method == "PUT":
            time.sleep(self.put_delay_s)
        if method == "PUT" and "HTTP_IF_MATCH" in environ and self.before_if_match is not None:
            hook, self.before_if_match = self.before_if_match, None
            hook()
        if self.ignore_conditions and method in ("PUT", "DELETE"):
            environ.pop("HTTP_IF_MATCH", None)
            environ.pop("HTTP_IF_NONE_MATCH", None)
        with self.serial:
            return list(self.app(environ, start_response))


class Stores:
    """Two endpoints of one moto store (its servers share their state): driver A reaches it
    through ``a`` and driver B through ``b``, so that A alone can be cut off."""

    def __init__(self) -> None:
        serial = threading.Lock()
        self.servers = [start_s3(), start_s3()]
        self.gates = []
        for s in self.servers:
            wsgi = s.server._server  # werkzeug's server reads ``.app`` at each request
            wsgi.app = Gate(wsgi.app, serial)
            self.gates.append(wsgi.app)
        self.servers[0].bucket(BUCKET)

    @property
    def a(self) -> Gate:
        return self.gates[0]

    def storage(self, uri: str, via: int, monkeypatch: pytest.MonkeyPatch) -> Storage:
        """``uri`` opened as a driver reaching the store through endpoint ``via`` would."""
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", self.servers[via].endpoint)
        return open_storage(uri)

    def record(self, key: str) -> dict[str, Any] | None:
        """The lock object's record, read through endpoint b (never cut off)."""
        if key not in self.servers[1].keys(BUCKET, key):
            return None
        body = self.servers[1].client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return json.loads(body)

    def write(self, key: str, record: dict[str, Any]) -> None:
        self.servers[1].client().put_object(Bucket=BUCKET, Key=key, Body=json.dumps(record))


@pytest.fixture(scope="module")
def stores() -> Iterator[Stores]:
    s = Stores()
    yield s
    for server in s.servers:
        server.stop()


@pytest.fixture
def env(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stores]:
    for k, v in stores.servers[0].env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("CALIBTUNE_LOCK_LEASE_S", str(LEASE_S))
    yield stores
    for gate in stores.gates:
        gate.hang.clear()
        gate.reset()


def _key() -> str:
    return f"{uuid.uuid4().hex[:8]}/.calibtune.lock"


def _this_machine() -> dict[str, Any]:
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return {
        "host": socket.gethostname(),
        "boot_id": boot,
        "pidns": os.stat("/proc/self/ns/pid").st_ino,
    }


def _ended_pid() -> int:
    """The pid of a process that has ended (a child, reaped)."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_racing_drivers_exactly_one_wins(env: Stores, monkeypatch) -> None:
    """Drivers starting together on a free lock, or on an expired one, one of them on a slow
    link (each of its PUTs takes 0.7 s: a far store, retries): exactly one holds it each round.
    Before, each wrote the object and read it back 0.5 s later, so that a PUT slower than that
    made two winners."""
    monkeypatch.setenv("CALIBTUNE_LOCK_LEASE_S", "30")  # no renewal is late in a round
    env.a.put_delay_s = 0.7
    drivers, rounds = 3, 6
    for n in range(rounds):
        key = _key()
        if n % 2:  # a lease its holder stopped renewing: taken over with If-Match
            env.write(key, {"pid": 1, "host": "gone", "since": 0, "token": "t", "expires": 1.0})
        slow = n % drivers  # reaches the store through the slow endpoint
        locks = [
            env.storage(f"s3://{BUCKET}/{key}", 0 if i == slow else 1, monkeypatch)
            for i in range(drivers)
        ]
        start, done = threading.Barrier(drivers), threading.Barrier(drivers)
        won: list[int] = []
        refused: list[dict[str, Any]] = []

        def driver(i: int, locks=locks, start=start, done=done, won=won, refused=refused):
            start.wait()
            try:
                with hold_lock(locks[i]):
                    won.append(i)
                    done.wait()
            except StorageLockedError as exc:
                refused.append(exc.holder or {})
                done.wait()

        threads = [threading.Thread(target=driver, args=(i,)) for i in range(drivers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(won) == 1 and len(refused) == drivers - 1, (n, won, refused)
        assert all(h.get("pid") == os.getpid() for h in refused)  # refused by the winner
        assert env.record(key) is None  # the winner released it


def test_outage_longer_than_the_lease_stops_the_holder_before_another_takes_it(
    env: Stores, monkeypatch
) -> None:
    """A's store stops answering for longer than the lease (its requests hang): A gives the lock
    up before its lease ends and before B can take it; once A's store answers again, A's
    renewals are refused (If-Match) and B keeps the lock. Before, A's heartbeat swallowed the
    failures, B took the lock, and then the object flipped between A's and B's tokens."""
    key = _key()
    a_lock = env.storage(f"s3://{BUCKET}/{key}", 0, monkeypatch)
    b_lock = env.storage(f"s3://{BUCKET}/{key}", 1, monkeypatch)
    lost: list[tuple[float, str]] = []
    a = hold_lock(a_lock, on_lost=lambda why: lost.append((time.time(), why)))
    a.__enter__()
    a_token = env.record(key)["token"]
    time.sleep(LEASE_S / 2)  # A renews through the store
    a_expires = env.record(key)["expires"]
    env.a.hang.set()
    b_at, refusals = None, 0
    while b_at is None:
        try:
            b = hold_lock(b_lock)
            b.__enter__()
            b_at = time.time()
        except StorageLockedError as exc:
            assert exc.holder["token"] == a_token
            refusals += 1
            time.sleep(0.1)
    assert refusals > 0 and len(lost) == 1
    (lost_at, why), b_token = lost[0], env.record(key)["token"]
    assert lost_at < a_expires <= b_at, (lost_at, a_expires, b_at)
    assert "lease not renewed" in why and "\n" not in why
    env.a.hang.clear()  # A's store answers again: A's renewals must not take the lock back
    for _ in range(int(LEASE_S / 2 / 0.1)):  # three of A's renewal periods
        assert env.record(key)["token"] == b_token
        time.sleep(0.1)
    a.__exit__(None, None, None)  # A's study stopped: its block ends, B's object stays
    assert env.record(key)["token"] == b_token and len(lost) == 1
    b.__exit__(None, None, None)
    assert env.record(key) is None


_PAUSED_DRIVER = """
import sys, threading
from calibtune.storage import hold_lock, open_storage
lost = threading.Event()
def stop(why):
    print("LOST", why, flush=True)
    lost.set()
with hold_lock(open_storage(sys.argv[1]), on_lost=stop):
    print("HELD", flush=True)
    lost.wait(120)
print("ENDED", flush=True)
"""


def test_a_driver_paused_past_its_lease_stops_when_it_wakes(env: Stores, monkeypatch) -> None:
    """The issue's case: a driver paused past its lease (SIGSTOP: a stopped VM, a long GC
    pause) while a second takes the study over; when it wakes it stops at once and never writes
    the lock again. Before, both drove the study to the end."""
    import signal

    key = _key()
    uri = f"s3://{BUCKET}/{key}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", env.servers[0].endpoint)
    a = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_DRIVER, uri], stdout=subprocess.PIPE, text=True
    )
    try:
        assert a.stdout.readline().strip() == "HELD"
        a_token = env.record(key)["token"]
        os.kill(a.pid, signal.SIGSTOP)
        lock = env.storage(uri, 1, monkeypatch)
        while True:
            try:
                b = hold_lock(lock)
                b.__enter__()
                break
            except StorageLockedError as exc:
                assert exc.holder["token"] == a_token
                time.sleep(0.1)
        b_token = env.record(key)["token"]
        os.kill(a.pid, signal.SIGCONT)
        out, _ = a.communicate(timeout=30)
        assert a.returncode == 0 and out.startswith("LOST ") and out.endswith("ENDED\n"), out
        assert env.record(key)["token"] == b_token  # A wrote nothing after it woke
        b.__exit__(None, None, None)
    finally:
        a.kill()
        a.wait()
    assert env.record(key) is None


def test_takeover_of_an_expired_lease_is_fenced_by_its_etag(env: Stores, monkeypatch) -> None:
    """B reads an expired lease; its holder renews it before B's write lands: B's If-Match
    fails and B is refused, naming the holder. Without a renewal in between, B takes it over."""
    key = _key()
    old = {"pid": 1, "host": "elsewhere", "since": 0, "token": "a", "expires": time.time() - 1}
    env.write(key, old)
    renewed = {**old, "expires": time.time() + 60}
    env.a.before_if_match = lambda: env.write(key, renewed)
    lock = env.storage(f"s3://{BUCKET}/{key}", 0, monkeypatch)
    with pytest.raises(StorageLockedError) as info, hold_lock(lock):
        pass
    assert info.value.holder["token"] == "a" and env.record(key) == renewed
    env.write(key, old)  # expired again, nobody renews it now
    with hold_lock(lock):
        assert env.record(key)["pid"] == os.getpid()
    assert env.record(key) is None


def test_a_store_ignoring_preconditions_is_refused(env: Stores, monkeypatch) -> None:
    """A store that accepts a conditional write whose condition fails cannot fence a lease: it
    is refused in one line, a study's lock too (a ValueError: exit 2 before anything starts),
    and a live holder's object there is left as it was."""
    env.a.ignore_conditions = True
    key = _key()
    lock = env.storage(f"s3://{BUCKET}/{key}", 0, monkeypatch)
    with pytest.raises(StorageError) as info, hold_lock(lock):
        pass
    line = str(info.value)
    assert "expected a store that refuses a conditional write" in line and "\n" not in line
    assert env.record(key) is None  # nothing left behind
    sd = StudyDir.at("unfenced", env.storage(f"s3://{BUCKET}/studies", 0, monkeypatch))
    with pytest.raises(ValueError, match="conditional write"), sd.lock():
        pass
    live = {"pid": 1, "host": "elsewhere", "since": 0, "token": "a", "expires": time.time() + 60}
    env.write(key, live)
    with pytest.raises(StorageLockedError), hold_lock(lock):
        pass
    assert env.record(key) == live


def test_a_holder_is_declared_ended_only_where_its_pid_means_it(env: Stores, monkeypatch) -> None:
    """An ended holder of this host, boot and PID namespace frees the lock at once (so does a
    pid reused by a later process); one of another PID namespace (a container sharing the host
    name) or an older record without one keeps it until its lease ends, and the refusal says
    when."""
    me, gone = _this_machine(), _ended_pid()
    ends = time.time() + 600
    sd = StudyDir.at("held", env.storage(f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}", 0, monkeypatch))
    key = sd.path.path.split("/", 1)[1] + "/.calibtune.lock"
    base = {**me, "since": 0, "token": "a", "expires": ends}
    for freed in ({"pid": gone}, {"pid": os.getpid(), "pid_start": 1}):
        env.write(key, {**base, **freed})
        with sd.lock():
            assert env.record(key)["token"] != "a"
    container = {**base, "pid": gone, "pidns": me["pidns"] + 1}
    older = {"pid": gone, "host": me["host"], "since": 0, "token": "a", "expires": ends}
    for held in (container, older):
        env.write(key, held)
        with pytest.raises(StudyLockedError) as info, sd.lock():
            pass
        line = str(info.value)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ends))
        assert f"pid {gone} on {me['host']}" in line and f"lease ends at {when}" in line, line
        assert "\n" not in line and env.record(key) == held
    assert "another boot or PID namespace" in line


def test_a_lost_lease_stops_the_study_the_way_a_full_disk_does(env: Stores, monkeypatch) -> None:
    """A study's lock that cannot be renewed notes the study's stop (one line, state saved,
    `calibtune resume`), and the storage guard on Tune's loop sends Tune's graceful stop
    (SIGUSR1) at its next step, as for a full disk; the block ends without an error."""
    import signal

    from calibtune.study._progress import _storage_guard
    from calibtune.studyfile._diskfull import stop_reason, storage_full

    sd = StudyDir.at("stops", env.storage(f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}", 0, monkeypatch))
    guard = _storage_guard(sd.path)
    signals: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: signals.append(signum))
    try:
        with sd.lock():
            env.a.hang.set()
            deadline = time.monotonic() + 4 * LEASE_S
            while not storage_full(sd.path) and time.monotonic() < deadline:
                time.sleep(0.05)
            guard.on_step_begin(0, [])  # Tune's next step
            guard.on_step_begin(1, [])  # and the one after: one stop only
            env.a.hang.clear()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert signals == [signal.SIGUSR1]
    line = stop_reason(sd.path)
    assert line is not None and line.startswith("study stops: s3://") and "\n" not in line
    assert "lease not renewed" in line and f"calibtune resume {sd.path}" in line
