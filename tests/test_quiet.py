"""Quiet on a cluster too (issue 28 item 7): without --verbose, no Optuna "step=N is already
reported" warning (a retried trial reports its epochs again), no MLflow artifact progress bars,
and the same settings sent to a cluster's processes (they do not inherit this environment)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from calibtune._raysettings import QUIET_ENV, train_runtime_env
from calibtune.cluster._jobs import job_output, job_spec

SCRIPT = """
import json, optuna, warnings
from calibtune.cluster._quiet import quiet_output
quiet_output()
from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as BAR
optuna.logging.set_verbosity(optuna.logging.ERROR)
trial = optuna.create_study().ask()
trial.report(0.5, 1)
trial.report(0.4, 1)  # a retried trial's epoch 1 again: Optuna keeps the first value
kept = trial.study.trials[0].intermediate_values
print(json.dumps({"bar": BAR.get(), "kept": kept}))
"""


def test_a_repeated_report_and_progress_bars_are_quiet() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    assert "already reported" not in out.stderr, out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen == {"bar": False, "kept": {"1": 0.5}}


def test_the_quiet_settings_reach_a_clusters_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in QUIET_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert QUIET_ENV.items() <= train_runtime_env()["env_vars"].items()
    spec = job_spec("name: s", "s", storage="s3://b/p", tracking_uri="http://m:5000")
    assert QUIET_ENV.items() <= spec["runtime_env"]["env_vars"].items()
    verbose = job_spec(
        "name: s", "s", storage="s3://b/p", tracking_uri="http://m:5000", verbose=True
    )
    assert "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in verbose["runtime_env"]["env_vars"]
    assert verbose["entrypoint"].endswith(" --verbose")


def test_rays_job_manager_lines_are_left_out_unless_verbose() -> None:
    logs = (
        "2026-11-27 18:23:52,336\tINFO job_manager.py:581 -- Runtime env is setting up.\n"
        "Running entrypoint for job raysubmit_x: python -m calibtune run\n"
        "[calibtune] study s: 1 trials\n"
    )
    assert job_output(logs) == "[calibtune] study s: 1 trials\n"
    assert job_output(logs, verbose=True) == logs


CRASH = """
import sys, time
import ray
from ray._private.utils import publish_error_to_driver
from calibtune.cluster._raycluster import init_ray

init_ray(None, num_cpus=1, verbose=sys.argv[1] == "verbose")
job = ray.JobID(bytes.fromhex(ray.get_runtime_context().get_job_id()))
dump = "raylet died: SIGSEGV\\n*** SIGSEGV received at time=1 on cpu 0 ***\\n    @ 0x5 (unknown)"
publish_error_to_driver("raylet_died", dump, ray._private.worker.global_worker.gcs_client, job)
time.sleep(4)  # the driver's error listener prints in the background
ray.shutdown()
"""


@pytest.mark.slow
def test_an_error_the_cluster_publishes_is_one_calibtune_line() -> None:
    """What a raylet crash sends the driver (an error published through the GCS, the path a
    dead node's or worker's report takes): one line when quiet, Ray's block when verbose."""
    run = [sys.executable, "-c", CRASH]
    quiet = subprocess.run([*run, "quiet"], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    both = quiet.stdout + quiet.stderr
    assert "[calibtune] Ray: raylet died: SIGSEGV" in quiet.stderr, both[-2000:]
    assert "SIGSEGV received" not in both and "(raylet)" not in both, both[-2000:]
    verbose = subprocess.run([*run, "verbose"], capture_output=True, text=True, timeout=300)
    assert "SIGSEGV received" in verbose.stdout + verbose.stderr  # Ray's own block
