"""Fault tests: a study killed, interrupted or starved at the worst moments loses nothing.

Each test runs the real `calibtune` executable (a real local Ray, real MLflow on SQLite or a real
`mlflow server`), injects the fault by killing a process (SIGKILL of the driver's whole process
group, SIGTERM, a second driver, a full filesystem in a private mount namespace) at a moment made
exact by a failpoint (`calibtune._failpoints`), and checks afterwards that every finished trial
is in MLflow once and was not trained again, that every epoch of every trial is logged exactly
once, that the parent run's counters equal MLflow's, and the exit codes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from calibtune.readers._ui import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _study(
    tmp: Path,
    name: str,
    *,
    epochs: int = 3,
    every: int = 1,
    samples: int = 1,
    uri: str | None = None,
    storage: Path | None = None,
) -> Path:
    raw = {
        "name": name,
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "optimizer": {"lr": 0.05},
            "train": {"epochs": epochs, "batch_size": 64, "checkpoint_every": every},
            "eval": {"posthoc": ["ts"], "figures": False},
        },
        "losses": [
            "cross_entropy",
            {"name": "focal", "params": {"gamma": {"type": "float", "low": 1, "high": 3}}},
        ],
        "search": {
            "sampler": "random",
            "num_samples": samples,
            "max_concurrent": 1,
            "objectives": ["val/ece"],
        },
        "tracking": {"uri": uri or f"sqlite:///{tmp / 'mlflow.db'}", "experiment": name},
        "storage": str(storage or tmp / "studies"),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBTUNE_FAILPOINT")}
    return {**env, "CALIBTUNE_FAILPOINT_DIR": str(tmp), "CALIBTUNE_MIN_FREE_MB": "8", **extra}


def _start(tmp: Path, args: list[str], log: str, **env: str) -> subprocess.Popen:
    out = (tmp / log).open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "calibtune", *args],
        cwd=tmp,
        env=_env(tmp, **env),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(cond, proc: subprocess.Popen | None, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert proc is None or proc.poll() is None, f"process ended before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies aside: PID 1 here may never
    reap the orphans); fields after the command name in /proc/PID/stat: state, ppid, pgrp."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):  # the process ended meanwhile
            continue
        if int(pgrp) == pgid and state != "Z":
            return True
    return False


def _group_gone(proc: subprocess.Popen) -> None:
    """Wait until the driver's whole process group (it and its local Ray) has ended."""
    proc.wait(timeout=60)
    _wait(lambda: not _group_alive(proc.pid), None, "the driver's process group to end", 60)


def _kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the local Ray it started
    _group_gone(proc)


def _cli(tmp: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "calibtune", *args],
        cwd=tmp,
        env=_env(tmp),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _runs(uri: str, exp_name: str) -> tuple[MlflowClient, object, list]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(exp_name)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("calibtune.kind") == "study"]
    assert len(parents) == 1, [r.info.run_name for r in parents]
    children = [r for r in runs if r.data.tags.get("calibtune.kind") == "trial"]
    return client, parents[0], children


def _assert_nothing_lost(uri: str, exp: str, trials: int, epochs: int) -> list:
    """Every trial finished once in MLflow, every epoch logged once, final metrics once, and
    the parent's counters equal to MLflow's."""
    client, parent, children = _runs(uri, exp)
    assert len(children) == trials
    assert {c.data.tags["calibtune.status"] for c in children} == {"finished"}
    for c in children:
        for key in ("epoch", "train/loss", "val/ece"):
            steps = [m.step for m in client.get_metric_history(c.info.run_id, key)]
            assert sorted(steps) == list(range(1, epochs + 1)), (key, steps)
        assert len(client.get_metric_history(c.info.run_id, "test/ece.ts")) == 1
    pm = parent.data.metrics
    assert pm["study/trials_finished"] == trials and pm["study/trials_failed"] == 0
    assert pm["study/trials_unfinished"] == 0
    return children


def _tune_state_trials(sdir: Path) -> list[str]:
    """Trial ids a resume of the study folder finds: the newest Ray Tune experiment state saved
    there (by its session's timestamp, as Tune picks it: every save rewrites the older sessions'
    files too) and the record of trial starts since (`calibtune.study._scheduling.STARTS`)."""
    newest = max(sdir.glob("experiment_state-*.json"), key=lambda p: p.name)
    trials = json.loads(newest.read_text())["trial_data"]
    saved = [json.loads(state)["trial_id"] for state, _ in trials]
    started = [p.stem for p in sdir.glob("trial_starts/*/*.json")]
    return saved + sorted(set(started) - set(saved))


def _compare_rows(tmp: Path, sdir: Path) -> list[str]:
    res = _cli(tmp, "compare", str(sdir), "--format", "csv")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[1:]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("point", "every", "epochs", "skip"),
    [
        ("epoch_end:2", 1, 3, 0),  # during an epoch: computed, neither checkpointed nor logged
        # checkpointed, not yet logged nor reported
        pytest.param("after_checkpoint:2", 1, 3, 0, marks=pytest.mark.long),
        # epoch 3 logged but its checkpoint never written
        pytest.param("epoch_end:4", 2, 4, 0, marks=pytest.mark.long),
        # the first trial done, the second in its final evaluation
        pytest.param("final_eval", 1, 2, 1, marks=pytest.mark.long),
        # the first trial done, the second's trainable just started (`long`: a driver SIGKILL +
        # resume stays in `make test` as the epoch_end:2 case)
        pytest.param("trial_start", 1, 2, 1, marks=pytest.mark.long),
    ],
)
def test_driver_sigkill_then_resume_loses_nothing(tmp_path, point, every, epochs, skip):
    name = "kill" + point.replace(":", "").replace("_", "")
    samples = 2 if skip else 1
    path = _study(tmp_path, name, epochs=epochs, every=every, samples=samples)
    hit = tmp_path / f"{point.split(':')[0]}.hit"
    proc = _start(
        tmp_path,
        ["run", str(path), "--quiet"],
        "run.log",
        CALIBTUNE_FAILPOINT=point,
        CALIBTUNE_FAILPOINT_SKIP=str(skip),
        # Tune's periodic state save never comes: a trial is on disk before it starts, or lost
        TUNE_GLOBAL_CHECKPOINT_S="100000",
    )
    _wait(hit.exists, proc, point)
    sdir = tmp_path / "studies" / name
    done_before = {p: p.stat().st_mtime_ns for p in sdir.glob("trials/*/result.json")}
    assert len(done_before) == skip
    assert len(_tune_state_trials(sdir)) == samples  # the paused trial: a resume finds it
    _kill_group(proc)

    res = _cli(tmp_path, "resume", str(sdir), "--quiet")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for noise in ("Failed to fetch metrics", "trial_fs_path"):  # Tune's view of unstarted trials
        assert noise not in res.stderr, res.stderr[-3000:]
    _assert_nothing_lost(f"sqlite:///{tmp_path / 'mlflow.db'}", name, samples, epochs)
    for p, mtime in done_before.items():  # a trial that had finished was not run again
        assert p.stat().st_mtime_ns == mtime, p
    assert len(_compare_rows(tmp_path, sdir)) == samples
    import optuna  # the persisted Optuna study: one COMPLETE trial per Tune trial, no orphans

    ot = optuna.load_study(study_name=name, storage=f"sqlite:///{sdir / 'optuna.db'}")
    assert [t.state.name for t in ot.trials] == ["COMPLETE"] * samples
    assert len({t.user_attrs["tune_trial_id"] for t in ot.trials}) == samples


@pytest.mark.timeout(900)
def test_second_driver_refused_sigterm_stops_cleanly_and_resume_finishes(tmp_path):
    path = _study(tmp_path, "twodrivers", epochs=4)
    first = _start(
        tmp_path,
        ["run", str(path), "--quiet"],
        "first.log",
        CALIBTUNE_FAILPOINT="epoch_end:2",
        CALIBTUNE_FAILPOINT_PAUSE_S="60",
    )
    _wait((tmp_path / "epoch_end.hit").exists, first, "epoch 2")
    sdir = tmp_path / "studies" / "twodrivers"
    ours = [sdir / "calibtune_study.json", sdir / "study.yaml", sdir / ".calibtune.lock"]
    before = ({p: p.read_bytes() for p in ours}, sorted(tmp_path.iterdir()))

    second = _cli(tmp_path, "run", str(path), "--quiet", timeout=120)
    assert second.returncode == 2, second.stdout + second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in second.stderr
    assert f"pid {first.pid}" in lines[0] and "twodrivers" in lines[0]
    assert ({p: p.read_bytes() for p in ours}, sorted(tmp_path.iterdir())) == before

    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=180) == 143, (tmp_path / "first.log").read_text()[-3000:]
    _group_gone(first)
    res = _cli(tmp_path, "resume", "twodrivers", "--storage", str(tmp_path / "studies"))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    _assert_nothing_lost(f"sqlite:///{tmp_path / 'mlflow.db'}", "twodrivers", 1, 4)


# `long`: test_driver_sigkill_then_resume_loses_nothing[epoch_end:2…] (make test) resumes past
# the lock its SIGKILLed driver left
@pytest.mark.long
@pytest.mark.timeout(900)
def test_stale_lock_of_a_killed_driver_is_recognised(tmp_path):
    path = _study(tmp_path, "stale", epochs=2)
    proc = _start(
        tmp_path, ["run", str(path), "--quiet"], "run.log", CALIBTUNE_FAILPOINT="epoch_end:1"
    )
    _wait((tmp_path / "epoch_end.hit").exists, proc, "epoch 1")
    _kill_group(proc)
    lock = tmp_path / "studies" / "stale" / ".calibtune.lock"
    assert str(proc.pid) in lock.read_text()  # the dead driver's record stays...
    res = _cli(tmp_path, "run", str(path), "--quiet")  # ...but its flock died with it
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    _assert_nothing_lost(f"sqlite:///{tmp_path / 'mlflow.db'}", "stale", 1, 2)


def _mlflow_server(tmp: Path, port: int) -> subprocess.Popen:
    mlflow = str(Path(sys.executable).parent / "mlflow")
    proc = subprocess.Popen(
        [
            mlflow,
            "server",
            "--backend-store-uri",
            f"sqlite:///{tmp / 'server.db'}",
            "--artifacts-destination",
            str(tmp / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=tmp,
        stdout=(tmp / "server.log").open("a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    import urllib.request

    def up() -> bool:
        try:
            return (
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
            )
        except OSError:
            return False

    _wait(up, proc, "mlflow server", timeout=120)
    return proc


@pytest.mark.timeout(900)
def test_mlflow_server_killed_mid_study_and_restarted(tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = _mlflow_server(tmp_path, port)
    path = _study(tmp_path, "serverkill", epochs=4, samples=2, uri=uri)
    proc = _start(
        tmp_path,
        ["run", str(path), "--quiet"],
        "run.log",
        CALIBTUNE_FAILPOINT="epoch_end:2",
        CALIBTUNE_FAILPOINT_PAUSE_S="5",
    )
    try:
        _wait((tmp_path / "epoch_end.hit").exists, proc, "epoch 2")
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        time.sleep(15)  # the trial logs epoch 2 meanwhile: MLflow's HTTP client retries
        server = _mlflow_server(tmp_path, port)
        assert proc.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-3000:]
        _assert_nothing_lost(uri, "serverkill", 2, 4)
        log = (tmp_path / "run.log").read_text()
        said = [ln for ln in log.splitlines() if "did not answer for a while" in ln]
        assert len(said) == 1 and "nothing was lost" in said[0], log[-3000:]  # once, at the end
        assert "Retrying (" not in log  # not urllib3's warning per retried request
    finally:
        for p in (proc, server):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


# `long`: a full disk mid-study + resume stays in `make test` as
# test_disk_filled_to_the_last_byte_mid_study_costs_nothing[trial_start-True]
@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs root and unshare for a private tmpfs",
)
def test_full_disk_stops_with_one_line_and_resume_finishes(tmp_path):
    """Storage on a 48 MiB tmpfs (private mount namespace) filled up mid-study: the study stops
    with one line naming the folder and the space left, state intact; after space is freed,
    `resume` finishes every trial with nothing lost."""
    storage = tmp_path / "small"
    storage.mkdir()
    path = _study(tmp_path, "fulldisk", epochs=4, samples=2, storage=storage)
    sdir = storage / "fulldisk"
    py = sys.executable
    script = f"""
set -u
mount -t tmpfs -o size=48m tmpfs {storage}
export CALIBTUNE_FAILPOINT=epoch_end:2 CALIBTUNE_FAILPOINT_PAUSE_S=15  # the disk fills here
{py} -m calibtune run {path} --quiet > {tmp_path}/run.out 2> {tmp_path}/run.err &
pid=$!
for i in $(seq 1200); do
  [ -e {tmp_path}/epoch_end.hit ] && break; sleep 0.5
done
avail=$(df --output=avail -k {storage} | tail -1)
dd if=/dev/zero of={storage}/filler bs=1K count=$((avail - 4096)) 2>/dev/null
wait $pid; echo $? > {tmp_path}/run.rc
rm {storage}/filler
{py} -m calibtune resume {sdir} --quiet > {tmp_path}/resume.out 2> {tmp_path}/resume.err
echo $? > {tmp_path}/resume.rc
"""
    subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        cwd=tmp_path,
        env=_env(tmp_path),
        timeout=840,
        check=True,
    )
    err = (tmp_path / "run.err").read_text()
    assert (tmp_path / "run.rc").read_text().strip() == "75", err[-3000:]
    want = f"storage {sdir}: expected at least 8 MiB free, found"
    assert sum(want in line for line in err.splitlines()) == 1, err[-3000:]
    assert "Traceback" not in err
    resume_err = (tmp_path / "resume.err").read_text()
    assert (tmp_path / "resume.rc").read_text().strip() == "0", resume_err[-3000:]
    _assert_nothing_lost(f"sqlite:///{tmp_path / 'mlflow.db'}", "fulldisk", 2, 4)


@pytest.mark.timeout(300)
def test_truncated_tune_state_is_refused_in_one_line(tmp_path):
    path = _study(tmp_path, "trunc", epochs=1)
    res = _cli(tmp_path, "run", str(path), "--quiet")
    assert res.returncode == 0, res.stderr[-3000:]
    sdir = tmp_path / "studies" / "trunc"
    state = sorted(sdir.glob("experiment_state-*.json"))[-1]
    state.write_text(state.read_text()[:100])  # what a full disk left behind
    snapshot = {p: p.stat().st_mtime_ns for p in sdir.rglob("*") if p.is_file()}
    res = _cli(tmp_path, "resume", str(sdir))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "truncated or corrupt" in lines[0] and str(state) in lines[0]
    assert {p: p.stat().st_mtime_ns for p in sdir.rglob("*") if p.is_file()} == snapshot


@pytest.mark.timeout(600)
@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs root and unshare for a private tmpfs",
)
@pytest.mark.parametrize(
    ("point", "mlflow_on_it"),
    [
        # the trial's own writes hit ENOSPC (its marker, checkpoints)
        pytest.param("trial_start", False, marks=pytest.mark.long),
        ("trial_start", True),  # ... and MLflow's SQLite store is on the same disk too
        # the start record of trial 2, before it starts, hits it
        pytest.param("before_start_save", False, marks=pytest.mark.long),
    ],
)
def test_disk_filled_to_the_last_byte_mid_study_costs_nothing(tmp_path, point, mlflow_on_it):
    """Issue 24.1: the study's storage (and with ``mlflow_on_it`` the MLflow SQLite store) on a
    32 MiB tmpfs (private mount namespace), filled to the last byte as the second trial starts,
    at failpoint ``point`` (the storage guard off: ENOSPC, not a threshold, stops it). One line
    naming the folder and the free space, exit 75, Tune's and calibtune's state files intact;
    after the filler is removed `resume` finishes every trial, each once in MLflow, in Optuna and
    in Tune's state."""
    storage = tmp_path / "small"
    storage.mkdir()
    name, samples, epochs = "diskfull", 3, 2
    db = (storage if mlflow_on_it else tmp_path) / "mlflow.db"
    uri = f"sqlite:///{db}"
    path = _study(tmp_path, name, epochs=epochs, samples=samples, storage=storage, uri=uri)
    sdir, keep = storage / name, tmp_path / "kept"
    py = sys.executable
    script = f"""
set -u
mount -t tmpfs -o size=32m tmpfs {storage}
CALIBTUNE_FAILPOINT={point} CALIBTUNE_FAILPOINT_SKIP=1 CALIBTUNE_FAILPOINT_PAUSE_S=3 \
  {py} -m calibtune run {path} --quiet > {tmp_path}/run.out 2> {tmp_path}/run.err &
pid=$!
for i in $(seq 1200); do
  [ -e {tmp_path}/{point}.hit ] && break; sleep 0.25
done
dd if=/dev/zero of={storage}/filler bs=64K 2>/dev/null
wait $pid; echo $? > {tmp_path}/run.rc
cp -a {sdir} {tmp_path}/stopped
cp -a {db} {tmp_path}/stopped.db
rm {storage}/filler
{py} -m calibtune resume {sdir} --quiet > {tmp_path}/resume.out 2> {tmp_path}/resume.err
echo $? > {tmp_path}/resume.rc
cp -a {sdir} {keep}
cp -a {storage}/mlflow.db {tmp_path}/mlflow.db 2>/dev/null || true
"""
    subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        cwd=tmp_path,
        env=_env(tmp_path, CALIBTUNE_MIN_FREE_MB="0"),
        timeout=540,
        check=True,
    )
    assert (tmp_path / f"{point}.hit").exists()
    err = (tmp_path / "run.err").read_text()
    rc = (tmp_path / "run.rc").read_text().strip()
    assert rc == "75", err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert lines[0].startswith(f"calibtune run: storage {sdir} is full ("), lines[0]
    assert (
        f"MiB free): the study stopped; free space and run 'calibtune resume {sdir}'" in (lines[0])
    )
    stopped = tmp_path / "stopped"
    saved = _tune_state_trials(stopped)  # the last complete state survived the full disk
    assert len(saved) == (1 if point == "before_start_save" else 2), saved
    assert not list(stopped.rglob(".*.tmp*"))  # no temp file left behind
    _, parent, children = _runs(f"sqlite:///{tmp_path / 'stopped.db'}", name)
    assert [c.data.tags["calibtune.status"] for c in children].count("failed") == 0
    if not mlflow_on_it:  # the stopped study's counters (a full store refuses them: resume)
        assert parent.info.status == "KILLED"
        m = parent.data.metrics
        assert (m["study/trials_finished"], m["study/trials_unfinished"]) == (1, samples - 1)
    resume_err = (tmp_path / "resume.err").read_text()
    assert (tmp_path / "resume.rc").read_text().strip() == "0", resume_err[-3000:]
    children = _assert_nothing_lost(f"sqlite:///{tmp_path / 'mlflow.db'}", name, samples, epochs)
    assert not [c for c in children if "calibtune.error" in c.data.tags]
    assert sorted(_tune_state_trials(keep)) == sorted(
        c.data.tags["calibtune.trial_id"] for c in children
    )
    import optuna

    ot = optuna.load_study(study_name=name, storage=f"sqlite:///{keep / 'optuna.db'}")
    assert [t.state.name for t in ot.trials] == ["COMPLETE"] * samples
    assert len({t.user_attrs["tune_trial_id"] for t in ot.trials}) == samples
