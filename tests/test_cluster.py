"""Submission to a real two-node Ray cluster on this machine (`ray start --head` + a second node).

Both nodes are started the way users start them, on 127.0.0.1, each with one CPU, so that the two
concurrent trials of the submitted study must land on different nodes. The nodes run as process
groups of this test and are torn down by it (never `ray stop`, which would stop every Ray on the
machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from calibtune.cli import main
from calibtune.study._cli import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")


def _start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.Popen(
        [RAY, "start", "--block", "--disable-usage-stats", *args],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=30)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue


def _wait_nodes(gcs: str, n: int, timeout: float = 120) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    deadline = time.time() + timeout
    out = ""
    while time.time() < deadline:
        out = subprocess.run(
            [RAY, "status", "--address", gcs], capture_output=True, text=True, env=env
        ).stdout
        if out.count(" node_") >= n:
            return
        time.sleep(1)
    raise AssertionError(f"cluster did not reach {n} nodes:\n{out}")


def test_submit_study_to_two_node_cluster(tmp_path, capsys):
    port, dash = free_port(), free_port()
    gcs, url = f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}"
    common = ["--num-cpus", "1", "--object-store-memory", str(150 * 1024**2)]
    # Each node gets its own temp root, as on separate machines (two nodes sharing one would
    # garbage-collect each other's runtime-env working directories); short paths for sockets.
    head_tmp = tempfile.mkdtemp(prefix="rh", dir="/tmp")
    worker_tmp = tempfile.mkdtemp(prefix="rw", dir="/tmp")
    head = _start(
        [
            "--head",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(dash),
            "--temp-dir",
            head_tmp,
            *common,
        ],
        tmp_path / "head.log",
    )
    worker = None
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/version", timeout=2)
                break
            except urllib.error.HTTPError:  # it answers (401 without the auth token): it is up
                break
            except OSError:
                assert time.time() < deadline, (tmp_path / "head.log").read_text()[-3000:]
                time.sleep(1)
        worker = _start(
            ["--address", gcs, "--node-ip-address", "127.0.0.1", "--temp-dir", worker_tmp, *common],
            tmp_path / "worker.log",
        )
        _wait_nodes(gcs, 2)

        study = yaml.safe_load((ROOT / "studies" / "quickstart.yaml").read_text())
        study["name"] = "cluster_quickstart"
        study["trial"]["train"] = {"epochs": 2, "batch_size": 64, "checkpoint_every": 1}
        study["trial"]["model"] = {"name": "mlp"}
        study["search"].update({"num_samples": 4, "max_concurrent": 2})
        study["losses"] = [
            {**item, "space": str(ROOT / "search_spaces" / Path(item["space"]).name)}
            if isinstance(item, dict) and "space" in item
            else item
            for item in study["losses"]
        ]
        path = tmp_path / "cluster_quickstart.yaml"
        path.write_text(yaml.safe_dump(study, sort_keys=False))
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        rc = main(
            [
                "submit",
                str(path),
                "--address",
                url,
                "--wait",
                "--storage",
                str(tmp_path / "studies"),
                "--tracking-uri",
                uri,
            ]
        )
        assert rc == 0
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name("calibtune-quickstart")
        trials = client.search_runs([exp.experiment_id], "tags.`calibtune.kind` = 'trial'")
        assert len(trials) == 4
        assert all(t.data.tags["calibtune.status"] == "finished" for t in trials)
        assert all("test/ece" in t.data.metrics for t in trials)
        nodes = {t.data.tags["calibtune.node_id"] for t in trials}
        assert len(nodes) == 2, nodes  # trials ran on both nodes
        job_id = capsys.readouterr().out.split("as Ray job ")[1].split()[0]
        assert main(["status", "--address", url]) == 0
        assert job_id in capsys.readouterr().out
        assert main(["logs", job_id, "--address", url]) == 0
        assert "[calibtune] trial" in capsys.readouterr().out
    finally:
        if worker is not None:
            _stop(worker)
        _stop(head)
        shutil.rmtree(head_tmp, ignore_errors=True)
        shutil.rmtree(worker_tmp, ignore_errors=True)
