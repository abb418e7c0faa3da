"""CIFAR-10 / CIFAR-100 from the official "python version" pickle batches.

torchvision's ``CIFAR10``/``CIFAR100`` classes check fixed MD5 sums and therefore reject any
other well-formed file (a subset, a test fixture); this reader checks the structure, plus the
stamp ``calibtune data fetch`` records (`calibtune.data._verify`), and keeps torchvision's
transforms for augmentation.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

# torchvision is imported in `train_transform` only: importing it loads torch._dynamo, which a
# study's driver and the CLI never need otherwise (see calibtune/models/_resnet.py).
if TYPE_CHECKING:
    from torchvision.transforms import v2

from ._common import (
    BatchAugment,
    DatasetNotFoundError,
    NormalizedImages,
    Splits,
    resolve_root,
    stratified_holdout,
    validation_count,
)
from ._verify import check_stamp

__all__ = [
    "CIFAR_LAYOUTS",
    "CIFAR_URL",
    "CifarArrays",
    "CifarLayout",
    "load_cifar_splits",
    "read_cifar",
    "train_transform",
]

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"


@dataclass(frozen=True)
class CifarLayout:
    """On-disk layout and statistics of one CIFAR variant."""

    name: str
    folder: str
    archive: str
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    label_key: str
    names_key: str
    num_classes: int
    # per-channel statistics of the 50,000 official training images on [0, 1] pixels
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def files(self) -> tuple[str, ...]:
        return (*self.train_files, self.test_file, self.meta_file)


#: the two variants side by side: CifarLayout field -> (CIFAR-10's value, CIFAR-100's value)
_VARIANTS = ("cifar10", "cifar100")
_FIELDS: dict[str, tuple[Any, Any]] = {
    "folder": ("cifar-10-batches-py", "cifar-100-python"),
    "archive": ("cifar-10-python.tar.gz", "cifar-100-python.tar.gz"),
    "train_files": (tuple(f"data_batch_{i}" for i in range(1, 6)), ("train",)),
    "test_file": ("test_batch", "test"),
    "meta_file": ("batches.meta", "meta"),
    "label_key": ("labels", "fine_labels"),  # CIFAR-100: the 100 fine classes
    "names_key": ("label_names", "fine_label_names"),
    "num_classes": (10, 100),
    "mean": ((0.4914, 0.4822, 0.4465), (0.5071, 0.4865, 0.4409)),
    "std": ((0.2470, 0.2435, 0.2616), (0.2673, 0.2564, 0.2762)),
}
CIFAR_LAYOUTS: dict[str, CifarLayout] = {
    name: CifarLayout(name, **{f: values[i] for f, values in _FIELDS.items()})
    for i, name in enumerate(_VARIANTS)
}


@dataclass(frozen=True)
class CifarArrays:
    """Decoded CIFAR files: uint8 images ``(N, 3, 32, 32)`` and int64 labels ``(N,)``."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    class_names: tuple[str, ...]


def _missing_error(layout: CifarLayout, folder: Path, missing: list[str]) -> DatasetNotFoundError:
    files = ", ".join(layout.files())
    return DatasetNotFoundError(
        f"{layout.name}: dataset files not found: expected {folder}/ with {files} "
        f"(missing: {', '.join(missing)}); run `calibtune data fetch {layout.name} --root "
        f"{folder.parent}` (or get the official python version ({layout.archive}) from "
        f"{CIFAR_URL} and extract it into {folder.parent})"
    )


def _unpickle(path: Path, owner: str) -> object:
    try:
        with path.open("rb") as f:
            return pickle.load(f, encoding="latin1")
    except Exception as exc:  # any unpickling failure means "not a CIFAR batch"
        raise ValueError(
            f"{owner}: {path}: expected a pickled CIFAR batch, got an unreadable file ({exc})"
        ) from None


def _read_batch(path: Path, layout: CifarLayout) -> tuple[np.ndarray, np.ndarray]:
    obj = _unpickle(path, layout.name)
    if not isinstance(obj, dict) or "data" not in obj or layout.label_key not in obj:
        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise ValueError(
            f"{layout.name}: {path}: expected a dict with keys 'data' and "
            f"'{layout.label_key}', got {keys}"
        )
    data = np.asarray(obj["data"])
    labels = np.asarray(obj[layout.label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(
            f"{layout.name}: {path}: expected 'data' as uint8 of shape (N, 3072), "
            f"got {data.dtype} of shape {data.shape}"
        )
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"{layout.name}: {path}: expected {data.shape[0]} integer labels, "
            f"got {labels.dtype} of shape {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= layout.num_classes):
        raise ValueError(
            f"{layout.name}: {path}: expected labels in [0, {layout.num_classes}), "
            f"got values in [{labels.min()}, {labels.max()}]"
        )
    # rows are channel-major 3·32·32 (R plane, G plane, B plane)
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def read_cifar(root: str | Path | None, name: str, *, test_only: bool = False) -> CifarArrays:
    """Read ``<root>/cifar-10-batches-py`` (or ``cifar-100-python``) after checking every file.

    Raises `DatasetNotFoundError` when files are missing, `DataVerificationError` when one
    changed since ``calibtune data fetch`` recorded it, and ``ValueError`` when one is
    malformed. ``test_only`` skips the training batches (CIFAR-10-C generation needs only the
    test set).
    """
    layout = CIFAR_LAYOUTS[name]
    folder = resolve_root(root, name) / layout.folder
    needed = (layout.test_file, layout.meta_file) if test_only else layout.files()
    missing = (
        [f for f in needed if not (folder / f).is_file()] if folder.is_dir() else ["the folder"]
    )
    if missing:
        raise _missing_error(layout, folder, missing)
    check_stamp(folder.parent, name, [f"{layout.folder}/{f}" for f in needed])
    meta = _unpickle(folder / layout.meta_file, name)
    names = meta.get(layout.names_key) if isinstance(meta, dict) else None
    if not isinstance(names, list) or len(names) != layout.num_classes:
        got = "no such key" if names is None else f"{type(names).__name__} of {len(names)}"
        raise ValueError(
            f"{name}: {folder / layout.meta_file}: expected '{layout.names_key}' listing "
            f"{layout.num_classes} class names, got {got}"
        )
    test_x, test_y = _read_batch(folder / layout.test_file, layout)
    if test_only:
        train_x = np.empty((0, 3, 32, 32), np.uint8)
        train_y = np.empty((0,), np.int64)
    else:
        parts = [_read_batch(folder / f, layout) for f in layout.train_files]
        train_x = np.concatenate([p[0] for p in parts])
        train_y = np.concatenate([p[1] for p in parts])
    return CifarArrays(
        torch.from_numpy(train_x),
        torch.from_numpy(train_y),
        torch.from_numpy(test_x),
        torch.from_numpy(test_y),
        tuple(str(n) for n in names),
    )


def train_transform(size: int, padding: int) -> v2.Compose:
    """The seeds' training augmentation on uint8 CHW tensors: random crop ``size`` after
    zero-padding by ``padding``, then a horizontal flip with probability 1/2 (torchvision's
    ``RandomCrop`` draws the offsets uniformly from ``[0, 2·padding]``, as `BatchAugment`)."""
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomCrop(size, padding=padding), v2.RandomHorizontalFlip()])


def load_cifar_splits(name: str, root: str | Path | None, seed: int, val_fraction: float) -> Splits:
    """Official training set split 45,000/5,000 (for ``val_fraction=0.1``, stratified, seeded)
    + official 10,000-image test set; per-dataset mean/std for every split (the seeds' code
    normalised CIFAR-100 with CIFAR-10 statistics for training and ImageNet's for testing)."""
    layout = CIFAR_LAYOUTS[name]
    arrays = read_cifar(root, name)
    n_val = validation_count(val_fraction, arrays.train_labels.shape[0], name)
    keep, hold = stratified_holdout(arrays.train_labels.numpy(), n_val, seed)
    keep_t, hold_t = torch.from_numpy(keep), torch.from_numpy(hold)
    mean, std = layout.mean, layout.std
    return Splits(
        name=name,
        train=NormalizedImages(
            arrays.train_images[keep_t],
            arrays.train_labels[keep_t],
            mean,
            std,
            transform=train_transform(32, 4),
            # same distribution, vectorised: DataLoader batches take this path
            batch_transform=BatchAugment(padding=4, flip=True, fill=(0.0,)),
        ),
        val=NormalizedImages(arrays.train_images[hold_t], arrays.train_labels[hold_t], mean, std),
        test=NormalizedImages(arrays.test_images, arrays.test_labels, mean, std),
        num_classes=layout.num_classes,
        input_shape=(3, 32, 32),
        mean=mean,
        std=std,
        augment=None,
    )
