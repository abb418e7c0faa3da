"""Tiny-ImageNet (200 classes, 64×64) from the standard ``tiny-imagenet-200`` folder.

Layout read::

    <root>/tiny-imagenet-200/wnids.txt                       (optional; else the train folders)
    <root>/tiny-imagenet-200/train/<wnid>/images/*.JPEG       500 per class
    <root>/tiny-imagenet-200/val/val_annotations.txt          "<file>\\t<wnid>\\t<box...>"
    <root>/tiny-imagenet-200/val/images/*.JPEG                50 per class

The official val set (10,000) is our test set; the training folder is split 90,000/10,000
(50 per class for ``val_fraction=0.1``). Every file is decoded once, with Pillow, into one uint8
``(110000, 3, 64, 64)`` array (1.35 GB) held like CIFAR's (`NormalizedImages`), so batches take
CIFAR's device path: indexed, augmented (`BatchAugment`) and normalised where the trial runs,
drawing from the trial's own (checkpointed) torch RNG — no ``DataLoader`` worker pools and an
exact resume. The decoded array is cached as
``<root>/.calibtune-data/decoded/tiny_imagenet-<key>.npy`` when that folder is writable; ``key``
hashes the Pillow version and every file's path, size and mtime, so a changed file is decoded
again.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import PIL
import torch
from PIL import Image
from torch import Tensor

from ._cifar import train_transform
from ._common import (
    BatchAugment,
    DatasetNotFoundError,
    NormalizedImages,
    Splits,
    resolve_root,
    stratified_holdout,
    validation_count,
)
from ._verify import STATE_DIR, check_stamp

__all__ = [
    "TINY_MEAN",
    "TINY_STD",
    "DecodedImages",
    "decode_images",
    "load_tiny_imagenet_splits",
    "read_tiny_imagenet",
]

TINY_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
# per-channel statistics of the 100,000 training images on [0, 1] pixels (the values the seeds use)
TINY_MEAN = (0.4802, 0.4481, 0.3975)
TINY_STD = (0.2302, 0.2265, 0.2262)
TINY_SIZE = 64
_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


class DecodedImages(NormalizedImages):
    """`NormalizedImages` decoded from image files; ``paths[i]`` is the file of row ``i``."""

    def __init__(
        self, paths: Sequence[Path], images: Tensor, labels: Tensor, **kwargs: object
    ) -> None:
        super().__init__(images, labels, TINY_MEAN, TINY_STD, **kwargs)  # type: ignore[arg-type]
        if len(paths) != images.shape[0]:
            raise ValueError(
                f"DecodedImages: paths: expected {images.shape[0]} (one per image), "
                f"got {len(paths)}"
            )
        self.paths = list(paths)


def _decode_into(out: np.ndarray, paths: Sequence[Path], rows: range, size: int) -> None:
    for i in rows:
        path = paths[i]
        try:
            # convert("RGB") also turns Tiny-ImageNet's few greyscale JPEGs into 3 channels
            with Image.open(path) as img:
                pixels = np.asarray(img.convert("RGB"))
        except OSError as exc:  # PIL.UnidentifiedImageError and truncated files included
            raise ValueError(
                f"tiny_imagenet: {path}: expected an image file Pillow decodes, got {exc}"
            ) from None
        if pixels.shape != (size, size, 3):
            shape = (pixels.shape[2], *pixels.shape[:2])
            raise ValueError(
                f"tiny_imagenet: {path}: expected a {size}x{size} image, got shape {shape}"
            )
        out[i] = pixels.transpose(2, 0, 1)


def decode_images(paths: Sequence[Path], size: int = TINY_SIZE) -> np.ndarray:
    """Decode each file with Pillow, as RGB, into one uint8 ``(N, 3, size, size)`` array.

    Exactly ``np.asarray(Image.open(p).convert("RGB"))`` transposed to CHW, row ``i`` from
    ``paths[i]``; each file is opened once. A file of another size, or one Pillow cannot
    decode, raises ``ValueError`` naming the first such file in ``paths`` order (we never
    resize). Decoding runs on ``torch.get_num_threads()`` threads (Pillow releases the GIL
    while it decodes): the CPUs the trial was given (Ray sets that count), no more.
    """
    out = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    threads = max(1, min(torch.get_num_threads(), len(paths) // 256 or 1))
    bounds = np.linspace(0, len(paths), 4 * threads + 1).astype(int)
    chunks = [range(a, b) for a, b in itertools.pairwise(bounds) if b > a]
    with ThreadPoolExecutor(threads) as pool:
        # results are read in order, so the error raised names the first bad file
        for _ in pool.map(lambda rows: _decode_into(out, paths, rows, size), chunks):
            pass
    return out


def _cache_key(paths: Sequence[Path], base: Path) -> str:
    h = hashlib.blake2b(digest_size=8)
    h.update(f"Pillow {PIL.__version__} {TINY_SIZE};".encode())
    for p in paths:
        st = p.stat()
        h.update(f"{p.relative_to(base).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _decoded(paths: Sequence[Path], root: Path) -> np.ndarray:
    """`decode_images` of ``paths``, read from (or written to) the cache under ``root``."""
    folder = root / STATE_DIR / "decoded"
    cache = folder / f"tiny_imagenet-{_cache_key(paths, root)}.npy"
    shape = (len(paths), 3, TINY_SIZE, TINY_SIZE)
    with contextlib.suppress(OSError, ValueError):  # missing, vanished or unreadable: decode
        cached = np.load(cache, mmap_mode="r")
        if cached.dtype == np.uint8 and cached.shape == shape:
            return cached
    images = decode_images(paths)
    tmp = folder / f".{cache.stem}.{os.getpid()}.tmp.npy"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(tmp, images)
        os.replace(tmp, cache)  # atomic: readers never see half a file
        for old in folder.glob("tiny_imagenet-*.npy"):  # decoded from files since changed
            if old != cache:
                old.unlink(missing_ok=True)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)  # a full disk must not keep half a file
        warnings.warn(
            f"tiny_imagenet: could not cache the decoded images in {folder} ({exc}); "
            f"they will be decoded again next time",
            stacklevel=3,
        )
    return images


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
    and the official val set as test, all decoded once (`decode_images`, cached); random crop
    64 (zero padding 4) + horizontal flip inside ``train``, as CIFAR's: per sample through
    ``__getitem__`` and vectorised on the trial's device through ``batch_transform``."""
    train_paths, train_y, test_paths, test_y, wnids = read_tiny_imagenet(root)
    n_val = validation_count(val_fraction, len(train_paths), "tiny_imagenet")
    keep, hold = stratified_holdout(train_y, n_val, seed)
    paths = [*train_paths, *test_paths]
    images = _decoded(paths, resolve_root(root, "tiny_imagenet"))
    labels = np.concatenate([train_y, test_y])
    test = np.arange(len(train_paths), len(paths))

    def split(rows: np.ndarray, **augment: object) -> DecodedImages:
        # fancy indexing copies the rows out of the (possibly memory-mapped) cache
        return DecodedImages(
            [paths[i] for i in rows],
            torch.from_numpy(np.asarray(images[rows])),
            torch.from_numpy(labels[rows]),
            **augment,
        )

    return Splits(
        name="tiny_imagenet",
        train=split(
            keep,
            transform=train_transform(TINY_SIZE, 4),
            batch_transform=BatchAugment(padding=4, flip=True, fill=(0.0,)),
        ),
        val=split(hold),
        test=split(test),
        num_classes=len(wnids),
        input_shape=(3, TINY_SIZE, TINY_SIZE),
        mean=TINY_MEAN,
        std=TINY_STD,
        augment=None,
    )
