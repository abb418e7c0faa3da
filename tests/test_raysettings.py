"""Ray Train settings: defaults applied where the user set nothing, never over a user's value,
and never clashing with a submitted Ray Job's own runtime_env (Ray refuses a duplicate key)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from calibtune._raysettings import QUIET_ENV, TRAIN_ENV, apply_train_env, train_runtime_env


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in (*TRAIN_ENV, *QUIET_ENV, "RAY_JOB_CONFIG_JSON_ENV_VAR"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_defaults_are_applied_to_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    import os

    assert apply_train_env() == TRAIN_ENV
    assert os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.02"
    assert float(TRAIN_ENV["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"]) < 2.0  # Ray's default polls 2 s


def test_a_users_value_wins(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "1.5")
    clean_env.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "1")
    env = train_runtime_env()["env_vars"]
    assert env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "1.5"
    assert env["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "1"
    assert env["RAY_TRAIN_METRICS_ENABLED"] == "0"


def test_keys_a_submitted_job_sets_are_left_to_the_job(clean_env: pytest.MonkeyPatch) -> None:
    job = {"runtime_env": {"env_vars": {"RAY_TRAIN_METRICS_ENABLED": "1", "OTHER": "x"}}}
    clean_env.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    env = train_runtime_env()["env_vars"]
    assert "RAY_TRAIN_METRICS_ENABLED" not in env
    assert set(env) == set(TRAIN_ENV) - {"RAY_TRAIN_METRICS_ENABLED"}


def test_ray_reads_the_variables_calibtune_sets() -> None:
    """The names must be the ones this Ray version reads (a rename upstream would make the
    settings silently do nothing)."""
    from ray.train.v2._internal import constants as C

    assert C.HEALTH_CHECK_INTERVAL_S_ENV_VAR in TRAIN_ENV
    assert C.ENABLE_PREEMPTION_WATCHER_ENV_VAR in TRAIN_ENV
    assert C.METRICS_ENABLED_ENV_VAR in TRAIN_ENV
    assert C.HEALTH_CHECK_INTERVAL_S_ENV_VAR in C.ENV_VARS_TO_PROPAGATE
    assert C.ENABLE_PREEMPTION_WATCHER_ENV_VAR in C.ENV_VARS_TO_PROPAGATE


def test_preemption_handling_is_on_for_a_cluster_and_off_for_a_local_ray(
    clean_env: pytest.MonkeyPatch,
) -> None:
    """Issue 29: cluster runs with Ray Train's preemption watcher (Ray's default); a local Ray,
    which is never preempted, without its extra actor per trial; a user's value wins."""
    import os

    key = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
    assert train_runtime_env()["env_vars"][key] == "1"
    assert os.environ[key] == "1"  # Train propagates it from the process that calls fit
    clean_env.delenv(key)
    assert apply_train_env()[key] == "0"
    clean_env.setenv(key, "0")
    assert train_runtime_env()["env_vars"][key] == "0"


class _Connected(Exception):
    """Raised by the stand-in for `ray.init`: the test only needs its arguments."""


def test_a_single_trial_on_a_cluster_gives_ray_its_address(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`calibtune.trial.run` with ``RAY_ADDRESS=HOST:PORT`` (a worker-mode trial on a cluster)
    passes the address to its Ray processes, as a study does (`train_runtime_env`): Ray Train's
    placement-group cleaner looks the cluster up by it."""
    import ray

    from calibtune.trial import _driver, config_from_dict

    seen: dict[str, Any] = {}

    def connect(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Connected

    clean_env.setenv("RAY_ADDRESS", "127.0.0.1:6390")
    clean_env.setattr(ray, "is_initialized", lambda: False)
    clean_env.setattr(ray, "init", connect)
    cfg = config_from_dict(
        {
            "name": "t",
            "storage_path": str(tmp_path),
            "data": {"name": "digits"},
            "model": {"name": "mlp"},
            "scaling": {"num_workers": 1},
        }
    )
    with pytest.raises(_Connected):
        _driver.run(cfg)
    assert seen["address"] == "127.0.0.1:6390"
    assert seen["runtime_env"]["env_vars"]["RAY_ADDRESS"] == "127.0.0.1:6390"


KEEP_IDLE = """
import os, time
import ray
from calibtune.cluster._raycluster import init_ray

init_ray(None, num_cpus=2, verbose=False)


@ray.remote(num_cpus=1)
def pid(wait):
    time.sleep(wait)
    return os.getpid()


first = set(ray.get([pid.remote(1.0), pid.remote(1.0)]))  # two worker processes
ray.get(pid.options(num_cpus=2).remote(4.0))  # one of them busy, no CPU free: the other idle
later = set(ray.get([pid.remote(1.0), pid.remote(1.0)]))
print(len(first), "kept" if later == first else "fresh")
ray.shutdown()
"""


@pytest.mark.slow
def test_a_local_ray_keeps_an_idle_worker_process_between_tasks(
    clean_env: pytest.MonkeyPatch,
) -> None:
    """A worker process left idle while the CPUs are busy (a seed task's, between two trials)
    is still there for the next task 4 s later (Ray's default kills it after 1 s, and the next
    seed pays a fresh process's imports: `local_system_config`)."""
    clean_env.delenv("RAY_idle_worker_killing_time_threshold_ms", raising=False)
    clean_env.delenv("RAY_ADDRESS", raising=False)
    out = subprocess.run(
        [sys.executable, "-c", KEEP_IDLE], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["2", "kept"]
