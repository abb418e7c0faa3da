"""The ranks of `test_collectives`: two spawned processes in one gloo process group (imported by
the spawned processes: torch, calibtune and ``ray.train``'s module, never a Ray cluster).

`trial_branches` runs the real `calibtune.trial._worker.train_loop_per_worker` under each config
branch, with Ray Train's worker context stood in by the process group (rank, world size, DDP
wrapping; a report is a barrier across ranks, as Ray Train 2's is), and records, per branch, the
sequence of ``torch.distributed`` collectives this rank entered. `bn_step` trains one DDP step of
a BatchNorm model and keeps the all-gathered validation logits of the loop's epoch end. `both`
runs the two in one process group.
"""

from __future__ import annotations

import json
import traceback
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: every ``torch.distributed`` collective calibtune's trial path might enter
COLLECTIVES = (
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "scatter",
    "scatter_object_list",
)


def _init(rank: int, world: int, init_file: str, timeout_s: float) -> Any:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),  # a rank left waiting fails instead of hanging
    )
    return dist


def _record_collectives(dist: Any, log: list[str]) -> None:
    for name in COLLECTIVES:
        real = getattr(dist, name, None)
        if real is None:
            continue

        def logged(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            log.append(_name)
            return _real(*args, **kwargs)

        setattr(dist, name, logged)


def _stand_in_for_ray_train(rank: int, world: int, dist: Any, log: list[str]) -> None:
    """Ray Train's worker API over the process group (the controller and its storage are not
    what is tested here): a report is a barrier, as in Ray Train 2, and keeps a copy of the
    checkpoint's folder (Ray uploads it to storage before `report` returns; the worker then
    removes its own)."""
    import shutil
    import tempfile

    import ray.train
    import ray.train.torch
    from torch.nn.parallel import DistributedDataParallel

    barrier = dist.barrier  # the recorded one: a report is logged as "barrier"
    reported: list[SimpleNamespace] = []

    def report(metrics: dict[str, Any], checkpoint: Any = None) -> None:
        log.append("report")
        barrier()
        if checkpoint is not None:
            kept = Path(tempfile.mkdtemp(prefix="reported-")) / "checkpoint"
            shutil.copytree(checkpoint.path, kept)
            copy = ray.train.Checkpoint.from_directory(str(kept))
            reported.append(SimpleNamespace(metrics=dict(metrics), checkpoint=copy))

    ctx = SimpleNamespace(get_world_rank=lambda: rank, get_world_size=lambda: world)
    ray.train.get_context = lambda: ctx
    ray.train.get_checkpoint = lambda: None
    ray.train.report = report
    ray.train.get_all_reported_checkpoints = lambda: list(reported)
    ray.train.torch.prepare_model = DistributedDataParallel


def both(
    rank: int, world: int, init_file: str, out: str, branches: dict[str, dict[str, Any]]
) -> None:
    """`bn_step`, then `trial_branches`, in one process group (one start-up per rank)."""
    dist = _init(rank, world, init_file, timeout_s=120)
    try:
        bn_step(rank, world, out)
    finally:
        trial_branches(rank, world, dist, out, branches)


def trial_branches(
    rank: int, world: int, dist: Any, out: str, branches: dict[str, dict[str, Any]]
) -> None:
    """Run each branch's trial config on this rank; write ``{branch: [collective, …]}`` and the
    first error to ``out/rank<r>.json``."""
    calls: dict[str, list[str]] = {}
    error = None
    try:
        log: list[str] = []
        _record_collectives(dist, log)
        _stand_in_for_ray_train(rank, world, dist, log)
        from calibtune.trial import config_from_dict, config_to_dict
        from calibtune.trial._worker import train_loop_per_worker

        for name, raw in branches.items():
            log.clear()
            calls[name] = log
            payload = {
                "config": config_to_dict(config_from_dict(raw)),
                "trial_dir": str(Path(out) / name),
                "callbacks": [],
                "tune_report": False,
            }
            train_loop_per_worker(payload)
            calls[name] = list(log)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"calls": calls, "error": error}))


def bn_step(rank: int, world: int, out: str) -> None:
    """One DDP training step (32 examples per rank) of ``small_cnn`` (BatchNorm) on digits, then
    the loop's validation pass; rank 0 saves the gathered logits and its own model's logits on
    the full validation set (one process, no sharding)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import TensorDataset

    from calibtune.data import load_splits
    from calibtune.models import build_model
    from calibtune.training import LoopSpec, dataset_tensors, infer_logits, train_epochs

    splits = load_splits("digits", seed=1, val_fraction=0.1)
    torch.manual_seed(3)
    net = build_model("small_cnn", splits.num_classes, splits.input_shape)
    model = DistributedDataParallel(net)
    caches: list[Any] = []
    spec = LoopSpec(
        model=model,
        loss_fn=torch.nn.CrossEntropyLoss(),
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        lr_at=lambda e: 0.1,
        train_set=TensorDataset(*(t[:64] for t in dataset_tensors(splits.train))),
        val_set=splits.val,
        test_set=None,
        epochs=1,
        batch_size=64,
        eval_batch_size=1024,
        rank=rank,
        world=world,
        eval_model=net,
    )
    train_epochs(spec, on_epoch_end=lambda e, m, cache: caches.append(cache))
    if rank == 0:
        mine, _ = infer_logits(net, splits.val, batch_size=1024, device=torch.device("cpu"))
        torch.save({"gathered": caches[-1].val_logits, "rank0": mine}, Path(out) / "bn.pt")
