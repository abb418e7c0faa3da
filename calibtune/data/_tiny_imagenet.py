"""Tiny-ImageNet (200 classes, 64×64) from the standard ``tiny-imagenet-200`` folder.

Layout read::

    <root>/tiny-imagenet-200/wnids.txt                       (optional; else the train folders)
    <root>/tiny-imagenet-200/train/<wnid>/images/*.JPEG       500 per class
    <root>/tiny-imagenet-200/val/val_annotations.txt          "<file>\\t<wnid>\\t<box...>"
    <root>/tiny-imagenet-200/val/images/*.JPEG                50 per class

The official val set (10,000) is our test set; the training folder is split 90,000/10,000
(50 per class for ``val_fraction=0.1``). Images are decoded lazily with Pillow (as
torchvision's ImageFolder does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from ._cifar import train_transform
from ._common import (
    DatasetNotFoundError,
    Splits,
    resolve_root,
    stratified_holdout,
    validation_count,
)
from ._verify import check_stamp

__all__ = ["TINY_MEAN", "TINY_STD", "ImageFiles", "load_tiny_imagenet_splits"]

TINY_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
# per-channel statistics of the 100,000 training images on [0, 1] pixels (the values the seeds use)
TINY_MEAN = (0.4802, 0.4481, 0.3975)
TINY_STD = (0.2302, 0.2265, 0.2262)
_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


class ImageFiles(Dataset):
    """Image files decoded on access to uint8 RGB, optionally augmented, then normalised.

    Every file must decode to ``(3, size, size)``; a file of another size raises ``ValueError``
    naming it (we do not silently resize).
    """

    def __init__(
        self,
        paths: Sequence[Path],
        labels: Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        size: int,
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> None:
        self.paths = list(paths)
        self.labels = labels.to(torch.int64)
        self.size = size
        self.transform = transform
        std_t = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self._scale = 1.0 / (255.0 * std_t)
        self._shift = -torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1) / std_t

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        path = self.paths[index]
        # convert("RGB") also turns Tiny-ImageNet's few greyscale JPEGs into 3 channels
        with Image.open(path) as img:
            x = torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1)
        if tuple(x.shape) != (3, self.size, self.size):
            raise ValueError(
                f"tiny_imagenet: {path}: expected a {self.size}x{self.size} image, "
                f"got shape {tuple(x.shape)}"
            )
        if self.transform is not None:
            x = self.transform(x)
        return x.float() * self._scale + self._shift, int(self.labels[index])


def _missing(folder: Path, what: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"tiny_imagenet: dataset files not found: expected {folder}/ with wnids.txt, "
        f"train/<wnid>/images/*.JPEG, val/val_annotations.txt and val/images/*.JPEG "
        f"(missing: {what}); run `calibtune data fetch tiny_imagenet --root {folder.parent}` "
        f"(or get the official tiny-imagenet-200.zip from {TINY_URL} and extract it into "
        f"{folder.parent})"
    )


def _list_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES)


def read_tiny_imagenet(
    root: str | Path | None,
) -> tuple[list[Path], np.ndarray, list[Path], np.ndarray, list[str]]:
    """Return ``(train_paths, train_labels, test_paths, test_labels, wnids)`` after checking
    the layout; class ids index the sorted wnids."""
    folder = resolve_root(root, "tiny_imagenet") / "tiny-imagenet-200"
    train_dir, val_dir = folder / "train", folder / "val"
    annotations = val_dir / "val_annotations.txt"
    for path, what in (
        (train_dir, "train/"),
        (annotations, "val/val_annotations.txt"),
        (val_dir / "images", "val/images/"),
    ):
        if not path.exists():
            raise _missing(folder, what)
    wnids_file = folder / "wnids.txt"
    if wnids_file.is_file():
        wnids = sorted({w.strip() for w in wnids_file.read_text().split() if w.strip()})
    else:
        wnids = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    if not wnids:
        raise _missing(folder, "class folders under train/")
    check_stamp(folder.parent, "tiny_imagenet")  # one stat per file fetched
    index = {w: i for i, w in enumerate(wnids)}
    train_paths: list[Path] = []
    train_labels: list[np.ndarray] = []
    for wnid in wnids:
        images_dir = train_dir / wnid / "images"
        if not images_dir.is_dir():
            raise _missing(folder, f"train/{wnid}/images/")
        files = _list_images(images_dir)
        if not files:
            raise _missing(folder, f"images in train/{wnid}/images/")
        train_paths.extend(files)
        train_labels.append(np.full(len(files), index[wnid], dtype=np.int64))
    test_paths: list[Path] = []
    test_labels: list[int] = []
    for lineno, line in enumerate(annotations.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in index:
            raise ValueError(
                f"tiny_imagenet: {annotations}:{lineno}: expected '<file>\\t<wnid>\\t...' with "
                f"a wnid of the training set, got {line!r}"
            )
        path = val_dir / "images" / fields[0]
        if not path.is_file():
            raise _missing(folder, f"val/images/{fields[0]}")
        test_paths.append(path)
        test_labels.append(index[fields[1]])
    return (
        train_paths,
        np.concatenate(train_labels),
        test_paths,
        np.asarray(test_labels, dtype=np.int64),
        wnids,
    )


def load_tiny_imagenet_splits(root: str | Path | None, seed: int, val_fraction: float) -> Splits:
    """90,000/10,000 stratified seeded split of the training folder (for ``val_fraction=0.1``)
    and the official val set as test; random crop 64 (padding 4) + flip inside ``train``."""
    train_paths, train_y, test_paths, test_y, wnids = read_tiny_imagenet(root)
    n_val = validation_count(val_fraction, len(train_paths), "tiny_imagenet")
    keep, hold = stratified_holdout(train_y, n_val, seed)

    def subset(idx: np.ndarray, transform: Callable[[Tensor], Tensor] | None) -> ImageFiles:
        return ImageFiles(
            [train_paths[i] for i in idx],
            torch.from_numpy(train_y[idx]),
            TINY_MEAN,
            TINY_STD,
            64,
            transform,
        )

    return Splits(
        name="tiny_imagenet",
        train=subset(keep, train_transform(64, 4)),
        val=subset(hold, None),
        test=ImageFiles(test_paths, torch.from_numpy(test_y), TINY_MEAN, TINY_STD, 64),
        num_classes=len(wnids),
        input_shape=(3, 64, 64),
        mean=TINY_MEAN,
        std=TINY_STD,
        augment=None,
    )
