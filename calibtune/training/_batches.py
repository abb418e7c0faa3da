"""The one owner of the batches the training loop sees, on the trial's device.

Deterministic, rank-sharded batching (`epoch_index_batches`), sharded inference with cached
logits (`infer_logits`) and `DeviceBatches`, which hands the loop ``(x, y)`` batches already on
the trial's device, whatever the source:

* **resident** in-memory sets — a ``TensorDataset`` (digits, mnist1d) or uint8
  `calibtune.data.NormalizedImages` (CIFAR-10/100: ~150 MB; Tiny-ImageNet decoded once:
  ~1.3 GB) — are uploaded once per trial; a
  batch is indexed on the device, augmented there (the dataset's batch augmentation, vectorised)
  and normalised in one fused ``x·scale + shift`` (airbench, Jordan 2024, keeps CIFAR on the GPU
  the same way);
* **token documents** (`calibtune.data.TokenDocuments`: 20 Newsgroups) keep their int64 token
  ids and embedding table resident; each batch is cut to its longest document (zeros in front)
  and embedded on the device, ``x`` float ``(B, D, T)``;
* **streamed** sets (any other map-style dataset) go through one ``DataLoader`` per owner, with
  persistent workers and pinned memory on CUDA, copied to the device without blocking.

On the CPU with ``loader_workers > 0`` the CIFAR and Tiny-ImageNet images keep the parallel
``DataLoader`` path (its workers augment in parallel; one in-process pass would be slower on a
busy CPU).
No Ray here: sharding uses ``rank``/``world`` integers and `torch.distributed` collectives when a
process group is initialised, so the loop runs (and is tested) in a bare process too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Sampler

from calibtune.training._precision import float32_head

__all__ = [
    "DeviceBatches",
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

    >>> [b.tolist() for b in epoch_index_batches(5, 2, seed=0, epoch=1)]  # doctest: +SKIP
    [[4, 1], [0, 3], [2]]
    >>> [len(b) for b in epoch_index_batches(5, 2, seed=0, epoch=1)]
    [2, 2, 1]
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
    """Yield CPU ``(x, y)`` for each index batch (no augmentation): tensor slicing for
    in-memory data, else a loader. The trial path uses `DeviceBatches`."""
    yield from DeviceBatches(dataset, torch.device("cpu"), num_workers=num_workers).batches(
        index_batches
    )


class _Batches(Sampler[list[int]]):
    """A batch sampler whose batches are replaced every epoch (one persistent loader)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class DeviceBatches:
    """``(x, y)`` batches of ``dataset`` on ``device``: the loop's one source of batches.

    ``augment``: the batch augmentation ``(B, …) -> (B, …)`` of normalised in-memory data
    (`calibtune.data.Splits.augment`), applied by ``batches(…, train=True)`` only. For uint8
    images the dataset's own ``batch_transform`` (on raw 0–255 pixels) plays that role. ``x`` is
    float32 (normalised), ``y`` int64, both on ``device``; augmentation draws from ``device``'s
    global RNG. With ``mix`` set (a mixup-family loss's ``batch_transform``), each training batch
    is mixed after augmentation and ``y`` is the loss's targets (their ``labels`` the clean
    rows', which come first).

    >>> ds = torch.utils.data.TensorDataset(torch.arange(6.0).view(3, 2), torch.tensor([0, 1, 2]))
    >>> [y.tolist() for _, y in DeviceBatches(ds, torch.device("cpu")).batches(
    ...     [torch.tensor([2, 0]), torch.tensor([1])])]
    [[2, 0], [1]]
    """

    def __init__(
        self,
        dataset: Dataset,
        device: torch.device,
        *,
        augment: Callable[[Tensor], Tensor] | None = None,
        num_workers: int = 0,
        channels_last: bool = False,
    ) -> None:
        self.dataset, self.device, self.augment = dataset, torch.device(device), augment
        self.num_workers, self.channels_last = num_workers, channels_last
        self._x: Tensor | None = None  # resident data (uploaded on first use)
        self._y: Tensor | None = None
        self._vectors: Tensor | None = None  # token documents' embedding table, on the device
        self._loader: DataLoader | None = None
        self._sampler = _Batches()
        # ``(x, y) -> (inputs, targets)`` of training batches after augmentation: a mixup-family
        # loss's ``batch_transform`` (the clean rows first; ``targets.labels`` are theirs)
        self.mix: Callable[[Tensor, Tensor], tuple[Tensor, Any]] | None = None
        self.resident = self._source() is not None

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def _source(self) -> tuple[Tensor, Tensor] | None:
        tensors = dataset_tensors(self.dataset)
        if tensors is not None:
            return tensors
        tokens, vectors = (getattr(self.dataset, a, None) for a in ("tokens", "vectors"))
        if isinstance(tokens, Tensor) and isinstance(vectors, Tensor):
            return tokens, self.dataset.labels  # type: ignore[attr-defined]  # TokenDocuments
        images = getattr(self.dataset, "images", None)
        labels = getattr(self.dataset, "labels", None)
        if not (isinstance(images, Tensor) and isinstance(labels, Tensor)):
            return None
        if self.device.type == "cpu" and self.num_workers > 0:
            return None  # keep the loader's parallel workers on a CPU
        if getattr(self.dataset, "transform", None) is not None and not self._raw_augment():
            return None  # a per-sample transform with no batched twin: only the loader runs it
        return images, labels

    def _raw_augment(self) -> Callable[[Tensor], Tensor] | None:
        return getattr(self.dataset, "batch_transform", None)

    def _upload(self) -> tuple[Tensor, Tensor]:
        if self._x is None or self._y is None:
            x, y = self._source()  # type: ignore[misc]
            self._x = x.to(self.device, non_blocking=True)
            self._y = y.to(self.device, dtype=torch.int64, non_blocking=True)
            vectors = getattr(self.dataset, "vectors", None)
            if isinstance(vectors, Tensor) and x.dtype == torch.int64:  # token documents
                self._vectors = vectors.to(self.device)
            scale = getattr(self.dataset, "_scale", None)
            if isinstance(scale, Tensor):  # uint8 images: normalised per batch, fused
                self._scale = scale.to(self.device)
                self._shift = self.dataset._shift.to(self.device)  # type: ignore[attr-defined]
        return self._x, self._y

    def batches(
        self, index_batches: Sequence[Tensor], *, train: bool = False
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield the batches ``dataset[idx]`` for each ``idx`` of ``index_batches``, in order."""
        stream = self._resident if self.resident else self._streamed
        for x, y in stream(index_batches, train):
            if train and self.augment is not None:
                x = self.augment(x)
            target: Any = y
            if train and self.mix is not None:
                x, target = self.mix(x, y)
            if self.channels_last and x.ndim == 4:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, target

    def _resident(
        self, index_batches: Sequence[Tensor], train: bool
    ) -> Iterator[tuple[Tensor, Tensor]]:
        x_all, y_all = self._upload()
        if not index_batches:
            return
        sizes = [len(b) for b in index_batches]
        # one host-to-device copy of the epoch's indices, split on the device
        idx_all = torch.cat(list(index_batches)).to(self.device, non_blocking=True)
        raw = self._raw_augment() if train else None
        for index, idx in zip(index_batches, torch.split(idx_all, sizes), strict=True):
            if self._vectors is not None:
                # token documents: cut to the batch's longest document (its width is read from
                # the CPU lengths, no device sync), then embedded here as (B, D, width)
                width = self.dataset.width(index)  # type: ignore[attr-defined]
                tokens = x_all[:, x_all.shape[1] - width :][idx]
                x = nn.functional.embedding(tokens, self._vectors).transpose(1, 2)
                yield x, y_all[idx]
                continue
            x = x_all[idx]
            if x.dtype == torch.uint8:
                x = x.float()
                if raw is not None:
                    x = raw(x)
                x = torch.addcmul(self._shift, x, self._scale)
            yield x, y_all[idx]

    def _streamed(
        self, index_batches: Sequence[Tensor], train: bool
    ) -> Iterator[tuple[Tensor, Tensor]]:
        self._sampler.batches = [b.tolist() for b in index_batches]
        if self._loader is None:
            cuda = self.device.type == "cuda"
            self._loader = DataLoader(
                self.dataset,
                batch_sampler=self._sampler,
                num_workers=self.num_workers,
                persistent_workers=self.num_workers > 0,
                pin_memory=cuda,
            )
        for x, y in self._loader:
            yield (
                x.to(self.device, non_blocking=True),
                y.to(self.device, dtype=torch.int64, non_blocking=True),
            )


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
    dataset: Dataset | DeviceBatches,
    *,
    batch_size: int,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
    num_workers: int = 0,
    autocast: Callable[[], object] | None = None,
) -> tuple[Tensor, Tensor]:
    """One inference pass: logits ``(N, K)`` (float32, CPU) and labels ``(N,)`` in dataset order.

    ``dataset``: a dataset or the `DeviceBatches` owning it (its resident copy is reused).
    Each rank scores rows ``rank::world`` and the rows are all-gathered, so every rank ends with
    the same full arrays; the caller restores ``model.train()`` if it was training. The one
    device-to-host copy is at the end; ``autocast`` (a context factory) wraps the forwards, whose
    classifier then computes in float32 (`calibtune.training.float32_head`): the logits are
    float32 from the head, not upcast bf16/fp16.
    """
    if autocast is not None:
        float32_head(model)
    source = (
        dataset
        if isinstance(dataset, DeviceBatches)
        else DeviceBatches(dataset, device, num_workers=num_workers)
    )
    n = len(source)
    mine = torch.arange(rank, n, world)
    was_training = model.training
    model.eval()
    outs, labels = [], []
    for x, y in source.batches(list(torch.split(mine, batch_size))):
        if autocast is None:
            out = model(x)
        else:
            with autocast():  # type: ignore[attr-defined]
                out = model(x)
        outs.append(out.float())
        labels.append(y)
    model.train(was_training)
    k = outs[0].shape[1] if outs else 0
    logits = torch.cat(outs) if outs else torch.empty(0, k, device=device)
    y_all = torch.cat(labels) if labels else torch.empty(0, dtype=torch.long, device=device)
    logits = gather_rows(logits, n, world)
    y_all = gather_rows(y_all.long(), n, world)
    return logits.cpu(), y_all.cpu()
