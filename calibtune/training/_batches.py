"""Deterministic, rank-sharded batching and sharded inference with cached logits.

No Ray here: sharding uses ``rank``/``world`` integers and `torch.distributed` collectives when a
process group is initialised, so the loop runs (and is tested) in a bare process too.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

__all__ = [
    "dataset_tensors",
    "epoch_index_batches",
    "gather_rows",
    "infer_logits",
    "iterate_batches",
    "world_info",
]


def world_info() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def dataset_tensors(dataset: Dataset) -> tuple[Tensor, Tensor] | None:
    """The ``(x, y)`` tensors behind an in-memory dataset, or None for a lazily loaded one."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, tuple | list) and len(tensors) == 2:
        return tensors[0], tensors[1]
    return None


def epoch_index_batches(
    n: int, batch_size: int, *, seed: int, epoch: int, rank: int = 0, world: int = 1
) -> list[Tensor]:
    """This rank's index batches for one epoch of a global batch of ``batch_size`` examples.

    One permutation per ``(seed, epoch)``, identical on all ranks; it is padded by wrapping
    around (like ``DistributedSampler``) to a multiple of ``world`` and global batch ``b`` is
    ``perm[b·B:(b+1)·B]`` split round-robin, so one worker with batch B and W workers with
    B/W each see the same global batches.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g)
    pad = (-n) % world
    if pad:
        perm = torch.cat([perm, perm[:pad]])
    per_rank = max(1, batch_size // world)
    shard = perm[rank::world]
    return list(torch.split(shard, per_rank))


def iterate_batches(
    dataset: Dataset, index_batches: list[Tensor], num_workers: int = 0
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield ``(x, y)`` for each index batch: tensor slicing for in-memory data, else a loader."""
    tensors = dataset_tensors(dataset)
    if tensors is not None:
        x, y = tensors
        for idx in index_batches:
            yield x[idx], y[idx]
        return
    loader = DataLoader(
        dataset,
        batch_sampler=[b.tolist() for b in index_batches],
        num_workers=num_workers,
        persistent_workers=False,
    )
    yield from loader


def gather_rows(local: Tensor, n_total: int, world: int) -> Tensor:
    """Reassemble rows sharded round-robin (row i lives on rank i % world) on every rank."""
    if world == 1:
        return local
    rows = -(-n_total // world)
    padded = local.new_zeros((rows, *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous())
    out = local.new_empty((n_total, *local.shape[1:]))
    for r, part in enumerate(parts):
        out[r::world] = part[: len(range(r, n_total, world))]
    return out


@torch.no_grad()
def infer_logits(
    model: nn.Module,
    dataset: Dataset,
    *,
    batch_size: int,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
    num_workers: int = 0,
) -> tuple[Tensor, Tensor]:
    """One inference pass: logits ``(N, K)`` (float32, CPU) and labels ``(N,)`` in dataset order.

    Each rank scores rows ``rank::world`` and the rows are all-gathered, so every rank ends with
    the same full arrays; the caller restores ``model.train()`` if it was training.
    """
    n = len(dataset)  # type: ignore[arg-type]
    mine = torch.arange(rank, n, world)
    was_training = model.training
    model.eval()
    outs, labels = [], []
    for x, y in iterate_batches(dataset, list(torch.split(mine, batch_size)), num_workers):
        outs.append(model(x.to(device, non_blocking=True)).float())
        labels.append(y.to(device))
    model.train(was_training)
    k = outs[0].shape[1] if outs else 0
    logits = torch.cat(outs) if outs else torch.empty(0, k, device=device)
    y_all = torch.cat(labels) if labels else torch.empty(0, dtype=torch.long, device=device)
    logits = gather_rows(logits, n, world)
    y_all = gather_rows(y_all.long(), n, world)
    return logits.cpu(), y_all.cpu()
