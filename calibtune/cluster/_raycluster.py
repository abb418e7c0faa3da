"""Ray start-up for a study: a fresh local instance, or a connection to a cluster (waiting for
the nodes of a cluster that grows, `wait_for_nodes`).

The one place that reaches into Ray's private API (token authentication for clients).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from calibtune._raysettings import apply_train_env, train_runtime_env
from calibtune.cluster._nodes import check_node_versions
from calibtune.cluster._quiet import quiet_output


def _trial() -> Any:
    """The trial engine (`calibtune.trial`), for the checks that place a trial's workers."""
    # deferred: torch; compare/report/export reach this module (the preflight checks) without it
    from calibtune import trial

    return trial


# Ray is imported when a study starts or reads Ray: compare/report/export reach this module
# (through the preflight checks) without Ray.

__all__ = [
    "autoscaler_limits",
    "autoscaler_v2",
    "check_cluster",
    "check_trials_fit",
    "client_token_auth",
    "init_ray",
    "local_system_config",
    "runs_node_types",
    "shortfall",
    "trial_demand",
    "v2_infeasible",
    "wait_for_nodes",
    "waiting_line",
]


def client_token_auth() -> None:
    """Ray 2.60 clusters use token auth (~/.ray/auth_token); a client of an explicit address
    must say so with RAY_AUTH_MODE=token, and a process that already imported Ray must also
    refresh Ray's cached config. An explicit RAY_AUTH_MODE from the user is respected."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.lower() != "token":
        return
    try:
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()  # sets the variable and re-reads RayConfig
    except ImportError:  # pragma: no cover - another Ray version
        os.environ["RAY_AUTH_MODE"] = "token"


def init_ray(address: str | None = None, num_cpus: int | None = None, verbose: bool = True) -> None:
    """Connect to ``address`` or start a local Ray sized for this machine. ``verbose=False``:
    no forwarding of worker/actor logs (e.g. Ray Train's PlacementGroupCleaner lines; trial
    errors still reach the driver through Tune) and `quiet_output`."""
    import ray

    if not verbose:
        quiet_output()
    if ray.is_initialized():
        return
    level = logging.INFO if verbose else logging.WARNING
    if address:
        client_token_auth()
        ray.init(
            address=address,
            log_to_driver=verbose,
            logging_level=level,
            runtime_env=train_runtime_env(address),
        )
        return
    apply_train_env()  # the local Ray's processes inherit this environment
    total = num_cpus or os.cpu_count() or 1
    # The object store default (30% of RAM) is far more than trials on the embedded data need.
    ray.init(
        address="local",  # always a fresh local instance, never some other process's cluster
        num_cpus=total,
        object_store_memory=int(os.environ.get("CALIBTUNE_OBJECT_STORE_BYTES", 256 * 1024**2)),
        include_dashboard=False,
        log_to_driver=verbose,
        logging_level=level,
        _system_config=local_system_config(),
    )


#: how long a local Ray keeps an idle worker process beyond its soft limit (Ray's default 1 s)
IDLE_WORKER_KEEP_MS = 30_000


def local_system_config() -> dict[str, int]:
    """Ray settings of a local Ray that calibtune starts: idle worker processes are kept
    `IDLE_WORKER_KEEP_MS` (Ray kills an idle process after 1 s whenever the idle processes
    outnumber the free CPUs, its default soft limit: between one trial's seeds and the next
    trial's, while other seeds train, the seed processes, torch and MLflow imported, died and
    the next seeds paid 10–18 s each for fresh ones on the 2-core box; bench/README.md,
    "Seed processes kept between trials").
    ``RAY_idle_worker_killing_time_threshold_ms`` set by the user wins. A cluster's settings
    are its own (``ray start``).

    >>> local_system_config()["idle_worker_killing_time_threshold_ms"] >= 10_000
    True
    """
    if "RAY_idle_worker_killing_time_threshold_ms" in os.environ:
        return {}
    return {"idle_worker_killing_time_threshold_ms": IDLE_WORKER_KEEP_MS}


def check_trials_fit(
    study: Any, available: Mapping[str, float], where: str, hint: str = ""
) -> None:
    """Fail in one line (ending with ``hint``) when some trial of the study
    (`StudyConfig.scaling_configs`: its searched scaling keys at their worst) cannot fit
    ``available`` (Ray would wait forever)."""
    check_resources = _trial().check_resources

    prefix = f"{study.path}: trial." if study.path else "trial."
    for corner, cfg in study.scaling_configs():
        try:
            check_resources(cfg, available, where)
        except ValueError as exc:
            which = f" (a trial with {corner})" if corner else ""
            raise ValueError(f"{prefix}{exc}{hint}{which}") from None


def check_cluster(study: Any, wait_s: float | None = None) -> None:
    """Fail fast when the connected cluster cannot hold one trial (Ray would wait forever);
    on a cluster that can grow, wait for it first (`wait_for_nodes`): ``wait_s`` seconds
    (``--wait-for-resources``), else `AUTOSCALER_WAIT_S` when the cluster has an autoscaler
    (`autoscaler_limits`). A local Ray has none: it refuses at once, as before."""
    try:
        _check_fits(study)
    except ValueError as exc:
        limits = autoscaler_limits()
        if wait_s is None and limits is None:
            raise
        wait = AUTOSCALER_WAIT_S if wait_s is None else wait_s
        # the user's own wait may be for nodes added by hand: no autoscaler's verdict ends it
        ask = wait_s is None and limits == {} and autoscaler_v2()
        wait_for_nodes(study, exc, wait, limits, ask_autoscaler=ask)

    check_node_versions()  # every other node runs the driver's versions (none: local Ray)


def _check_fits(study: Any) -> None:
    import ray

    check_placement_on_cluster = _trial().check_placement_on_cluster

    check_trials_fit(study, ray.cluster_resources(), "the Ray cluster")
    for _, cfg in study.scaling_configs():
        if cfg.scaling.num_workers:  # STRICT_* strategies need nodes that fit (Ray would wait)
            check_placement_on_cluster(cfg.scaling)


# ------------------------------------------------------------------------- clusters that grow

#: how long a study waits for an autoscaler's nodes when ``--wait-for-resources`` is not given
AUTOSCALER_WAIT_S = 600.0
#: seconds between two looks at the cluster while waiting
WAIT_POLL_S = 2.0
#: seconds between two waiting lines when stderr is not a terminal (a log)
LOG_EVERY_S = 15.0


def autoscaler_limits() -> dict[str, float] | None:
    """What the connected cluster's autoscaler could grow it to (resource -> the most the
    cluster can hold), from the node groups it publishes in the GCS (as Ray Data reads them,
    ``is_autoscaling_enabled``), when one of them can grow; ``{}`` (it can grow, to what is not
    known) when Ray's v1 autoscaler runs with node types of its own (`runs_node_types`: the
    cluster launcher, KubeRay's v1 autoscaler, ``ray.cluster_utils.AutoscalingCluster``), which
    publishes the nodes it runs but not the node types it could add, and when Ray's v2
    autoscaler runs (`autoscaler_v2`: it publishes neither, and says only once asked whether a
    demand fits one of its node types, `v2_infeasible`); None otherwise: a local Ray, or a fixed
    cluster (``ray start --head`` runs the v1 autoscaler read-only; ``--wait-for-resources``
    says the cluster will grow)."""
    import ray
    from ray._private import state

    if not ray.is_initialized():
        return None
    try:
        config = state.state.get_cluster_config()
        groups = list(config.node_group_configs) if config else []
        if any(
            g.max_count == -1 or g.max_count > g.min_count
            for g in groups
            if g.resources and g.max_count != 0
        ):
            limits = state.state.get_max_resources_from_cluster_config() or {}
            return {k: float(v) for k, v in limits.items()}
        return {} if runs_node_types(_v1_status()) or autoscaler_v2() else None
    except Exception:  # pragma: no cover - another Ray version: no autoscaler known
        return None


def autoscaler_v2() -> bool:
    """Whether the connected cluster runs Ray's v2 autoscaler (the GCS's flag, set by a head
    started with ``RAY_enable_autoscaler_v2=1``: KubeRay's v2 autoscaler, the cluster launcher's;
    a fixed cluster's is its read-only mode, whose node types are the nodes it has)."""
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    return bool(is_autoscaler_v2(fetch_from_server=True))


def v2_infeasible(demand: list[Mapping[str, float]]) -> list[dict[str, float]]:
    """The bundles of ``demand`` (asked for with `_request`) that Ray's v2 autoscaler has found
    none of its node types can hold (its state in the GCS, `infeasible_bundles`, one autoscaler
    round after the request); ``[]`` under v1 and while it has not decided."""
    import ray

    try:
        from ray._raylet import GcsClient
        from ray.core.generated.autoscaler_pb2 import GetClusterStatusReply

        gcs = GcsClient(ray.get_runtime_context().gcs_address)
        reply = GetClusterStatusReply.FromString(gcs.get_cluster_status(timeout_s=10))
    except Exception:  # pragma: no cover - another Ray version or a GCS briefly away
        return []
    return infeasible_bundles(reply.autoscaling_state, demand)


def infeasible_bundles(state: Any, demand: list[Mapping[str, float]]) -> list[dict[str, float]]:
    """The bundles of ``demand`` that a v2 autoscaling state (``autoscaler_pb2.AutoscalingState``)
    lists as infeasible cluster resource constraints (what `request_resources` posts).

    >>> from ray.core.generated.autoscaler_pb2 import AutoscalingState
    >>> state = AutoscalingState()
    >>> bundle = state.infeasible_cluster_resource_constraints.add().resource_requests.add()
    >>> bundle.request.resources_bundle.update({"CPU": 1.0, "GPU": 1.0})
    >>> infeasible_bundles(state, [{"CPU": 1.0, "GPU": 1.0}])
    [{'CPU': 1.0, 'GPU': 1.0}]
    >>> infeasible_bundles(state, [{"CPU": 1.0}])
    []
    """
    listed = [
        {k: float(v) for k, v in r.request.resources_bundle.items()}
        for c in state.infeasible_cluster_resource_constraints
        for r in c.resource_requests
    ]
    return [dict(b) for b in demand if dict(b) in listed]


def _v1_status() -> dict[str, Any]:
    """The v1 autoscaler's last status (what ``ray status`` prints), {} when there is none."""
    import json

    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    return json.loads(raw) if raw else {}


def runs_node_types(status: Mapping[str, Any]) -> bool:
    """Whether the v1 autoscaler's status (``__autoscaling_status`` in the GCS) names node types
    of a cluster config: its read-only mode, which cannot launch a node, names each node's type
    after the node (``node_<id>``).

    >>> runs_node_types({"autoscaler_report": {"node_type_mapping": {"ab01": "node_ab01"}}})
    False
    >>> runs_node_types({"autoscaler_report": {"node_type_mapping": {"ab01": "ray.head.default"}}})
    True
    """
    types = (status.get("autoscaler_report") or {}).get("node_type_mapping") or {}
    return any(kind != f"node_{node}" for node, kind in types.items())


def trial_demand(study: Any) -> list[dict[str, float]]:
    """The bundles of one seed of the study's largest trial (`StudyConfig.scaling_configs` at
    their worst): one per worker, one in local mode. A trial starts when one seed fits (its
    other seeds wait in Ray's queue, where an autoscaler sees them)."""
    worker_bundle = _trial().worker_bundle

    best: list[dict[str, float]] = []
    for _, cfg in study.scaling_configs():
        bundle = {k: v for k, v in worker_bundle(cfg.scaling).items() if v > 0}
        bundles = [bundle] * max(cfg.scaling.num_workers, 1)
        if sum(sum(b.values()) for b in bundles) > sum(sum(b.values()) for b in best):
            best = bundles
    return best


def shortfall(demand: list[Mapping[str, float]], have: Mapping[str, float]) -> dict[str, float]:
    """Resource -> how much more of it ``demand`` needs than ``have`` holds.

    >>> shortfall([{"CPU": 1.0, "GPU": 1.0}] * 2, {"CPU": 8.0, "GPU": 1.0})
    {'GPU': 1.0}
    """
    need: dict[str, float] = {}
    for b in demand:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    return {k: v - float(have.get(k, 0.0)) for k, v in need.items() if v > have.get(k, 0.0) + 1e-9}


def waiting_line(missing: Mapping[str, float], waited: float, limit: float) -> str:
    """``waiting for 1 GPU: 0:42 of 10:00``.

    >>> waiting_line({"GPU": 1.0, "CPU": 2.0}, 42, 600)
    'waiting for 2 CPU, 1 GPU: 0:42 of 10:00'
    """
    return f"waiting for {_amounts(missing)}: {_clock(waited)} of {_clock(limit)}"


def _amounts(resources: Mapping[str, float]) -> str:
    """``2 CPU, 1 GPU``: resources by name, each with its amount."""
    return ", ".join(f"{v:g} {k}" for k, v in sorted(resources.items()))


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


def wait_for_nodes(
    study: Any,
    refusal: ValueError,
    wait_s: float,
    limits: Mapping[str, float] | None,
    ask_autoscaler: bool = False,
) -> None:
    """Wait up to ``wait_s`` for the cluster to hold the study's largest trial (asking the
    autoscaler for it, `request_resources`), printing `waiting_line` every `WAIT_POLL_S`
    seconds (one line rewritten on a terminal); refuse in one line (``refusal``'s, with the
    reason) when the autoscaler's node types cannot hold it (``limits``; with
    ``ask_autoscaler``, the cluster's v2 autoscaler's verdict, `v2_infeasible`) or the wait
    expires."""
    import ray

    demand = trial_demand(study)
    cannot = shortfall(demand, limits) if limits else {}
    if cannot:
        what = ", ".join(f"{v:g} more {k}" for k, v in sorted(cannot.items()))
        raise ValueError(f"{refusal}; the cluster's autoscaler cannot add {what}") from None
    _request(demand)
    t0, shown = time.monotonic(), -math.inf
    tty = sys.stderr.isatty()
    try:
        while True:
            waited = time.monotonic() - t0
            if tty or waited - shown >= LOG_EVERY_S or waited >= wait_s:  # a log: a line a while
                shown = waited
                line = waiting_line(shortfall(demand, ray.cluster_resources()), waited, wait_s)
                end = "" if tty else "\n"
                print(
                    f"\r[calibtune] {line}" if tty else f"[calibtune] {line}",
                    end=end,
                    file=sys.stderr,
                    flush=True,
                )
            if waited >= wait_s:
                raise ValueError(
                    f"{refusal} (waited {_clock(wait_s)} for the cluster to grow)"
                ) from None
            time.sleep(min(WAIT_POLL_S, max(wait_s - waited, 0.05)))
            if ask_autoscaler and (cannot := v2_infeasible(demand)):
                raise ValueError(
                    f"{refusal}; the cluster's autoscaler has no node type for "
                    f"{_amounts(cannot[0])}"
                ) from None
            try:
                _check_fits(study)
                return
            except ValueError as exc:
                refusal = exc
    finally:
        if tty:
            print(file=sys.stderr, flush=True)
        _request([])


def _request(bundles: list[dict[str, float]]) -> None:
    """Ask the autoscaler (if any) for ``bundles`` (``[]``: withdraw the request)."""
    try:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=bundles)
    except Exception:  # pragma: no cover - no autoscaler API: the pending trials ask
        pass
