"""`calibtune submit` to a real two-node cluster whose second node runs other software than the
head (issue 28 item 4): the job's version probe refuses it before the first trial, in one line
naming the node and both versions, exit 2, nothing trained.

The second node is started with ``PYTHONPATH`` holding an ``optuna`` distribution record of
another version (what a node whose image or per-job install brought another Optuna reports);
the package itself is the same, so everything else on that node works.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _cluster import start_cluster

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

STUDY = {
    "name": "mismatch",
    "trial": {
        "data": {"name": "digits"},
        "model": {"name": "mlp"},
        "train": {"epochs": 1, "batch_size": 64},
    },
    "losses": ["cross_entropy"],
    "search": {"num_samples": 1, "max_concurrent": 1, "objectives": [{"metric": "val/ece"}]},
    "tracking": {"experiment": "calibtune-mismatch"},
}


# `long`: the per-node version check stays in `make test` against a stubbed node
# (tests/test_node_check.py) and a two-node cluster runs trials (test_cluster.py)
@pytest.mark.long
def test_a_node_with_another_package_version_is_refused_before_the_first_trial(tmp_path):
    shadow = tmp_path / "shadow" / "optuna-0.0.1.dist-info"
    shadow.mkdir(parents=True)
    (shadow / "METADATA").write_text("Metadata-Version: 2.1\nName: optuna\nVersion: 0.0.1\n")
    cluster = start_cluster(tmp_path, nodes=1, num_cpus=1)
    try:
        cluster.env["PYTHONPATH"] = f"{shadow.parent}:{cluster.client_env().get('PYTHONPATH', '')}"
        cluster.add_node(expect=2)
        del cluster.env["PYTHONPATH"]
        (tmp_path / "s.yaml").write_text(yaml.safe_dump(STUDY))
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        argv = ["submit", str(tmp_path / "s.yaml"), "--wait", "--address", cluster.dashboard]
        argv += ["--storage", str(tmp_path / "studies"), "--tracking-uri", uri]
        res = subprocess.run(
            [sys.executable, "-m", "calibtune", *argv],
            env=cluster.client_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        out = res.stdout + res.stderr
        assert res.returncode == 2, out[-3000:]
        (line,) = [ln for ln in out.splitlines() if "expected the driver's" in ln]
        from optuna import __version__ as optuna_version

        assert f"expected the driver's optuna {optuna_version}, found optuna 0.0.1" in line
        assert re.search(r"error: node [0-9a-f]{12} \(", line), line  # by id and address
        assert "Traceback" not in out and "[calibtune] trial" not in out
        assert not (tmp_path / "studies" / "mismatch").exists() or not list(
            (tmp_path / "studies" / "mismatch").rglob("result.json")
        )
    finally:
        cluster.stop()
