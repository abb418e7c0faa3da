"""Submission to a real two-node Ray cluster on this machine (`ray start --head` + a second node).

Both nodes are started the way users start them (`tests/_cluster.py`), on 127.0.0.1, each with one
``node_slot`` that every trial of the submitted study asks for, so that its two concurrent trials
must land on different nodes (the cluster is `two_nodes`, shared with `tests/test_cluster_ddp.py`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _cli(cluster, *args: str) -> subprocess.CompletedProcess:
    """The real executable with the cluster's token (a subprocess: a client that authenticated to
    this cluster keeps Ray's process-wide token settings, which later local Rays must not see)."""
    return subprocess.run(
        [sys.executable, "-m", "calibtune", *args],
        env=cluster.client_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


def _sent_runtime_env(cluster, job_id: str) -> dict:
    """The runtime_env the cluster holds for the job (a subprocess, as `_cli`)."""
    code = (
        "import json, sys; from ray.job_submission import JobSubmissionClient as C; "
        "print(json.dumps(C(sys.argv[1]).get_job_info(sys.argv[2]).runtime_env))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, cluster.dashboard, job_id],
        env=cluster.client_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_submit_study_to_two_node_cluster(tmp_path, two_nodes):
    cluster = two_nodes
    url = cluster.dashboard
    study = yaml.safe_load((ROOT / "studies" / "quickstart.yaml").read_text())
    study["name"] = "cluster_quickstart"
    study["trial"]["train"] = {"epochs": 2, "batch_size": 64, "checkpoint_every": 1}
    study["trial"]["model"] = {"name": "mlp"}
    # one node_slot per node: two trials at once run on two nodes
    study["trial"]["scaling"] = {
        "num_workers": 0,
        "resources_per_worker": {"CPU": 1, "node_slot": 1},
    }
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
    renv = tmp_path / "runtime_env.yaml"  # Ray's runtime_env, passed through (issue 28)
    renv.write_text(yaml.safe_dump({"env_vars": {"OMP_NUM_THREADS": "1"}}))
    res = _cli(
        cluster,
        "submit",
        str(path),
        "--address",
        url,
        "--wait",
        "--storage",
        str(tmp_path / "studies"),
        "--tracking-uri",
        uri,
        "--runtime-env",
        str(renv),
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # quiet: none of Ray's packaging/upload lines, nor MLflow's or Optuna's
    for noise in ("Uploading package", "Creating a file package", "Ignoring upload", "INFO"):
        assert noise not in res.stdout + res.stderr, (noise, res.stdout[-3000:])
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("calibtune-quickstart")
    trials = client.search_runs([exp.experiment_id], "tags.`calibtune.kind` = 'trial'")
    assert len(trials) == 4
    assert all(t.data.tags["calibtune.status"] == "finished" for t in trials)
    assert all("test/ece" in t.data.metrics for t in trials)
    nodes = {t.data.tags["calibtune.node_id"] for t in trials}
    assert len(nodes) == 2, nodes  # trials ran on both nodes
    job_id = res.stdout.split("as Ray job ")[1].split()[0]
    sent = _sent_runtime_env(cluster, job_id)
    assert sent["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert sent["env_vars"]["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"
    status = _cli(cluster, "status", "--address", url)
    assert status.returncode == 0 and job_id in status.stdout
    logs = _cli(cluster, "logs", job_id, "--address", url)
    assert logs.returncode == 0 and "[calibtune] trial" in logs.stdout
