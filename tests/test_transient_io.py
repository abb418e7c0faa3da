"""A storage hiccup inside a trial is retried from its last checkpoint, not failed for good
(issue 41, section 4; `calibtune.trial._errors.transient_io`, `calibtune.study._scheduling`).

The classifier is checked on the exceptions that really arrive: pyarrow's S3 file system and a
boto3 client talking to a local HTTP server that answers 503 SlowDown, 400 ExpiredToken or
resets the connection (their own exception chains, nothing built by hand), an ECONNRESET
wrapped in other exceptions, an NFS stale handle; a full disk and bad input are never hiccups.
The end-to-end test runs a real study whose trial hits ECONNRESET once where its checkpoint is
written (a failpoint) and finishes with every epoch once.
"""

from __future__ import annotations

import errno
import http.server
import json
import os
import socket
import socketserver
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from calibtune.study._scheduling import retryable
from calibtune.training import NonFiniteLossError, Progress
from calibtune.trial import _errors
from calibtune.trial._errors import TransientIOError, TrialStepError, failure, transient_io

ROOT = Path(__file__).resolve().parents[1]


class _Store(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint that fails every request the way ``server.mode`` says."""

    def _answer(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        if size:
            self.rfile.read(size)
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "reset":  # RST instead of FIN: the client reads ECONNRESET
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            return
        status, code = {
            "slowdown": (503, "SlowDown"),
            "expired": (400, "ExpiredToken"),
            "denied": (403, "AccessDenied"),
        }[mode]
        body = (
            f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
            f"<Message>{code} here</Message><RequestId>1</RequestId></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def store() -> Iterator[socketserver.ThreadingTCPServer]:
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Store)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _pyarrow_error(store: socketserver.ThreadingTCPServer, mode: str) -> OSError:
    """What pyarrow's S3 file system raises when it writes an object to ``store`` in ``mode``."""
    from pyarrow import fs

    store.mode = mode  # type: ignore[attr-defined]
    s3 = fs.S3FileSystem(
        endpoint_override=f"127.0.0.1:{store.server_address[1]}",
        scheme="http",
        access_key="a",
        secret_key="b",
        region="us-east-1",
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    with pytest.raises(OSError) as info, s3.open_output_stream("bucket/ckpt/state.pt") as out:
        out.write(b"x")
    return info.value


def _boto_error(store: socketserver.ThreadingTCPServer, mode: str) -> Exception:
    """What a boto3 S3 client raises when it puts an object to ``store`` in ``mode``."""
    import boto3
    import botocore.config

    store.mode = mode  # type: ignore[attr-defined]
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{store.server_address[1]}",
        aws_access_key_id="a",
        aws_secret_access_key="b",
        region_name="us-east-1",
        config=botocore.config.Config(retries={"max_attempts": 1, "mode": "standard"}),
    )
    with pytest.raises(Exception) as info:
        client.put_object(Bucket="bucket", Key="ckpt/state.pt", Body=b"x")
    return info.value


@pytest.mark.parametrize("mode", ["slowdown", "expired", "reset"])
def test_real_pyarrow_s3_hiccups_are_transient(store, mode: str) -> None:
    err = _pyarrow_error(store, mode)
    assert err.errno is None  # pyarrow says it in text only ("AWS Error SLOW_DOWN during ...")
    assert transient_io(err), str(err)
    wrapped = RuntimeError("checkpoint upload failed")
    wrapped.__cause__ = err  # as Ray Train re-raises a failed persist
    assert transient_io(wrapped)


@pytest.mark.parametrize("mode", ["slowdown", "expired", "reset"])
def test_real_botocore_hiccups_are_transient(store, mode: str) -> None:
    err = _boto_error(store, mode)
    assert transient_io(err), repr(err)


@pytest.mark.parametrize("client", [_pyarrow_error, _boto_error])
def test_access_denied_is_not_a_hiccup(store, client) -> None:
    err = client(store, "denied")
    assert "AccessDenied" in str(err) or "ACCESS_DENIED" in str(err)
    assert not transient_io(err)


def _raised(make) -> BaseException:
    try:
        make()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing raised")


def _nested(inner: BaseException) -> BaseException:
    """``inner`` three levels down: raised from, then raised while handling."""

    def level1() -> None:
        raise inner

    def level2() -> None:
        try:
            level1()
        except OSError as exc:
            raise RuntimeError("persisting the checkpoint failed") from exc

    def level3() -> None:
        try:
            level2()
        except RuntimeError:
            raise KeyError("report")  # noqa: B904 (implicitly chained, as a bug in a handler is)

    return _raised(level3)


def test_classified_by_the_innermost_io_error() -> None:
    reset = _nested(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"))
    assert isinstance(reset, KeyError) and transient_io(reset)
    assert transient_io(_nested(OSError(errno.ESTALE, "Stale file handle")))
    assert transient_io(_nested(TimeoutError("timed out")))
    assert not transient_io(_nested(PermissionError(errno.EACCES, "Permission denied")))
    assert not transient_io(_nested(FileNotFoundError(errno.ENOENT, "No such file")))
    assert not transient_io(RuntimeError("a bug"))
    assert not transient_io(KeyError("x"))


def test_a_full_disk_is_never_a_hiccup() -> None:
    full = OSError(errno.ENOSPC, "No space left on device")
    assert not transient_io(_nested(full))
    assert not transient_io(OSError(errno.EDQUOT, "Disk quota exceeded"))
    # a reset while handling the full disk's error: the disk stays full
    late = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    late.__context__ = full
    assert not transient_io(late)
    text = OSError("When uploading part for key 'k': [Errno 28] No space left on device")
    assert not transient_io(text)


def _fail(exc: BaseException, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> BaseException:
    from calibtune.storage import open_storage

    slept: list[float] = []
    monkeypatch.setattr(_errors.time, "sleep", slept.append)
    progress = Progress()
    out = failure(exc, progress, open_storage(tmp), 0, [])
    out.slept = slept  # type: ignore[attr-defined]
    return out


def test_failure_returns_a_retried_error_after_a_growing_backoff(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_errors.random, "random", lambda: 1.0)
    err = _nested(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"))
    first, second = (_fail(err, tmp_path, monkeypatch) for _ in range(2))
    assert type(first) is TransientIOError and isinstance(first, TrialStepError)
    assert "KeyError" in str(first)  # the one line names the error the trial saw
    assert first.slept == [2.0] and second.slept == [4.0]  # type: ignore[attr-defined]
    hiccups = (tmp_path / "artifacts" / _errors.HICCUPS_FILE).read_text().splitlines()
    assert len(hiccups) == 2 and "KeyError" in hiccups[0]
    assert (tmp_path / "artifacts" / "error.txt").is_file()
    # the scheduler retries it by its name in the error's text (what Tune records)
    assert retryable(f"Traceback ...\ncalibtune.trial._errors.TransientIOError: {first}")


def test_own_errors_stay_own(tmp_path, monkeypatch) -> None:
    bad = ValueError("train.batch_size: expected <= 1000, got 5000")
    bad.__context__ = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    assert _fail(bad, tmp_path, monkeypatch) is bad  # a ValueError stays the trial's own
    nan = NonFiniteLossError("non-finite loss at epoch 2, step 3")
    assert _fail(nan, tmp_path, monkeypatch) is nan
    full = _fail(_nested(OSError(errno.ENOSPC, "No space left on device")), tmp_path, monkeypatch)
    assert type(full) is TrialStepError and not full.slept  # type: ignore[attr-defined]
    bug = _fail(_nested(PermissionError(errno.EACCES, "denied")), tmp_path, monkeypatch)
    assert type(bug) is TrialStepError
    assert not retryable(f"calibtune.trial._errors.TrialStepError: {bug}")
    assert not (tmp_path / "artifacts" / _errors.HICCUPS_FILE).exists()


# ------------------------------------------------------------------------------ end to end


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_checkpoint_write_reset_once_is_retried_and_the_trial_finishes(tmp_path: Path) -> None:
    """ECONNRESET where epoch 2's checkpoint is written: the trial is retried from epoch 1's
    checkpoint and finishes with its history intact; before, it failed for good (exit 1)."""
    from mlflow.tracking import MlflowClient

    raw = {
        "name": "hiccup",
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "train": {"epochs": 3, "batch_size": 64, "checkpoint_every": 1},
            "eval": {"posthoc": ["ts"], "figures": False},
        },
        "losses": ["cross_entropy"],
        "search": {"num_samples": 1, "max_concurrent": 1, "objectives": ["val/ece"]},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "hiccup"},
        "storage": str(tmp_path / "studies"),
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBTUNE_FAILPOINT")}
    env |= {
        "CALIBTUNE_FAILPOINT": "epoch_end:2",
        "CALIBTUNE_FAILPOINT_RAISE": "ECONNRESET",
        "CALIBTUNE_FAILPOINT_DIR": str(tmp_path),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "calibtune", "run", "s.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert (tmp_path / "epoch_end.hit").is_file()  # the hiccup happened
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "retried from its last checkpoint" in proc.stdout
    (trial,) = (tmp_path / "studies" / "hiccup" / "trials").glob("*-seed*")
    result = json.loads((trial / "result.json").read_text())
    assert [int(h["epoch"]) for h in result["history"]] == [1, 2, 3]
    assert result["resumed_from_epoch"] == 1  # from epoch 1's checkpoint, not from scratch
    hiccups = (trial / "artifacts" / _errors.HICCUPS_FILE).read_text().splitlines()
    assert len(hiccups) == 1 and "Connection reset by peer" in hiccups[0]
    client = MlflowClient(raw["tracking"]["uri"])
    exp = client.get_experiment_by_name("hiccup")
    (run,) = [
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("calibtune.kind") == "trial"
    ]
    assert run.data.tags["calibtune.status"] == "finished"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "val/ece")]
    assert sorted(steps) == [1, 2, 3]  # every epoch logged once
