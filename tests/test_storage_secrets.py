"""No credential is pickled, logged or written by the storage owner (issue 41), small objects
go as one PUT, and a location is named in one way only.

The S3-compatible server is moto's (`tests/_s3.py` starts the same one), here with a log of the
requests it answers and, as moto 5.2.1 does, a failed ``CompleteMultipartUpload`` answered
inside a 200: a client that opens a multipart upload for a small object fails its write there.
moto checks no signature, so a planted ``AWS_SECRET_ACCESS_KEY`` works and is found wherever it
was copied: every object of the bucket, the MLflow store (its SQLite file and artifact folder),
the run's log and Ray's session folder are scanned for it.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from _s3 import S3Server, bucket_study, start_s3

from calibtune.cli import main
from calibtune.storage import StorageError, open_storage

PLANTED = f"calibtune-planted-{uuid.uuid4().hex}"  # a secret no file has by chance

# what moto 5.2.1 answers a CompleteMultipartUpload: an error inside a 200
_COMPLETE_FAILS = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)


@dataclass
class _Logged(S3Server):
    requests: list[tuple[str, str, str]] = field(default_factory=list)

    def multipart(self, since: int = 0) -> list[tuple[str, str, str]]:
        """Requests from number ``since`` on that belong to a multipart upload (create, part,
        complete)."""
        return [r for r in self.requests[since:] if "uploads" in r[2] or "uploadId=" in r[2]]


def _start_logged() -> _Logged:
    """moto's server behind a middleware that logs each request and answers
    CompleteMultipartUpload as moto 5.2.1 did."""
    log: list[tuple[str, str, str]] = []

    def wrap(moto_app: Any) -> Any:
        def app(environ: dict[str, Any], start: Any) -> Any:
            method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
            log.append((method, environ.get("PATH_INFO", ""), query))
            if method == "POST" and "uploadId=" in query:
                start("200 OK", [("Content-Type", "application/xml")])
                return [_COMPLETE_FAILS]
            return moto_app(environ, start)

        return app

    server = start_s3(wrap)
    return _Logged(server.server, server.endpoint, log)


@pytest.fixture(scope="module")
def s3() -> _Logged:
    server = _start_logged()
    server.bucket("calib")
    yield server
    server.stop()


@pytest.fixture
def planted(s3: _Logged, monkeypatch: pytest.MonkeyPatch) -> _Logged:
    """This process's environment: the server, with a planted secret key and session token."""
    env = {**s3.env(), "AWS_SECRET_ACCESS_KEY": PLANTED, "AWS_SESSION_TOKEN": PLANTED + "tok"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return s3


def test_a_storage_pickles_no_credential_and_still_works(planted: _Logged) -> None:
    """Today's code passed the keys to ``S3FileSystem``, which pickles them: Ray Tune wrote them
    into tuner.pkl and the experiment state. From the SDK's chain, the unpickled copy reads the
    environment of the process that uses it."""
    import cloudpickle

    where = open_storage(f"s3://calib/{uuid.uuid4().hex[:8]}")
    for data in (pickle.dumps(where), cloudpickle.dumps(where), pickle.dumps(where.fs)):
        assert PLANTED.encode() not in data
    assert PLANTED not in repr(where) + str(where)
    back = pickle.loads(pickle.dumps(where))
    (back / "x.txt").write_text("through the unpickled copy")
    assert (where / "x.txt").read_text() == "through the unpickled copy"


def test_small_objects_are_one_put(planted: _Logged) -> None:
    """A lock object, a state file and a small checkpoint stream go as one PutObject each: no
    multipart upload, which this server (as moto 5.2.1) fails at CompleteMultipartUpload.
    Today's code opened a multipart upload for each, and each write failed here."""
    import torch

    where = open_storage(f"s3://calib/{uuid.uuid4().hex[:8]}")
    before = len(planted.requests)
    (where / ".calibtune.lock").write_text('{"pid": 1}')
    (where / "state.json").write_bytes(b"{}")
    with (where / "epoch_000001" / "state.pt").open_output() as out:
        torch.save({"w": torch.ones(3)}, out)
    writes = [r for r in planted.requests[before:] if r[0] in ("PUT", "POST")]
    assert [(m, q) for m, _, q in writes] == [("PUT", "")] * 3, writes
    assert (where / ".calibtune.lock").read_text() == '{"pid": 1}'
    with (where / "epoch_000001" / "state.pt").open_input() as f:
        assert torch.load(f, weights_only=True)["w"].sum() == 3


@pytest.mark.parametrize("given", ["s3:/calib/x", "s3:calib/x", "gs:/b/x", "file:/tmp/x", "a:b"])
def test_a_scheme_without_slashes_is_refused(tmp_path, capsys, monkeypatch, given) -> None:
    """Today's code made each a local folder (``./s3:/calib/x``) and ran the study there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(_study_raw("bare", tmp_path, "unused")))
    capsys.readouterr()
    try:
        code = main(["run", "s.yaml", "--storage", given])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--storage: expected SCHEME://… (s3://BUCKET/PREFIX" in err[0] and repr(given) in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # nothing written
    assert open_storage("./" + given).local_path() == tmp_path / given  # its local spelling


@pytest.mark.parametrize(
    ("given", "phrase"),
    [
        (f"s3://calib/x?endpoint_override=h:1&secret_key={PLANTED}", "without ?query or #frag"),
        ("s3://calib/x#part", "without ?query or #fragment"),
        (f"s3://AKIA:{PLANTED}@calib/x", "without credentials"),
        ("gs://someone@calib/x", "without credentials"),
        (f"hdfs://user:{PLANTED}@namenode:8020/x", "without credentials"),
    ],
    ids=["query", "fragment", "s3-keys", "gs-user", "hdfs-password"],
)
def test_query_and_credentials_in_a_uri_are_refused(given: str, phrase: str) -> None:
    """A query was dropped by `Storage.uri` (the study then named another store), and pyarrow
    reads keys from a query or user part, which it pickles. Refused, the secret not echoed."""
    with pytest.raises(StorageError) as info:
        open_storage(given, "--storage")
    assert str(info.value).startswith(f"--storage: expected a URI {phrase}")
    assert PLANTED not in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------------ a study, scanned


def _study_raw(name: str, tmp: Path, storage: str) -> dict[str, Any]:
    return bucket_study(name, tmp, storage)


def _holding(root: Path, secret: bytes) -> list[str]:
    found = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            try:
                if secret in p.read_bytes():
                    found.append(str(p))
            except OSError:  # a socket, a file Ray removed meanwhile
                continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_study_in_a_bucket_writes_no_secret_anywhere(s3: _Logged, tmp_path: Path) -> None:
    """A 2-trial study on ``s3://`` with a planted secret key, run as a user runs it: no
    object of the bucket, nothing of the MLflow store, its log and Ray's session folder hold
    the secret, and no multipart upload was opened (this server fails them). Today's code wrote
    the key into 4 objects of the bucket, experiment_state-*.json among them."""
    name = "secrets"
    (tmp_path / f"{name}.yaml").write_text(
        yaml.safe_dump(_study_raw(name, tmp_path, "s3://calib/studies"), sort_keys=False)
    )
    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths are limited
    env = {
        **os.environ,
        **s3.env(),
        "AWS_SECRET_ACCESS_KEY": PLANTED,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "RAY_TMPDIR": ray_tmp,
        "CALIBTUNE_MIN_FREE_MB": "8",
    }
    env.pop("AWS_ENDPOINT_URL", None)
    before = len(s3.requests)
    try:
        with (tmp_path / "run.log").open("w") as log:
            done = subprocess.run(
                [sys.executable, "-m", "calibtune", "run", f"{name}.yaml", "--verbose"],
                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=540,
            )  # fmt: skip
        assert done.returncode == 0, (tmp_path / "run.log").read_text()[-3000:]
        keys = s3.keys("calib", f"studies/{name}/")
        assert f"studies/{name}/tuner.pkl" in keys and any("experiment_state" in k for k in keys)
        client = s3.client()
        leaked = [
            k
            for k in keys
            if PLANTED.encode() in client.get_object(Bucket="calib", Key=k)["Body"].read()
        ]
        assert leaked == []
        assert _holding(tmp_path, PLANTED.encode()) == []  # mlflow.db, mlruns/, run.log, cache
        assert _holding(Path(ray_tmp), PLANTED.encode()) == []  # Ray's logs and session files
        assert s3.multipart(before) == []
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
