"""The storage owner (`calibtune.storage`) on the local disk and on an S3-compatible server
(moto on 127.0.0.1): atomic writes, listing, streams for checkpoints, locks, URI resolution,
and `calibtune run --storage s3://…` checked before anything starts."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import yaml
from _s3 import S3Server, start_s3

from calibtune.readers._ui import free_port
from calibtune.storage import (
    Storage,
    StorageError,
    StorageLockedError,
    hold_lock,
    open_storage,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def s3() -> S3Server:
    server = start_s3()
    server.bucket("unit")
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return s3


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return open_storage(tmp_path / "store")
    request.getfixturevalue("s3_env")
    return open_storage(f"s3://unit/{uuid.uuid4().hex[:8]}")


def test_write_read_list_delete(where: Storage) -> None:
    f = where / "a" / "b.json"
    assert not f.exists() and where.listdir() == []
    f.write_text('{"x": 1}')
    (where / "top.txt").write_bytes(b"\x00\x01")
    assert json.loads(f.read_text()) == {"x": 1}
    assert (where / "top.txt").read_bytes() == b"\x00\x01"
    assert where.listdir() == ["a", "top.txt"]
    assert (where / "a").is_dir() and f.is_file() and not (where / "a").is_file()
    assert [s.name for s in where.glob("*.txt")] == ["top.txt"]
    (where / "a").delete()
    assert not f.exists() and where.listdir() == ["top.txt"]
    with pytest.raises(FileNotFoundError):
        (where / "none").read_bytes()


def test_failed_write_keeps_the_previous_file(where: Storage) -> None:
    f = where / "state.json"
    f.write_text("old")
    with pytest.raises(RuntimeError, match="writer died"), f.open_output() as out:
        out.write(b"half of the new")
        raise RuntimeError("writer died")
    assert f.read_text() == "old"
    assert where.listdir() == ["state.json"]  # no temp file left beside it


def test_checkpoint_streams_round_trip(where: Storage) -> None:
    state = {"w": torch.arange(6.0).reshape(2, 3), "epoch": 3}
    with (where / "epoch_000003" / "state.pt").open_output() as out:
        torch.save(state, out)
    with (where / "epoch_000003" / "state.pt").open_input() as f:
        back = torch.load(f, weights_only=True)
    assert back["epoch"] == 3 and torch.equal(back["w"], state["w"])


def test_lock_refuses_a_second_holder_and_is_free_after(where: Storage) -> None:
    lock = where / ".calibtune.lock"
    with hold_lock(lock):
        with pytest.raises(StorageLockedError) as info, hold_lock(lock):
            pass
        assert info.value.holder["pid"] == os.getpid()
    with hold_lock(lock):
        pass


def test_lease_lock_expires_and_is_renewed(s3_env: S3Server, monkeypatch) -> None:
    monkeypatch.setenv("CALIBTUNE_LOCK_LEASE_S", "3")
    lock = open_storage(f"s3://unit/{uuid.uuid4().hex[:8]}/.calibtune.lock")
    dead = {"pid": 1, "host": "gone", "since": 0, "token": "t", "expires": time.time() - 1}
    lock.write_text(json.dumps(dead))
    with hold_lock(lock):  # a lease its dead holder stopped renewing is free
        time.sleep(4)  # longer than the lease: the heartbeat keeps it
        with pytest.raises(StorageLockedError), hold_lock(lock):
            pass
    assert not lock.exists()  # released: the object is gone
    alive = {**dead, "expires": time.time() + 60}
    lock.write_text(json.dumps(alive))
    with pytest.raises(StorageLockedError) as info, hold_lock(lock):
        pass
    assert info.value.holder["host"] == "gone"


def test_uris_resolve_to_their_file_system(s3_env: S3Server, tmp_path: Path) -> None:
    bucket = open_storage("s3://unit/studies/")
    assert (bucket.scheme, bucket.path, bucket.uri) == ("s3", "unit/studies", "s3://unit/studies")
    assert type(bucket.fs).__name__ == "S3FileSystem" and not bucket.is_local
    with pytest.raises(StorageError, match="expected a local path here"):
        os.fspath(bucket)  # never silently a local folder named 's3:'
    local = open_storage(f"file://{tmp_path}/x")
    assert local.is_local and local.local_path() == tmp_path / "x"
    assert open_storage("rel/dir").path == os.path.abspath("rel/dir")
    with pytest.raises(StorageError, match=r"^--storage: expected a local path or a URI"):
        open_storage("ftp://host/x", "--storage")
    with pytest.raises(StorageError, match=r"expected s3://BUCKET"):
        open_storage("s3:///x", "--storage")
    path, fs = bucket.ray_args()
    assert path == "unit/studies" and pickle.loads(pickle.dumps(fs)) == fs


def test_unreachable_or_missing_bucket_is_one_line(s3_env: S3Server, monkeypatch) -> None:
    with pytest.raises(StorageError, match=r"^--storage: expected an existing bucket 'nope'"):
        open_storage("s3://nope/x").check_reachable("--storage")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    with pytest.raises(StorageError, match=r"^--storage: expected a reachable store at s3://"):
        open_storage("s3://unit/x").check_reachable("--storage")
    assert time.monotonic() - t0 < 30


def _study(tmp: Path, **search) -> Path:
    raw = {
        "name": "bucketed",
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 64},
        },
        "losses": ["cross_entropy"],
        "search": {"sampler": "random", "num_samples": 1, **search},
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}"},
    }
    path = tmp / "bucketed.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _calibtune(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "calibtune", *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_run_refuses_an_unusable_bucket_before_anything_starts(s3: S3Server, tmp_path) -> None:
    """Today's code made `s3://…` a local folder literally named ``s3:`` and ran the study."""
    study = _study(tmp_path)
    cases = [
        ("s3://nope/studies", "--storage: expected an existing bucket 'nope'"),
        ("ftp://host/studies", "--storage: expected a local path or a URI pyarrow opens"),
    ]
    for uri, line in cases:
        proc = _calibtune(["run", str(study), "--storage", uri], tmp_path, s3.env())
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.strip().count("\n") == 0 and line in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bucketed.yaml"]  # nothing written
    assert s3.keys("unit", "studies") == []


def test_lease_of_an_ended_holder_on_this_host_is_stale_at_once(s3_env: S3Server) -> None:
    """A driver SIGKILLed and resumed on the same machine need not wait for its lease."""
    import socket

    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    lock = open_storage(f"s3://unit/{uuid.uuid4().hex[:8]}/.calibtune.lock")
    held = {"pid": int(ended.stdout), "host": socket.gethostname(), "since": 0, "token": "t"}
    with open("/proc/sys/kernel/random/boot_id") as f:  # the same boot and PID namespace
        held |= {"boot_id": f.read().strip(), "pidns": os.stat("/proc/self/ns/pid").st_ino}
    lock.write_text(json.dumps({**held, "expires": time.time() + 600}))
    with hold_lock(lock):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
