"""Check that every node of a Ray cluster sees a storage location, before anything trains.

Since Ray 2.7, multi-node Tune and Train need storage every node reaches (ray#37177); Ray Train
checks it for its own workers with a marker file, but a study's local-mode trials (one process,
no Train workers) bypass that check, and a node with its own private copy of a path (a disk
mounted over it, an NFS mount missing on one node) writes its trials where no other node, and no
`resume`, finds them. `check_nodes_see` does what Ray's check does, for every alive node: the
driver writes a marker, one task pinned to each node (``NodeAffinitySchedulingStrategy``, hard)
reads it and writes its own answer, and the driver reads every answer back. A node that cannot
is named in one line (`StorageNotSharedError`); the markers are removed either way.

The task gets the location as the *string* a trial gets, and opens it as a trial does
(`open_storage` with the node's own environment and credentials), never the driver's client:
a node without the driver's endpoint or keys fails the probe as its trials would.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from calibtune.storage._storage import Storage, StorageError, open_storage

__all__ = ["PROBE_DIR", "StorageNotSharedError", "check_nodes_see"]

PROBE_DIR = ".calibtune-probe"
PROBE_TIMEOUT_S = 120.0  # a node's worker may need to start (and import pyarrow) first


class StorageNotSharedError(StorageError):
    """A node of the cluster cannot read or write the storage (one line naming the node)."""


def _probe_node(uri: str, token: str) -> str | None:
    """On one node: None when it reads the driver's marker and writes its own answer, else why
    not (the node's own words). ``uri``: the probe folder as trials are given their folders."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    try:
        where = open_storage(uri)
    except (OSError, ValueError) as exc:
        return f"could not open {uri}: {' '.join(str(exc).split())[:160]}"
    try:
        found = (where / f"{token}.driver").read_text()
    except FileNotFoundError:
        return f"found no marker at {where / (token + '.driver')}"
    except OSError as exc:
        return f"could not read {where}: {' '.join(str(exc).split())[:160]}"
    if found != token:
        return f"read another marker at {where}"
    try:
        (where / f"{token}.{node}").write_text(token)
    except OSError as exc:
        return f"could not write {where}: {' '.join(str(exc).split())[:160]}"
    return None


def _name(node: dict[str, Any]) -> str:
    return f"{node.get('NodeManagerAddress', '?')} (node {str(node['NodeID'])[:12]})"


def check_nodes_see(storage: Storage, key: str = "storage") -> None:
    """Refuse (`StorageNotSharedError`, one line naming the node) a ``storage`` that some alive
    node of the connected Ray cluster cannot read and write; Ray must be initialised."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = uuid.uuid4().hex
    where = storage / PROBE_DIR
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    probe = ray.remote(num_cpus=0, max_retries=0)(_probe_node)
    (where / f"{token}.driver").write_text(token)
    try:
        refs = [
            probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(where.uri, token)
            for n in nodes
        ]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
        done = set(ready)
        for node, ref in zip(nodes, refs, strict=True):
            why = ray.get(ref) if ref in done else f"did not answer within {PROBE_TIMEOUT_S:g} s"
            if why is None and not (where / f"{token}.{node['NodeID']}").is_file():
                why = f"wrote its marker where the driver cannot read it ({where})"
            if why is not None:
                raise StorageNotSharedError(
                    f"{key}: expected storage that every Ray node sees, but node {_name(node)} "
                    f"{why}; use storage all nodes share (NFS, s3://...), nothing was trained"
                )
    finally:
        with contextlib.suppress(OSError):
            for f in where.glob(f"{token}.*"):
                f.delete()
            if not where.listdir():
                where.delete()
