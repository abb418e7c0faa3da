"""Content digests of the data a trial trains and evaluates on (data lineage).

A digest is a BLAKE2b hash of the tensors themselves (dtype, shape, bytes) as the trial gets
them — uint8 images plus labels plus the normalisation for `NormalizedImages`, the float tensors
of a `TensorDataset` — so two trials with equal digests saw the same samples, whatever files or
code produced them. Hashing runs at ~1 GB/s: digits takes milliseconds, the CIFAR-10 splits well
under a second; `data_inputs` caches per process (a Tune actor reused across trials pays once).
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from ._common import NormalizedImages
from ._datasets import load_splits
from ._ood import default_ood, load_ood, ood_severities
from ._shift import default_shift, load_shift, shift_severities

__all__ = ["DataInput", "array_digest", "data_inputs", "dataset_digest"]

#: the contexts of `DataInput`, as MLflow's ``mlflow.data.context`` input tag
CONTEXTS = ("training", "validation", "test", "ood", "shift")


@dataclass(frozen=True)
class DataInput:
    """One dataset a trial used: ``name`` (``digits/train``, ``ood/svhn``,
    ``shift/digits_noise/s3``), ``context`` (one of `CONTEXTS`), ``digest`` and
    ``num_samples``."""

    name: str
    context: str
    digest: str
    num_samples: int


def array_digest(*arrays: Any) -> str:
    """16 hex digits over the dtype, shape and bytes of each array, in order.

    >>> array_digest(torch.arange(3)) == array_digest(torch.arange(3))
    True
    >>> array_digest(torch.arange(3)) == array_digest(torch.arange(3).float())
    False
    """
    h = hashlib.blake2b(digest_size=8)
    for a in arrays:
        t = torch.as_tensor(a).detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.numpy().reshape(-1).view("uint8").data)
    return h.hexdigest()


def dataset_digest(ds: Dataset) -> str:
    """`array_digest` of an in-memory split or set (`NormalizedImages`: its uint8 images,
    labels and normalisation; `TensorDataset`: its tensors); any other dataset is read
    sample by sample (no augmentation is applied by these splits' ``__getitem__`` but the
    training split's, whose stored images are what `NormalizedImages` hashes)."""
    if isinstance(ds, NormalizedImages):
        return array_digest(ds.images, ds.labels, ds._scale, ds._shift)
    if isinstance(ds, TensorDataset):
        return array_digest(*ds.tensors)
    own = getattr(ds, "content_digest", None)
    if callable(own):  # a streamed split (ImageNet): paths, sizes and labels, no 140 GB read
        return str(own())
    paths = getattr(ds, "paths", None)
    if isinstance(paths, list) and all(isinstance(p, Path) for p in paths):
        return _files_digest(paths, getattr(ds, "labels", None))  # no decoding of 100k images
    xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)  # type: ignore[arg-type]
    return array_digest(torch.stack(list(xs)), torch.as_tensor(ys))


def _files_digest(paths: list[Path], labels: object) -> str:
    """Digest of image files' bytes in order, and their labels (Tiny-ImageNet's splits)."""
    h = hashlib.blake2b(digest_size=8)
    for p in paths:
        h.update(p.read_bytes())
    h.update(array_digest(labels).encode() if labels is not None else b"")
    return h.hexdigest()


def data_inputs(
    dataset: str,
    root: str | os.PathLike[str] | None,
    seed: int,
    val_fraction: float,
    ood: tuple[str, ...] | None,
    shift: tuple[str, ...] | None,
) -> tuple[DataInput, ...]:
    """The splits of ``dataset`` (as `load_splits` gives them for ``seed``/``val_fraction``),
    each OOD set of ``ood`` at each severity and the test side of each shift set of ``shift``
    at each severity, with their digests; cached per process. ``ood``/``shift`` None: the
    dataset's defaults (`default_ood`, `default_shift`), as a trial config's ``data.ood`` and
    ``data.shift`` mean it."""
    ood = tuple(default_ood(dataset)) if ood is None else tuple(ood)
    shift = tuple(default_shift(dataset)) if shift is None else tuple(shift)
    return _data_inputs(
        dataset, None if root is None else str(root), seed, val_fraction, ood, shift
    )


@functools.lru_cache(maxsize=16)
def _data_inputs(
    dataset: str,
    root: str | None,
    seed: int,
    val_fraction: float,
    ood: tuple[str, ...],
    shift: tuple[str, ...],
) -> tuple[DataInput, ...]:
    splits = load_splits(dataset, root=root, seed=seed, val_fraction=val_fraction)
    out = [
        DataInput(f"{dataset}/{part}", context, dataset_digest(ds), len(ds))  # type: ignore[arg-type]
        for part, context, ds in (
            ("train", "training", splits.train),
            ("val", "validation", splits.val),
            ("test", "test", splits.test),
        )
    ]
    # one set in memory at a time: a CIFAR-10-C shift list is 95 sets of 10,000 images
    for name in ood:
        for sev in ood_severities(name) or (None,):
            ds = load_ood(name, root, in_distribution=dataset, severity=sev).dataset
            label = f"ood/{name}" + (f"/s{sev}" if sev else "")
            out.append(DataInput(label, "ood", dataset_digest(ds), len(ds)))  # type: ignore[arg-type]
    for name in shift:
        for sev in shift_severities(name)["shift"]:
            ds = load_shift(name, "shift", sev, root=root)
            out.append(DataInput(f"shift/{name}/s{sev}", "shift", dataset_digest(ds), len(ds)))  # type: ignore[arg-type]
    return tuple(out)
