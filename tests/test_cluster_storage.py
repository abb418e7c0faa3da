"""Storage that not every node sees is refused before the first trial (issue 28 item 3).

A real two-node Ray cluster on 127.0.0.1 (`tests/_cluster.py`) whose second node has a private
tmpfs mounted over the study storage (its own mount namespace, as a node without the cluster's
NFS mount): `calibtune run` names that node in one line, exit 2, and trains nothing; a folder
both nodes see passes the same probe. Needs root (``unshare -m``), as the cluster tests' CI has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from _cluster import start_cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="a private mount (unshare -m) needs root"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head + a node with a private (empty) tmpfs over ``hidden``; ``shared`` both nodes see."""
    root = tmp_path_factory.mktemp("storage")
    hidden, shared = root / "hidden", root / "shared"
    hidden.mkdir()
    shared.mkdir()
    c = start_cluster(root, nodes=1, num_cpus=1)
    try:
        c.add_node(expect=2, private_mount=str(hidden))
        yield c, root, hidden, shared
    finally:
        c.stop()


def _python(cluster, code: str, *args: str) -> subprocess.CompletedProcess:
    """A driver process connected to the cluster (a subprocess: the cluster's token settings
    stay out of this test process)."""
    return subprocess.run(
        [sys.executable, "-c", code, cluster.gcs, *args],
        env=cluster.client_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


PROBE = """
import json, sys, ray
from calibtune.storage import StorageNotSharedError, check_nodes_see, open_storage
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
worker = [n["NodeID"] for n in ray.nodes() if n["Alive"]
          and "node:__internal_head__" not in n["Resources"]]
out = {"worker": worker[0]}
for key, path in (("shared", sys.argv[2]), ("hidden", sys.argv[3])):
    try:
        check_nodes_see(open_storage(path), "--storage")
        out[key] = None
    except StorageNotSharedError as exc:
        out[key] = str(exc)
print(json.dumps(out))
"""


def test_probe_names_the_node_that_cannot_see_the_storage(cluster) -> None:
    c, _, hidden, shared = cluster
    proc = _python(c, PROBE, str(shared), str(hidden))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["shared"] is None  # both nodes read and write it
    line = out["hidden"]
    assert line.startswith("--storage: expected storage that every Ray node sees, but node ")
    assert out["worker"][:12] in line and "found no marker" in line, line
    assert os.listdir(shared) == [] and os.listdir(hidden) == []  # the markers are cleaned up


def test_run_refuses_before_the_first_trial(cluster) -> None:
    """Today's code ran the study: two of its trial folders existed only on node 2."""
    c, root, hidden, _ = cluster
    study = {
        "name": "unseen",
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 64},
        },
        "losses": ["cross_entropy"],
        "search": {"sampler": "random", "num_samples": 2, "max_concurrent": 2},
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}"},
    }
    path = root / "unseen.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    argv = ["run", str(path), "--address", c.gcs, "--storage", str(hidden)]
    proc = subprocess.run(
        [sys.executable, "-m", "calibtune", *argv],
        env=c.client_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr[-3000:]
    assert err[0].startswith(
        "calibtune run: error: storage: expected storage that every Ray node sees, but node "
    )
    assert "found no marker" in err[0] and "nothing was trained" in err[0], err[0]
    assert not (hidden / "unseen" / "trials").exists()
    assert not (hidden / "unseen" / "calibtune_study.json").exists()
