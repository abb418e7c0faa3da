"""The full-disk adapter (`calibtune.studyfile._diskfull`) on its own: Tune's storage file system
keeps the last complete file when a write hits ENOSPC, and says so; Ray's consequent log lines
are dropped; the stop is one line with exit code 75. The study-level fault test (a real tmpfs
filled mid-study, then `resume`) is `tests/test_faults.py`."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow.fs as pafs
import pytest

from calibtune.storage import _atomic as A
from calibtune.studyfile import _diskfull as D


@pytest.fixture(autouse=True)
def _fresh_state():
    yield
    A._FULL.clear()
    D._STOPPED.clear()


def _tree(src: Path, size: int) -> None:
    (src / "trial").mkdir(parents=True, exist_ok=True)
    (src / "experiment_state.json").write_text("s" * size)
    (src / "trial" / "error.pkl").write_bytes(b"e" * 10)


def _enospc_after(monkeypatch, limit: int) -> None:
    """``os.write`` fails with ENOSPC once ``limit`` bytes were written (a disk filling up)."""
    real, written = os.write, [0]

    def write(fd: int, data) -> int:
        if written[0] + len(data) > limit:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written[0] += len(data)
        return real(fd, data)

    monkeypatch.setattr(D.os, "write", write)


def _settled(folder: Path) -> list[str]:
    """The names under ``folder`` once pyarrow's copy threads are done: ``copy_files`` returns
    at the first failed file while the others still finish (each one atomically)."""
    deadline = time.monotonic() + 10
    while any(p.name.endswith(".tmp") for p in folder.rglob("*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(p.name for p in folder.rglob("*"))


def test_a_failed_copy_keeps_the_last_complete_files_and_is_noted(tmp_path, monkeypatch):
    src, dst = tmp_path / "staging", tmp_path / "storage" / "study"
    fs = D.atomic_filesystem()
    _tree(src, 1000)
    pafs.copy_files(str(src), str(dst), destination_filesystem=fs)
    assert (dst / "experiment_state.json").read_text() == "s" * 1000
    assert not D.storage_full(dst)

    _tree(src, 5000)
    _enospc_after(monkeypatch, 2000)
    with pytest.raises(OSError, match="No space left on device"):
        pafs.copy_files(str(src), str(dst), destination_filesystem=fs)
    assert (dst / "experiment_state.json").read_text() == "s" * 1000  # never a partial one
    assert (dst / "trial" / "error.pkl").read_bytes() == b"e" * 10
    assert _settled(dst) == ["error.pkl", "experiment_state.json", "trial"]  # no temp files
    assert D.storage_full(dst) and D.storage_full(dst.parent) and not D.storage_full(src)

    monkeypatch.undo()  # space freed: the next save lands whole
    pafs.copy_files(str(src), str(dst), destination_filesystem=fs)
    assert (dst / "experiment_state.json").read_text() == "s" * 5000


def test_the_file_system_pickles_and_reads_like_the_local_one(tmp_path):
    fs = pickle.loads(pickle.dumps(D.atomic_filesystem()))  # it travels in Tune's tuner.pkl
    assert fs == D.atomic_filesystem()
    with fs.open_output_stream(str(tmp_path / "a.bin")) as f:
        f.write(b"abc" * 100_000)
    with fs.open_input_stream(str(tmp_path / "a.bin")) as f:
        assert f.read() == b"abc" * 100_000
    fs.copy_file(str(tmp_path / "a.bin"), str(tmp_path / "b.bin"))
    assert (tmp_path / "b.bin").read_bytes() == b"abc" * 100_000
    info = fs.get_file_info(pafs.FileSelector(str(tmp_path)))
    assert sorted(Path(i.path).name for i in info) == ["a.bin", "b.bin"]


@pytest.mark.parametrize(
    ("text", "full"),
    [
        ("OSError: [Errno 28] No space left on device", True),
        ("OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28]", True),
        ("(sqlite3.OperationalError) database or disk is full", True),
        ("OSError: [Errno 122] Disk quota exceeded", True),
        ("ValueError: non-finite loss at epoch 3", False),
        ("", False),
        (None, False),
    ],
)
def test_disk_full_text(text, full):
    assert D.disk_full_text(text) is full


def test_the_stop_line_names_the_folder_and_the_free_space(tmp_path):
    line = D.full_message(tmp_path)
    free = shutil.disk_usage(tmp_path).free / 1024**2
    assert line == (
        f"storage {tmp_path} is full ({free:.1f} MiB free): the study stopped; free space and "
        f"run 'calibtune resume {tmp_path}'"
    )


def test_ray_and_mlflow_lines_caused_by_the_full_disk_are_dropped():
    keep = D._DiskFullFilter()

    def record(name: str, msg: str, exc: BaseException | None = None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc else None
        return logging.LogRecord(name, logging.ERROR, "f.py", 1, msg, (), info)

    enospc = OSError(errno.ENOSPC, "No space left on device")
    assert not keep.filter(record("ray.tune.execution.tune_controller", "Trial failed", enospc))
    assert keep.filter(record("ray.tune.execution.tune_controller", "Trial failed", KeyError()))
    assert not keep.filter(record("mlflow.store.db.utils", "(sqlite3) database or disk is full"))
    assert keep.filter(record("mlflow.store.db.utils", "UNIQUE constraint failed"))
    assert keep.filter(record("calibtune", "No space left on device"))  # ours say it themselves
    D._STOPPED["/x"] = "storage /x is full"  # once stopped, Ray's consequences all go
    assert not keep.filter(record("ray.tune.tune", "Trials did not complete: [a, b]"))


def test_storage_full_exit_code_and_one_line(tmp_path, capsys):
    from calibtune.commands._run import _exit_code

    line = D.full_message(tmp_path)
    outcome = SimpleNamespace(storage_full=True, stopped_by=line, storage=tmp_path)
    assert _exit_code(outcome, "resume") == 75
    assert capsys.readouterr().err == f"calibtune resume: {line}\n"


@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs root and unshare for a private tmpfs",
)
def test_a_real_full_tmpfs_keeps_the_old_file(tmp_path):
    """The same on a real 1 MiB tmpfs filled to the last byte (no simulated ENOSPC)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = textwrap.dedent(
        f"""
        import pyarrow.fs as pafs
        from pathlib import Path
        from calibtune.studyfile import _diskfull as D
        fs, src, dst = D.atomic_filesystem(), Path({str(tmp_path / "src")!r}), Path({str(mnt)!r})
        src.mkdir()
        fs.create_dir(str(dst / "s"), recursive=True)
        (src / "state.json").write_text("a" * 100_000)
        pafs.copy_files(str(src), str(dst / "s"), destination_filesystem=fs)
        with open(dst / "filler", "wb") as f:
            try:
                while True:
                    f.write(bytes(65536)); f.flush()
            except OSError:
                pass
        (src / "state.json").write_text("b" * 300_000)
        try:
            pafs.copy_files(str(src), str(dst / "s"), destination_filesystem=fs)
        except OSError as e:
            print("failed", D.disk_full_text(str(e)))
        import gc; gc.collect()
        state = dst / "s" / "state.json"
        names = sorted(p.name for p in (dst / "s").iterdir())
        print(names, state.read_text()[:1], state.stat().st_size, D.storage_full(dst))
        """
    )
    res = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f'mount -t tmpfs -o size=1m tmpfs {mnt} && exec "$0" -c "$1"', sys.executable, code],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[:2] == ["failed True", "['state.json'] a 100000 True"]


def test_an_mlflow_write_refused_by_the_full_disk_is_skipped_only_while_stopping():
    full = RuntimeError("(sqlite3.OperationalError) database or disk is full [SQL: INSERT ...]")
    with D.tolerate_full_store(True):
        raise full
    with pytest.raises(RuntimeError, match="disk is full"), D.tolerate_full_store(False):
        raise full
    with pytest.raises(KeyError), D.tolerate_full_store(True):
        raise KeyError("another error")


def test_tune_local_error_file_is_read_for_the_reason(tmp_path):
    (tmp_path / "error.txt").write_text("OSError: [Errno 28] No space left on device\n")
    assert D.disk_full_text(D.trial_error_text(SimpleNamespace(error_file=tmp_path / "error.txt")))
    assert D.trial_error_text(SimpleNamespace(error_file=None)) == ""
    assert D.trial_error_text(SimpleNamespace(error_file=tmp_path / "none.txt")) == ""


def test_a_trial_interrupted_by_a_full_disk_is_unfinished_again_in_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    from calibtune.record._tracking import (
        TAG_ERROR,
        TAG_STATUS,
        ChildRun,
        child_statuses,
        record_failure,
        reopen_interrupted,
    )

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    child = ChildRun(uri, exp, "parent", key="t1", name="ce")
    run_id = child.open(params={"loss": "cross_entropy"}, tags={})
    record_failure(uri, run_id, "OSError: [Errno 28] No space left on device", "traceback")
    reopen_interrupted(uri, run_id)
    run = client.get_run(run_id)
    assert (run.info.status, run.data.tags[TAG_STATUS]) == ("KILLED", "running")
    assert TAG_ERROR not in run.data.tags
    assert child_statuses(uri, exp, "parent") == {"t1": "running"}  # counted as unfinished

    record_failure(uri, run_id, "OSError: [Errno 28] No space left on device")  # store was full
    again = ChildRun(uri, exp, "parent", key="t1", name="ce")
    assert again.open(params={"loss": "cross_entropy"}, tags={}) == run_id  # `resume`: same run
    run = client.get_run(run_id)
    assert (run.info.status, run.data.tags[TAG_STATUS]) == ("RUNNING", "running")
    assert TAG_ERROR not in run.data.tags


@pytest.mark.parametrize("limit", [0, 100, 4500, 150_000])
def test_a_checkpoint_write_on_a_full_disk_raises_the_disk_full_error(tmp_path, monkeypatch, limit):
    """``torch.save`` through the storage owner's file object words a failed write that is not
    its first as ``RuntimeError: … unexpected pos``; the storage owner raises the write's own
    ENOSPC instead (what the study recognises as a full disk: one line, resumable), keeps the
    previous checkpoint and leaves no temp file, wherever in the file the disk ran out."""
    import torch

    from calibtune.trial._checkpoint import save_tensors

    path = tmp_path / "ckpt" / "state.pt"
    save_tensors({"x": torch.zeros(3)}, path)
    _enospc_after(monkeypatch, limit)
    with pytest.raises(OSError) as err:
        save_tensors({"x": torch.arange(50_000.0)}, path)
    monkeypatch.undo()
    assert err.value.errno == errno.ENOSPC and D.disk_full_text(str(err.value))
    assert A.full_paths(tmp_path) == [str(path)]
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.pt"]
    assert torch.load(path, weights_only=True)["x"].tolist() == [0.0, 0.0, 0.0]
