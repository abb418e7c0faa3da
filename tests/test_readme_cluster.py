"""README "Running on a Ray cluster", run: every command of its code block, in order, on this
machine — PostgreSQL from ``CALIBTUNE_TEST_PG_URL`` (`.ci/run`), an S3-compatible server on
127.0.0.1 (moto) holding the bucket, the MLflow server the block starts, two Ray nodes started by
its ``ray start`` lines (with this test's ports and temp roots added), the submit and the report.

Placeholders are replaced by this machine's addresses (DBHOST, HEAD, MLFLOW, S3HOST, KEY, SECRET,
STUDY.yaml, STUDY_NAME); a command the test does not know fails it, so that the block cannot grow
a command no test runs.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from _cluster import Cluster
from _s3 import start_s3

from calibtune.readers._ui import free_port, stop_ui

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PG_URL = os.environ.get("CALIBTUNE_TEST_PG_URL")


def readme_commands() -> list[str]:
    """The code block of the README's cluster section, one command per non-comment line."""
    section = (ROOT / "README.md").read_text().split("## Running on a Ray cluster\n")[1]
    block = section.split("\n## ")[0].split("```bash\n")[1].split("```")[0]
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_the_block_has_the_commands_of_an_empty_cluster() -> None:
    heads = [shlex.split(c)[:2] for c in readme_commands()]
    assert [h[0] for h in heads] == [
        "createdb", "createdb", "mlflow", "ray", "ray", "export", "calibtune", "calibtune"
    ]  # fmt: skip
    assert heads[-2] == ["calibtune", "submit"]


def _study(tmp: Path, pg: str) -> Path:
    raw = {
        "name": "readme_cluster",
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 64, "checkpoint_every": 1},
        },
        "losses": ["cross_entropy", "focal"],
        "search": {
            "sampler": "random",
            "num_samples": 2,
            "max_concurrent": 2,
            "objectives": [{"metric": "val/ece", "mode": "min"}],
            "optuna_storage": f"postgresql+psycopg2://{pg}/optuna",
        },
        "tracking": {"experiment": "readme-cluster"},
    }
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _wait_http(url: str, proc: subprocess.Popen) -> None:
    deadline = time.time() + 180
    while time.time() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer")


def _createdb() -> str:
    found = shutil.which("createdb") or sorted(glob.glob("/usr/lib/postgresql/*/bin/createdb"))
    assert found, "createdb: expected PostgreSQL's client programs"
    return found if isinstance(found, str) else found[-1]


# `long`: submitting a study to a fresh two-node cluster stays in `make test`
# (test_cluster.py::test_submit_study_to_two_node_cluster); the block's commands are checked above
@pytest.mark.long
def test_every_command_of_the_readme_cluster_section_runs(tmp_path) -> None:
    if not PG_URL:
        if os.environ.get("CI"):
            pytest.fail("CALIBTUNE_TEST_PG_URL: expected a PostgreSQL URL in CI, got none")
        pytest.skip("CALIBTUNE_TEST_PG_URL unset (`.ci/run` provides PostgreSQL)")
    pg = urlsplit(PG_URL)
    dbhost = f"{pg.hostname}:{pg.port}"
    s3 = start_s3()
    s3.bucket("calibtune")
    cluster = Cluster(tmp_path, num_cpus=1)
    exported: dict[str, str] = {}
    procs: list[subprocess.Popen] = []
    made: list[str] = []
    subst = {
        "STUDY.yaml": str(_study(tmp_path, f"postgres@{dbhost}")),
        "STUDY_NAME": "readme_cluster",
    }
    outputs = {}
    try:
        for command in readme_commands():
            argv = shlex.split(command)
            if argv[0] == "createdb":
                argv = [_createdb(), "-h", pg.hostname, "-p", str(pg.port), *argv[3:]]
                subprocess.run(argv, check=True, timeout=60)
                made.append(argv[-1])
            elif argv[0] == "mlflow":
                port = free_port()
                argv = [
                    str(BIN / "mlflow"),
                    *(a.replace("DBHOST", dbhost) for a in argv[1:-4]),
                    *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
                ]
                assert "--artifacts-destination" in argv
                env = {**os.environ, **s3.env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
                procs.append(
                    subprocess.Popen(
                        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )  # fmt: skip
                subst["http://MLFLOW:5000"] = f"http://127.0.0.1:{port}"
                _wait_http(f"http://127.0.0.1:{port}/health", procs[-1])
            elif argv[:3] == ["ray", "start", "--head"]:
                ports = [
                    "--port",
                    str(cluster.port),
                    "--dashboard-port",
                    str(cluster.dashboard_port),
                ]
                head = cluster._start([*argv[2:], *ports], "rh")
                _wait_http(f"{cluster.dashboard}/api/version", head.proc)
                subst["http://HEAD:8265"] = cluster.dashboard
            elif argv[:2] == ["ray", "start"]:
                args = [a.replace("HEAD:6379", cluster.gcs) for a in argv[2:]]
                cluster._start(args, "rw")
                cluster.wait_nodes(2)
            elif argv[0] == "export":
                fake = {**s3.env(), "https://S3HOST": s3.endpoint}
                for item in argv[1:]:
                    key, value = item.split("=", 1)
                    exported[key] = fake.get(value, fake.get(key, value))
                assert exported["AWS_ENDPOINT_URL_S3"] == s3.endpoint
            elif argv[0] == "calibtune":
                for k, v in subst.items():
                    argv = [a.replace(k, v) for a in argv]
                res = subprocess.run(
                    [str(BIN / "calibtune"), *argv[1:]], cwd=tmp_path, capture_output=True,
                    text=True, timeout=600, env=cluster.client_env(exported),
                )  # fmt: skip
                assert res.returncode == 0, (command, res.stdout[-3000:], res.stderr[-3000:])
                outputs[argv[1]] = res.stdout
            else:
                raise AssertionError(f"README command no test runs: {command}")
        assert "[calibtune] trial" in outputs["submit"]
        assert "focal" in outputs["report"] and "cross_entropy" in outputs["report"]
        keys = s3.keys("calibtune")
        assert [k for k in keys if k.startswith("studies/readme_cluster/")]  # the study folder
        assert [k for k in keys if k.startswith("mlflow/") and k.endswith("config.yaml")]
        assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()
    finally:
        cluster.stop()
        for proc in procs:
            stop_ui(proc)
        s3.stop()
        for name in made:
            subprocess.run(
                [_createdb().replace("createdb", "dropdb"), "-h", pg.hostname, "-p", str(pg.port),
                 "-U", "postgres", "--force", name], timeout=60, check=False,
            )  # fmt: skip
