"""Ray Train settings calibtune runs with: what each one buys, and how they reach the controller.

Ray Train (v2) reads these environment variables in its controller and workers; it propagates
them from the process that calls ``TorchTrainer.fit`` (``ENV_VARS_TO_PROPAGATE``). A local Ray
started by calibtune inherits them from the driver's environment; a client of an existing cluster
passes them in the job's ``runtime_env``. A value the user set is always respected.

- ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.02`` (Ray's default 2.0): the controller polls each
  worker at this interval, and a worker's result queue holds one report, so a worker's next
  ``ray.train.report`` blocks until the previous one was polled: with 2 s, every epoch shorter
  than 2 s waits for the poll, and a finished trial waits up to 2 s for its last poll; with
  0.02 s an epoch waits at most 20 ms (bench/bench_raytrain.py ``--polls``: median 4–9 ms per
  epoch at 0.02 s vs 14–35 ms at 0.05 s, and no measurable rise in the controller's CPU, ≈ 3 %
  of a core either way). A poll is one small actor call per worker; a missed poll is not a
  failure (Ray marks a worker dead after
  ``RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S``, 10 min, of hanging, and a dead actor at once),
  so dead-worker detection is unchanged (tests/test_faults.py, tests/test_cluster_ddp.py).
- ``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER``: ``1`` (Ray's default) on a cluster
  (`train_runtime_env`), ``0`` on a local Ray (`apply_train_env`). The watcher is one actor per
  worker group (``num_cpus=0``) polling the GCS's draining nodes every 5 s; on a preemption
  notice (a drain with reason PREEMPTION) Ray Train's controller keeps the healthy ranks
  training until the node's deadline (120 s when the notice gives none), then restarts the
  group from its last checkpoint, charged to ``FailureConfig.max_preemption_failures``
  (unlimited), not to ``scaling.max_failures``; a node that dies without notice is retried by
  Tune (``search.max_failures``, calibtune.study._scheduling). A local Ray is never preempted:
  there the watcher would only cost a process start per trial (bench/bench_raytrain.py).
- ``RAY_TRAIN_METRICS_ENABLED=0``: Train's Prometheus metrics (controller and worker callbacks);
  calibtune records its own metrics in MLflow, and no Ray dashboard runs by default.

What a worker-mode trial's start-up costs, and why no further setting helps (Ray 2.60; measured
with ``bench/bench_raytrain.py --timeline``, bench/README.md): ``TorchTrainer.fit`` starts five
fresh Python processes — the Train controller, then (from the controller) a placement-group
cleaner, a synchronisation actor, the worker and a dataset manager (created even when the trial
passes no Ray Datasets) — each importing Ray and Ray Train (pandas, pyarrow, Ray Data), the
worker also torch and calibtune: 16–21 CPU seconds per trial on the 2-core box (at load 9–20),
while the tail from the last report to ``fit()`` returning takes 0.12–0.16 s. Checked and left
alone:

- Ray's prestarted worker pool cannot serve them. The controller always gets a ``runtime_env``
  with ``env_vars`` (Ray adds ``RAY_WARN_BLOCKING_GET_INSIDE_ASYNC`` even when nothing is
  propagated), its actors inherit it, and the raylet hands a prestarted or idle process only to
  a task or actor whose ``runtime_env`` is the one the process started with (empty, for the
  pool).
  Measured: an actor with an empty ``runtime_env`` came from the pool in 0.26 s; one with a
  single env var got a fresh process (1.1–2.2 s), also right after a task with that same env
  had run. So setting these variables on the cluster instead of in the driver, or more
  prestarted workers (``num_prestart_python_workers``, ``prestart_worker_first_driver``),
  changes nothing.
- Importing torch earlier with a ``worker_process_setup_hook``: in the job's ``runtime_env`` it
  would run in all five processes (more CPU); for the Train workers only
  (``RunConfig.worker_runtime_env``) it moves the same import earlier in a process that is busy
  importing from its start to its first epoch anyway. Not used (not measured).
- Ray 2.60 has no setting that removes the cleaner, the synchronisation actor or the dataset
  manager; the preemption watcher (above, off on a local Ray) is the one optional actor.
- The raylet starts at most as many worker processes at once as the node has CPUs (its
  ``maximum_startup_concurrency``, computed from the CPU count, no setting): on 2 cores the
  Train worker waits for the cleaner or the synchronisation actor to register first.
"""

from __future__ import annotations

import json
import os
import re

#: the environment of a quiet study's processes (a local Ray's workers inherit it; a cluster's
#: get it in the job's or the driver's ``runtime_env``): MLflow's INFO lines and its
#: "Downloading artifacts" progress bars (one per artifact read from another node's trial folder)
QUIET_ENV = {"MLFLOW_LOGGING_LEVEL": "WARNING", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}

__all__ = ["CLUSTER_TRAIN_ENV", "QUIET_ENV", "TRAIN_ENV", "apply_train_env", "train_runtime_env"]

# set by Ray's job manager in a submitted job's driver (ray._private.runtime_env.constants)
_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"

TRAIN_ENV: dict[str, str] = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.02",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}

#: on a cluster of spot or preemptible nodes Ray Train's preemption handling is wanted
CLUSTER_TRAIN_ENV: dict[str, str] = {**TRAIN_ENV, "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"}


def apply_train_env(cluster: bool = False) -> dict[str, str]:
    """Set `TRAIN_ENV` (``cluster``: `CLUSTER_TRAIN_ENV`) in this process's environment where
    the user has not; return the values in effect. Call before ``ray.init`` so that a local
    Ray's workers inherit them (Ray Train also propagates them from the process that calls
    ``TorchTrainer.fit``: the first call in a process decides).

    >>> key = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
    >>> apply_train_env()[key] == os.environ[key]
    True
    """
    for key, value in (CLUSTER_TRAIN_ENV if cluster else TRAIN_ENV).items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in TRAIN_ENV}


def train_runtime_env(address: str | None = None) -> dict[str, dict[str, str]]:
    """``runtime_env`` for a client of an existing cluster (its raylets do not see this process's
    environment): the values ``apply_train_env(cluster=True)`` puts in effect (the preemption
    watcher on), ``RAY_ADDRESS`` when ``address`` is a ``HOST:PORT`` (Ray's own processes that
    look the cluster up — Ray Train's placement-group cleaner — otherwise fail on a machine
    running several Ray instances, and a dead trial's workers keep their resources) and, where
    this process is quiet
    (`QUIET_ENV` set), the quiet settings, less any key a Ray Job's own
    ``runtime_env`` already sets (Ray refuses a driver that sets the same variable again).

    >>> set(TRAIN_ENV) <= set(train_runtime_env()["env_vars"])
    True
    >>> [train_runtime_env(a)["env_vars"].get("RAY_ADDRESS") for a in ("10.0.0.1:6379", "auto")]
    ['10.0.0.1:6379', None]
    """
    job = json.loads(os.environ.get(_JOB_CONFIG_ENV, "{}") or "{}")
    taken = ((job.get("runtime_env") or {}).get("env_vars") or {}).keys()
    quiet = {k: os.environ[k] for k in QUIET_ENV if k in os.environ}
    env = {**apply_train_env(cluster=True), **quiet}
    if address and re.fullmatch(r"[\w.\-]+:\d+", address):
        env["RAY_ADDRESS"] = address
    return {"env_vars": {k: v for k, v in env.items() if k not in taken}}
