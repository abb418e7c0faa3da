"""ImageNet (ILSVRC-2012) read from a folder the user prepared, streamed through loader workers.

ImageNet cannot be downloaded for the user (its terms need an account at image-net.org), so
``calibtune data fetch`` has no entry for it: the loader reads the standard layout that
``torchvision.datasets.ImageFolder`` and the PyTorch ImageNet example read::

    <root>/imagenet/train/<wnid>/*.JPEG     1,281,167 images in 1,000 class folders
    <root>/imagenet/val/<wnid>/*.JPEG       50,000 images, 50 per class (after valprep.sh)

Class ids index the sorted class folder names; ``train/`` and ``val/`` must hold the same
folders. The official training images are the training split; the 50,000 validation images
are split, stratified by class and seeded (`stratified_holdout`), into validation and test —
``val_fraction`` 0.5 gives Ghosh et al.'s 25,000/25,000 (25 per class). Nothing is decoded at
load time: the index is a pair of arrays (relative paths as bytes, labels); each image is
decoded and augmented in ``__getitem__``, so the trial's ``DataLoader`` workers
(``train.loader_workers``, counted in the trial's Ray CPUs: `calibtune.trial` refuses more
workers than its bundle holds) decode in parallel while the device trains.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from ._common import (
    DatasetNotFoundError,
    SetCheck,
    Splits,
    resolve_root,
    stratified_holdout,
    validation_count,
)

__all__ = [
    "ILSVRC2012_COUNTS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageFiles",
    "ImageNetIndex",
    "index_imagenet",
    "load_imagenet_splits",
    "verify_imagenet",
]

#: the folder under the data root
IMAGENET_FOLDER = "imagenet"
#: torchvision's ImageNet statistics (per channel, on [0, 1] pixels), as every ImageNet recipe
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: training crop and the evaluation resize before the centre crop (the torchvision recipe)
CROP, RESIZE = 224, 256
#: (classes, training images, validation images) of ILSVRC-2012 (Russakovsky et al. 2015)
ILSVRC2012_COUNTS = (1000, 1_281_167, 50_000)
_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
_GUIDE = "see docs/data.md (Preparing ImageNet)"


@dataclass(frozen=True)
class ImageNetIndex:
    """The prepared folder, listed: ``classes`` (sorted folder names; class id = position),
    and per split the image paths relative to ``folder/<split>`` (``<class>/<file>``, bytes as
    ``os.fsencode`` gives them) with their int64 labels, both sorted by class, then file."""

    folder: Path
    classes: tuple[str, ...]
    train_files: np.ndarray
    train_labels: np.ndarray
    val_files: np.ndarray
    val_labels: np.ndarray


def _missing(folder: Path, what: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"imagenet: dataset files not found: expected {folder}/ with train/<wnid>/*.JPEG and "
        f"val/<wnid>/*.JPEG (missing: {what}); ImageNet cannot be downloaded by calibtune: get "
        f"ILSVRC-2012 from https://image-net.org, prepare that layout and run `calibtune data "
        f"verify imagenet --root {folder.parent}` ({_GUIDE})"
    )


def _class_folders(split_dir: Path) -> tuple[list[str], int]:
    """Sorted sub-folder names of ``split_dir`` and the number of image files lying directly
    in it (an un-prepared val/ holds all 50,000 there)."""
    folders, loose = [], 0
    with os.scandir(split_dir) as it:
        for e in it:
            if e.is_dir():
                folders.append(e.name)
            elif e.name.lower().endswith(_IMAGE_SUFFIXES):
                loose += 1
    return sorted(folders), loose


def _list_split(split_dir: Path, classes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    files: list[bytes] = []
    labels: list[np.ndarray] = []
    for k, name in enumerate(classes):
        with os.scandir(split_dir / name) as it:
            names = sorted(
                e.name for e in it if e.name.lower().endswith(_IMAGE_SUFFIXES) and e.is_file()
            )
        if not names:
            raise ValueError(
                f"imagenet: {split_dir / name}/: expected at least one .JPEG image, got none "
                f"({_GUIDE})"
            )
        files.extend(os.fsencode(f"{name}/{n}") for n in names)
        labels.append(np.full(len(names), k, dtype=np.int64))
    return np.asarray(files, dtype=np.bytes_), np.concatenate(labels)


def index_imagenet(root: object) -> ImageNetIndex:
    """List ``<root>/imagenet`` after checking its layout (module docstring).

    Raises `DatasetNotFoundError` when the folder, ``train/`` or ``val/`` is missing, and
    ``ValueError`` (one line, naming the folder and the fix) when ``val/`` still holds its
    images loose (not sorted into class folders), when ``train/`` and ``val/`` hold different
    class folders, or when a class folder holds no image. Counts are not fixed here (a subset
    or a test layout loads); `verify_imagenet` reports them against ILSVRC-2012's.
    """
    folder = resolve_root(root, "imagenet") / IMAGENET_FOLDER
    for part in ("", "train", "val"):
        if not (folder / part).is_dir():
            raise _missing(folder, f"{part}/" if part else f"{folder}/")
    train_classes, _ = _class_folders(folder / "train")
    val_classes, loose = _class_folders(folder / "val")
    if loose:
        raise ValueError(
            f"imagenet: {folder / 'val'}/: expected one folder per class (val/<wnid>/*.JPEG), "
            f"got {loose} images directly in val/; sort them into class folders with the usual "
            f"valprep.sh ({_GUIDE})"
        )
    if not train_classes:
        raise _missing(folder, "class folders under train/")
    if train_classes != val_classes:
        only_train = sorted(set(train_classes) - set(val_classes))
        only_val = sorted(set(val_classes) - set(train_classes))
        raise ValueError(
            f"imagenet: {folder}: expected the same class folders in train/ and val/, got "
            f"{len(only_train)} only in train/ {only_train[:3]} and {len(only_val)} only in "
            f"val/ {only_val[:3]} ({_GUIDE})"
        )
    classes = tuple(train_classes)
    train_files, train_labels = _list_split(folder / "train", classes)
    val_files, val_labels = _list_split(folder / "val", classes)
    return ImageNetIndex(folder, classes, train_files, train_labels, val_files, val_labels)


def _train_transform() -> Callable[[Image.Image], Tensor]:
    from torchvision import transforms as T

    return T.Compose([T.RandomResizedCrop(CROP), T.RandomHorizontalFlip(), T.PILToTensor()])


def _eval_transform() -> Callable[[Image.Image], Tensor]:
    from torchvision import transforms as T

    return T.Compose([T.Resize(RESIZE), T.CenterCrop(CROP), T.PILToTensor()])


class ImageFiles(Dataset):
    """Image files decoded on access: ``(x, y)`` with ``x`` float32 ``(3, 224, 224)``
    normalised with the ImageNet statistics, ``y`` the int label.

    ``train``: Inception-style ``RandomResizedCrop(224)`` (scale 0.08–1, ratio 3/4–4/3) and a
    horizontal flip with probability 1/2, drawn from the torch RNG of the process that decodes
    (a ``DataLoader`` worker seeds its own); else ``Resize(256)`` then ``CenterCrop(224)``
    (deterministic). Decoding is Pillow's ``Image.open(...).convert("RGB")`` (greyscale and
    CMYK files become RGB). ``files``: paths relative to ``folder`` as bytes; ``labels``: int64.
    There is no ``images`` tensor, so the trial streams these splits through its loader.
    """

    def __init__(self, folder: Path, files: np.ndarray, labels: np.ndarray, train: bool) -> None:
        if files.shape != labels.shape:
            raise ValueError(
                f"ImageFiles: labels: expected shape {files.shape} (one per file), "
                f"got {labels.shape}"
            )
        self.folder = Path(folder)
        self.files = files
        self.labels = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
        self.train = train
        self._transform: Callable[[Image.Image], Tensor] | None = None  # built in the worker
        std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
        self._scale = 1.0 / (255.0 * std)
        self._shift = -torch.tensor(IMAGENET_MEAN).view(3, 1, 1) / std

    def __len__(self) -> int:
        return int(self.files.shape[0])

    def path(self, index: int) -> Path:
        """The file of sample ``index``."""
        return self.folder / os.fsdecode(self.files[index])

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        if self._transform is None:
            self._transform = _train_transform() if self.train else _eval_transform()
        path = self.path(index)
        try:
            with Image.open(path) as img:
                rgb = img.convert("RGB")
        except OSError as exc:  # PIL.UnidentifiedImageError and truncated files included
            raise ValueError(
                f"imagenet: {path}: expected an image Pillow decodes, got {exc}"
            ) from None
        x = self._transform(rgb).float() * self._scale + self._shift
        return x, int(self.labels[index])

    def content_digest(self) -> str:
        """16 hex digits over each file's relative path and size and the labels: what the
        split holds, without reading 140 GB (`calibtune.data.dataset_digest` uses it)."""
        h = hashlib.blake2b(digest_size=8)
        h.update(f"imagenet train={self.train};".encode())
        for rel in self.files:
            h.update(rel + b"\0" + str((self.folder / os.fsdecode(rel)).stat().st_size).encode())
        h.update(self.labels.numpy().tobytes())
        return h.hexdigest()


def load_imagenet_splits(root: object, seed: int, val_fraction: float) -> Splits:
    """The official training images as the training split; the official validation images
    split, stratified and seeded, into ``round(val_fraction · N)`` validation and the rest
    test (``val_fraction`` 0.5 on 50,000: 25 of each class on each side). Only the folder is
    listed here (`index_imagenet`); images are decoded by `ImageFiles` as batches are drawn."""
    idx = index_imagenet(root)
    n_val = validation_count(val_fraction, len(idx.val_files), "imagenet")
    test_rows, val_rows = stratified_holdout(idx.val_labels, n_val, seed)

    def part(rows: np.ndarray) -> ImageFiles:
        return ImageFiles(idx.folder / "val", idx.val_files[rows], idx.val_labels[rows], False)

    return Splits(
        name="imagenet",
        train=ImageFiles(idx.folder / "train", idx.train_files, idx.train_labels, True),
        val=part(val_rows),
        test=part(test_rows),
        num_classes=len(idx.classes),
        input_shape=(3, CROP, CROP),
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        augment=None,
    )


def _check_headers(paths: list[Path], threads: int) -> str | None:
    """The first file (in ``paths`` order) whose header Pillow cannot read, with the reason."""

    def first_bad(chunk: list[Path]) -> str | None:
        for p in chunk:
            try:
                with Image.open(p) as img:
                    img.size  # noqa: B018 (the header is parsed by open; size proves it)
            except OSError as exc:
                return f"{p}: {exc}"
        return None

    bounds = np.linspace(0, len(paths), 4 * threads + 1).astype(int)
    chunks = [paths[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    with ThreadPoolExecutor(threads) as pool:
        for bad in pool.map(first_bad, chunks):
            if bad is not None:
                return bad
    return None


def verify_imagenet(root: object = None, *, full: bool = True) -> object:
    """``calibtune data verify imagenet``: the layout `index_imagenet` checks, then (``full``)
    every image's header read by Pillow, as a `calibtune.data.SetCheck` whose detail reports
    the counts and where they differ from ILSVRC-2012's (1,000 classes, 1,281,167 training and
    50,000 validation images). ``missing`` without the folder; ``failed`` on a broken layout
    or an unreadable file (one line naming it and the fix)."""
    try:
        idx = index_imagenet(root)
    except DatasetNotFoundError as exc:
        return SetCheck("imagenet", "missing", str(exc).removeprefix("imagenet: "))
    except (ValueError, OSError) as exc:
        return SetCheck("imagenet", "failed", str(exc).removeprefix("imagenet: "))
    counts = (len(idx.classes), len(idx.train_files), len(idx.val_files))
    if full:
        paths = [idx.folder / "train" / os.fsdecode(f) for f in idx.train_files]
        paths += [idx.folder / "val" / os.fsdecode(f) for f in idx.val_files]
        bad = _check_headers(paths, max(1, min(os.cpu_count() or 1, 16)))
        if bad is not None:
            return SetCheck(
                "imagenet",
                "failed",
                f"{bad}; expected an image Pillow reads (re-copy the file; {_GUIDE})",
            )
    detail = f"{counts[0]:,} classes, {counts[1]:,} train / {counts[2]:,} val images"
    detail += ", every header read" if full else " (layout only)"
    if counts != ILSVRC2012_COUNTS:
        c = ILSVRC2012_COUNTS
        detail += f"; not ILSVRC-2012's {c[0]:,} / {c[1]:,} / {c[2]:,}"
    return SetCheck("imagenet", "ok", detail)
