"""Ray Train settings: defaults applied where the user set nothing, never over a user's value,
and never clashing with a submitted Ray Job's own runtime_env (Ray refuses a duplicate key)."""

from __future__ import annotations

import json

import pytest

from calibtune._raysettings import TRAIN_ENV, apply_train_env, train_runtime_env
from calibtune.study._display import QUIET_ENV


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
