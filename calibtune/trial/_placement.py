"""Where a trial's ranks ran: one record per rank, gathered on rank 0 into ``workers.json``.

``scaling.placement_strategy`` decides how Ray places the trial's worker bundles (``PACK``: as few
nodes as possible; ``SPREAD``: one per node where it can; ``STRICT_*``: or not at all). This module
records the outcome, so that a study can show that one trial's DDP really spanned several nodes:
each rank contributes ``{"rank", "node_id", "hostname", "pid"}`` (the Ray node id, the host and
the process that trained), rank 0 writes them with the attempt's starting epoch to
``<trial>/artifacts/workers.json`` at the start of every attempt (a restart after a worker failure
overwrites it), and the study tags the trial's MLflow run with the ranks' node ids
(`TAG_WORKER_NODES`).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from calibtune._io import atomic_write

# Lazy: Ray only in the functions that ask a running cluster, so that `import calibtune.trial`
# does not load Ray.

__all__ = [
    "TAG_WORKER_NODES",
    "WORKERS_FILE",
    "check_placement",
    "check_placement_on_cluster",
    "hold_share",
    "indexed_device",
    "memory_cap",
    "process_overhead",
    "record_placement",
    "worker_bundle",
    "worker_nodes_tag",
]

WORKERS_FILE = "workers.json"
TAG_WORKER_NODES = "calibtune.worker_nodes"  # the ranks' Ray node ids, in rank order, ","-joined


def worker_bundle(scaling: Any) -> dict[str, float]:
    """One worker's Ray resources (in local mode, the trial's own process): ``CPU`` 1 and, with
    ``use_gpu``, ``GPU`` 1, each replaced by ``resources_per_worker`` where it names them (a
    fractional ``GPU`` too: GPU packing)."""
    bundle = {"CPU": 1.0, **({"GPU": 1.0} if scaling.use_gpu else {})}
    bundle.update(scaling.resources_per_worker)
    return bundle


def indexed_device(device: torch.device | str) -> torch.device:
    """``device`` with an index where CUDA needs one: ``cuda`` becomes ``cuda:<current device>``
    (torch's memory-fraction, RNG and NVML calls refuse an unindexed CUDA device); any other
    device as it is.

    >>> indexed_device("cpu"), indexed_device("cuda:1")
    (device(type='cpu'), device(type='cuda', index=1))
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


#: The most a process's CUDA context and library handles are taken to hold outside the caching
#: allocator when NVML cannot say (measured on the device: ≈ 0.5 GiB on an H100 with cuBLAS and
#: cuDNN loaded); the fallback's device-wide reading also counts other processes' memory.
MAX_CONTEXT_OVERHEAD = 2 * 2**30


def _nvml_process_used(device: torch.device) -> int | None:
    """This process's memory on ``device`` as NVML reports it (context, library workspaces and
    the caching allocator's reservations), or None where NVML is missing or does not list this
    process (a PID namespace: NVML reports the host's pids)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        index = torch.cuda._get_nvml_device_index(device)
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # no NVML, no driver library, an old driver: fall back
        return None
    used = [p.usedGpuMemory for p in procs if p.pid == os.getpid() and p.usedGpuMemory]
    return int(used[0]) if used else None


def process_overhead(device: torch.device) -> tuple[int, int, str]:
    """``(overhead, total)`` bytes of this process on the CUDA ``device`` and how it was measured:
    the memory it holds outside the caching allocator (CUDA context, cuBLAS/cuDNN handles), read
    once the context exists (``torch.cuda.mem_get_info`` creates it).

    overhead = NVML's per-process use − ``memory_reserved`` (``"nvml"``), else
    min(total − free − ``memory_reserved``, `MAX_CONTEXT_OVERHEAD`) (``"mem_get_info"``)."""
    free, total = torch.cuda.mem_get_info(device)
    reserved = int(torch.cuda.memory_reserved(device))
    used = _nvml_process_used(device)
    if used is not None:
        return max(0, used - reserved), int(total), "nvml"
    return (
        max(0, min(int(total) - int(free) - reserved, MAX_CONTEXT_OVERHEAD)),
        int(total),
        ("mem_get_info"),
    )


def memory_cap(share: float, total: int, overhead: int) -> float:
    """The caching allocator's fraction of the device for a process holding ``share`` of it:
    ``(share · total − overhead) / total``, so that the process's whole footprint, its context
    included, is its share, and ``1/share`` packed processes fit on the device together
    (``n · (share·total − overhead) + n · overhead = total``; capping the allocator at
    ``share · (total − overhead)`` would leave ``(n − 1) · overhead`` too many bytes). 1.0 for a
    whole device (no cap: it resets a reused process's earlier one).

    >>> memory_cap(0.25, 80 * 2**30, 2**30)
    0.2375
    >>> memory_cap(1.0, 80 * 2**30, 2**30)
    1.0
    """
    if share >= 1.0:
        return 1.0
    return max(share * total - overhead, 0) / total


def hold_share(bundle: Mapping[str, float], device: torch.device | str) -> dict[str, Any]:
    """Keep this trial process to the share of the machine its Ray ``bundle`` holds
    (`worker_bundle`): four trials packed with ``{GPU: 0.25}`` must not each grow the caching
    allocator over the whole device, nor each start one inductor compile worker per core.

    * GPU: ``torch.cuda.set_per_process_memory_fraction(memory_cap(f, total, overhead), d)``
      with ``f`` the bundle's ``GPU`` (capped at 1), ``d`` the `indexed_device` (a local trial's
      ``cuda`` is the current device) and ``overhead`` this process's memory outside the
      allocator (`process_overhead`). An allocation beyond the cap raises CUDA's out-of-memory
      error in this trial only. Only on a CUDA device.
    * CPU: ``TORCHINDUCTOR_COMPILE_THREADS`` = the bundle's whole ``CPU`` count (at least 1), and
      inductor's ``compile_threads`` when it is imported already (it reads the variable once).

    Returns ``{"compile_threads": n, "gpu_memory_fraction": cap or None}``.

    >>> hold_share({"CPU": 2.0}, torch.device("cpu"))
    {'compile_threads': 2, 'gpu_memory_fraction': None}
    """
    threads = max(1, int(float(bundle.get("CPU", 1.0))))
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.compile_threads = threads  # type: ignore[attr-defined]
    share = min(float(bundle.get("GPU", 0.0)), 1.0)
    device = torch.device(device)
    if device.type != "cuda" or share <= 0:
        return {"compile_threads": threads, "gpu_memory_fraction": None}
    device = indexed_device(device)
    cap = 1.0
    if share < 1.0:
        overhead, total, _how = process_overhead(device)
        cap = memory_cap(share, total, overhead)
    torch.cuda.set_per_process_memory_fraction(float(cap), device)
    return {"compile_threads": threads, "gpu_memory_fraction": cap}


def check_placement(
    strategy: str,
    num_workers: int,
    bundle: Mapping[str, float],
    nodes: Sequence[Mapping[str, float]],
) -> None:
    """Fail fast where Ray would wait forever (Ray Train retries the worker-group start every
    60 s): ``STRICT_SPREAD`` needs ``num_workers`` nodes that each hold one worker's ``bundle``
    (e.g. ``{"CPU": 1}``), ``STRICT_PACK`` one node that holds them all. ``nodes``: each alive
    node's total resources (``ray.nodes()[i]["Resources"]``)."""

    def holds(node: Mapping[str, float], times: int) -> bool:
        return all(float(node.get(k, 0.0)) + 1e-9 >= v * times for k, v in bundle.items())

    want = ", ".join(f"{k} {v:g}" for k, v in sorted(bundle.items()))
    if strategy == "STRICT_SPREAD":
        fit = sum(holds(n, 1) for n in nodes)
        if fit < num_workers:
            raise ValueError(
                f"scaling.placement_strategy: STRICT_SPREAD expected {num_workers} nodes with "
                f"{want} each, got {fit} in the Ray cluster; use SPREAD or fewer workers"
            )
    elif (
        strategy == "STRICT_PACK"
        and num_workers > 0
        and not any(holds(n, num_workers) for n in nodes)
    ):
        raise ValueError(
            f"scaling.placement_strategy: STRICT_PACK expected a node with {num_workers} × "
            f"({want}), got none in the Ray cluster; use PACK or fewer workers"
        )


def check_placement_on_cluster(scaling: Any) -> None:
    """`check_placement` for a trial's ``scaling`` config against the connected Ray cluster
    (each worker's `worker_bundle`)."""
    import ray

    bundle = worker_bundle(scaling)
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    check_placement(scaling.placement_strategy, scaling.num_workers, bundle, nodes)


def rank_record(rank: int) -> dict[str, Any]:
    """This process's place: Ray node id (None outside Ray), host name and pid."""
    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    return {"rank": rank, "node_id": node, "hostname": socket.gethostname(), "pid": os.getpid()}


def gather_ranks(rank: int, world: int) -> list[dict[str, Any]]:
    """Every rank's `rank_record`, in rank order, on every rank (one all-gather when world > 1:
    it must be called by all ranks of the process group)."""
    mine = rank_record(rank)
    if world <= 1:
        return [mine]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, mine)
    return sorted(out, key=lambda r: r["rank"])


def write_workers(artifacts: Path, ranks: Sequence[Mapping[str, Any]], start_epoch: int) -> Path:
    """Write ``workers.json`` (atomically: a reader never sees half a file)."""
    path = artifacts / WORKERS_FILE  # a folder of the storage owner: a disk or a bucket
    record = {"started_at": time.time(), "start_epoch": start_epoch, "ranks": list(ranks)}
    atomic_write(path, json.dumps(record, indent=1))
    return path


def record_placement(
    artifacts: Path, rank: int, world: int, start_epoch: int
) -> list[dict[str, Any]]:
    """Gather every rank's place (collective: call on all ranks); rank 0 writes ``workers.json``."""
    ranks = gather_ranks(rank, world)
    if rank == 0:
        write_workers(artifacts, ranks, start_epoch)
    return ranks


def worker_nodes_tag(artifacts: Path) -> str | None:
    """The `TAG_WORKER_NODES` value from ``workers.json`` (None without the file, or outside
    Ray, where ranks have no node id)."""
    path = Path(artifacts) / WORKERS_FILE
    if not path.is_file():
        return None
    nodes = [r["node_id"] for r in json.loads(path.read_text())["ranks"]]
    if not any(nodes):
        return None
    return ",".join(map(str, nodes))[:5000]  # MLflow's tag length limit; all of it is in the file
