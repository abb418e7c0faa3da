"""A lab's set-up, for real: `mlflow server` on a PostgreSQL backend store with its artifacts
proxied to object storage (``--artifacts-destination s3://…`` on an S3-compatible server on
127.0.0.1: the recommended cluster set-up, issue 28), a study run through the CLI logging over
HTTP without any store credentials, inspected with MlflowClient.

PostgreSQL comes from ``CALIBTUNE_TEST_PG_URL`` (`.ci/run` starts a throwaway cluster and sets
it); outside CI the test skips without it, in CI (``CI`` set) its absence is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from _s3 import start_s3

from calibtune.readers._ui import free_port, stop_ui

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[1]
PG_URL = os.environ.get("CALIBTUNE_TEST_PG_URL")
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def pg_url() -> str:
    if not PG_URL:
        if os.environ.get("CI"):
            pytest.fail("CALIBTUNE_TEST_PG_URL: expected a PostgreSQL URL in CI, got none")
        pytest.skip("CALIBTUNE_TEST_PG_URL unset (`.ci/run` provides PostgreSQL)")
    return PG_URL


def _fresh_database(pg_url: str) -> tuple[str, str]:
    """A new database on the test cluster (one per module run: no state from earlier runs)."""
    import psycopg2

    name = f"calibtune_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(pg_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    conn.close()
    # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; the test extra ships psycopg2
    base = pg_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg2://", 1)
    return f"{base}/{name}", name


def _drop_database(pg_url: str, name: str) -> None:
    import psycopg2

    conn = psycopg2.connect(pg_url)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    conn.close()


def _start_server(
    db_url: str, artifacts: Path | str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        str(BIN / "mlflow"), "server", "--backend-store-uri", db_url,
        "--artifacts-destination", str(artifacts), "--host", "127.0.0.1",
        "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    env = {**os.environ, **(env or {}), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"mlflow server exited with {proc.returncode}: {err[-800:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    stop_ui(proc)
    raise RuntimeError(f"mlflow server did not answer on {url} within 120 s")


def _study_file(tmp: Path, optuna_url: str | None) -> Path:
    search = {
        "sampler": "random",
        "num_samples": 2,
        "max_concurrent": 2,
        "objectives": [{"metric": "val/ece", "mode": "min"}],
    }
    if optuna_url:
        search["optuna_storage"] = optuna_url
    raw = {
        "name": "lab",
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "mlp"},
            "optimizer": {"lr": 0.05},
            "train": {"epochs": 1, "batch_size": 64, "checkpoint_every": 1},
        },
        "losses": [{"name": "focal", "space": str(ROOT / "search_spaces" / "focal.yaml")}],
        "search": search,
        "tracking": {"experiment": "lab-server"},
        "storage": str(tmp / "studies"),
    }
    path = tmp / "lab.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def lab(pg_url, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    db_url, db_name = _fresh_database(pg_url)
    # Optuna on the same server, in its own database: MLflow and Optuna both keep an
    # alembic_version table, so one database cannot hold both schemas
    optuna_url, optuna_name = _fresh_database(pg_url)
    s3 = start_s3()
    # only the server holds the bucket's credentials: the study's processes get none
    server, url = _start_server(db_url, f"s3://{s3.bucket('mlflow')}/artifacts", s3.env())
    try:
        study = _study_file(tmp, optuna_url)
        run = subprocess.run(
            [str(BIN / "calibtune"), "run", str(study), "--tracking-uri", url],
            cwd=tmp, capture_output=True, text=True, timeout=500,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
        yield url, db_url, tmp, optuna_url, s3
    finally:
        stop_ui(server)
        s3.stop()
        _drop_database(pg_url, db_name)
        _drop_database(pg_url, optuna_name)
        shutil.rmtree(tmp / "artifacts", ignore_errors=True)


def test_study_logs_parent_children_metrics_and_artifacts_to_the_server(lab):
    from mlflow.tracking import MlflowClient

    from calibtune.record._tracking import PARENT, TAG_KIND

    url, _, tmp, _, s3 = lab
    client = MlflowClient(url)
    exp = client.get_experiment_by_name("lab-server")
    assert exp is not None
    assert exp.artifact_location.startswith("mlflow-artifacts:"), exp.artifact_location
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get(TAG_KIND) == "study"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get(PARENT) == parents[0].info.run_id]
    assert len(children) == 2
    for child in children:
        assert child.info.status == "FINISHED"
        assert "val/ece" in child.data.metrics and "test/ece" in child.data.metrics
        history = client.get_metric_history(child.info.run_id, "val/ece")
        assert [h.step for h in history] == [1]
        arts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert "config.yaml" in arts, arts
        # the artifacts went through the server into its destination, not a local mlruns
        local = client.download_artifacts(child.info.run_id, "config.yaml", str(tmp))
        assert "loss" in Path(local).read_text()
    stored = [k for k in s3.keys("mlflow", "artifacts/") if k.endswith("/config.yaml")]
    assert len(stored) == 2, stored  # in the bucket, through the server's proxy
    assert not (tmp / "mlruns").exists() and not (tmp / "artifacts").exists()
    assert not [k for k in s3.keys("mlflow") if k.endswith("calibtune_probe.txt")]


def test_optuna_study_lives_on_the_same_postgresql(lab):
    import optuna

    _, _, _, optuna_url, _ = lab
    summaries = optuna.get_all_study_summaries(storage=optuna_url)
    assert len(summaries) == 1, [s.study_name for s in summaries]
    assert summaries[0].n_trials == 2
    states = {t.state for t in optuna.load_study(study_name=summaries[0].study_name,
                                                 storage=optuna_url).trials}  # fmt: skip
    assert states == {optuna.trial.TrialState.COMPLETE}


def test_a_server_whose_artifact_store_cannot_be_written_is_refused_before_any_trial(tmp_path):
    """A server whose --artifacts-destination is a bucket that does not exist: one line, exit 2,
    before Ray starts (the probe's run is deleted); today's trials would train, then fail."""
    s3 = start_s3()
    server, url = _start_server(
        f"sqlite:///{tmp_path / 'server.db'}", "s3://no-such-bucket/artifacts", s3.env()
    )
    try:
        study = _study_file(tmp_path, None)
        run = subprocess.run(
            [str(BIN / "calibtune"), "run", str(study), "--tracking-uri", url],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
        (line,) = run.stderr.splitlines()
        assert line.startswith("calibtune run: error: --tracking-uri: expected an MLflow server")
        assert "artifact store takes writes, got HTTP 500" in line, line
        assert "[calibtune] study" not in run.stdout  # refused before the study started
        assert not (tmp_path / "studies").exists()
    finally:
        stop_ui(server)
        s3.stop()
