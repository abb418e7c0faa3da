"""Tiny-ImageNet decoded once into uint8 tensors and batched like CIFAR (issue 40, section 2).

On synthetic JPEGs in the official layout (`tests.test_data.write_tiny_imagenet`). Pillow's
``Image.open`` (below the loader) is wrapped to count the files it opens.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from calibtune.data import load_splits
from calibtune.training import DeviceBatches
from calibtune.training._batches import epoch_index_batches
from calibtune.trial._checkpoint import capture_rng, restore_rng
from tests.test_data import write_jpeg, write_tiny_imagenet

DEVICES = ["cpu", *(["cuda:0"] if torch.cuda.is_available() else [])]


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Counter[Path]:
    """Counts of the files Pillow opens, by path."""
    counts: Counter[Path] = Counter()
    real = Image.open

    def counting(fp, *args, **kwargs):  # type: ignore[no-untyped-def]
        counts[Path(fp)] += 1
        return real(fp, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counting)
    return counts


def _pillow(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB")).transpose(2, 0, 1)


def _epoch(batches: DeviceBatches, n: int, epoch: int) -> list[torch.Tensor]:
    idx = epoch_index_batches(n, 4, seed=1, epoch=epoch)
    return [x.cpu() for x, _ in batches.batches(idx, train=True)]


def test_the_splits_are_uint8_tensors_decoded_once_equal_to_pillows_decode(
    tmp_path: Path, opened: Counter[Path]
) -> None:
    folder = write_tiny_imagenet(tmp_path)
    s = load_splits("tiny_imagenet", root=tmp_path, seed=1)
    owners = [DeviceBatches(ds, torch.device("cpu")) for ds in (s.train, s.val, s.test)]
    for epoch in (1, 2):  # two epochs of training batches and evaluation passes
        _epoch(owners[0], len(s.train), epoch)
        for owner in owners[1:]:
            list(owner.batches(list(torch.arange(len(owner)).split(4))))
    files = sorted(p for p in folder.rglob("*.JPEG"))
    assert len(files) == 26
    assert dict(opened) == dict.fromkeys(files, 1)  # each file opened once, at load
    assert all(o.resident for o in owners)  # no DataLoader at all
    for ds in (s.train, s.val, s.test):
        assert ds.images.dtype == torch.uint8 and ds.images.shape[1:] == (3, 64, 64)
        for row, path in zip(ds.images, ds.paths, strict=True):
            assert np.array_equal(row.numpy(), _pillow(path)), path


def test_the_decoded_cache_is_reused_and_follows_a_changed_file(
    tmp_path: Path, opened: Counter[Path]
) -> None:
    folder = write_tiny_imagenet(tmp_path)
    first = load_splits("tiny_imagenet", root=tmp_path, seed=1)
    opened.clear()
    again = load_splits("tiny_imagenet", root=tmp_path, seed=2)
    assert not opened  # read from the cache, no file decoded
    assert again.test.paths == first.test.paths
    assert torch.equal(again.test.images, first.test.images)
    changed = folder / "val" / "images" / "val_0.JPEG"
    write_jpeg(changed, torch.full((3, 64, 64), 7, dtype=torch.uint8))
    fresh = load_splits("tiny_imagenet", root=tmp_path, seed=1)
    row = fresh.test.paths.index(changed)
    assert np.array_equal(fresh.test.images[row].numpy(), _pillow(changed))
    assert not torch.equal(fresh.test.images[row], first.test.images[row])
    caches = list((tmp_path / ".calibtune-data" / "decoded").iterdir())
    assert len(caches) == 1 and caches[0].suffix == ".npy"  # the stale one is gone


@pytest.mark.parametrize("device", DEVICES)
def test_a_resumed_run_draws_the_same_augmentations(tmp_path: Path, device: str) -> None:
    """Epoch 2 after restoring the RNG captured after epoch 1 (as the checkpoint does), in a
    fresh loader, equals epoch 2 of the uninterrupted run; ``loader_workers`` 3 on a GPU."""
    write_tiny_imagenet(tmp_path)
    dev = torch.device(device)
    workers = 0 if dev.type == "cpu" else 3

    def owner() -> tuple[DeviceBatches, int]:
        train = load_splits("tiny_imagenet", root=tmp_path, seed=1).train
        return DeviceBatches(train, dev, num_workers=workers), len(train)

    batches, n = owner()
    assert batches.resident
    torch.manual_seed(0)
    epoch1 = _epoch(batches, n, 1)
    state = capture_rng(dev)
    epoch2 = _epoch(batches, n, 2)
    resumed, _ = owner()
    torch.manual_seed(99)  # whatever the fresh process drew before the checkpoint is restored
    restore_rng(state, dev)
    again = _epoch(resumed, n, 2)
    assert all(torch.equal(a, b) for a, b in zip(epoch2, again, strict=True))
    plain = resumed.dataset.normalized()[torch.cat(epoch_index_batches(n, 4, seed=1, epoch=2))]
    assert not torch.equal(torch.cat(again), plain)  # the batches are augmented
    assert len(epoch1) == len(epoch2)
