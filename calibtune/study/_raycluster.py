"""Ray start-up for a study: a fresh local instance, or a connection to a cluster.

The one place that reaches into Ray's private API (token authentication for clients).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from calibtune._raysettings import apply_train_env, train_runtime_env
from calibtune.study._display import quiet_output

# Lazy: Ray and `calibtune.trial` (torch) are imported when a study starts Ray, so that the CLI
# can import this module for its job client without them (bench/bench_cli.py).

__all__ = ["check_cluster", "check_trials_fit", "client_token_auth", "init_ray"]


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
            runtime_env=train_runtime_env(),
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
    )


def check_trials_fit(
    study: Any, available: Mapping[str, float], where: str, hint: str = ""
) -> None:
    """Fail in one line (ending with ``hint``) when some trial of the study
    (`StudyConfig.scaling_configs`: its searched scaling keys at their worst) cannot fit
    ``available`` (Ray would wait forever)."""
    from calibtune.trial import check_resources

    prefix = f"{study.path}: trial." if study.path else "trial."
    for corner, cfg in study.scaling_configs():
        try:
            check_resources(cfg, available, where)
        except ValueError as exc:
            which = f" (a trial with {corner})" if corner else ""
            raise ValueError(f"{prefix}{exc}{hint}{which}") from None


def check_cluster(study: Any) -> None:
    """Fail fast when the connected cluster cannot hold one trial (Ray would wait forever)."""
    import ray

    from calibtune.trial import check_placement_on_cluster

    check_trials_fit(study, ray.cluster_resources(), "the Ray cluster")
    for _, cfg in study.scaling_configs():
        if cfg.scaling.num_workers:  # STRICT_* strategies need nodes that fit (Ray would wait)
            check_placement_on_cluster(cfg.scaling)
    from calibtune.study._nodes import check_node_versions

    check_node_versions()  # every other node runs the driver's versions (none: local Ray)
