"""Dataset registry, loaders (on tiny files written here in the official formats), splits,
augmentation and the embedded datasets."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import calibtune.data._embedded as embedded
from calibtune.data import (
    DATASETS,
    BatchAugment,
    DatasetNotFoundError,
    Splits,
    dataset_shape,
    dataset_stats,
    list_datasets,
    load_splits,
    stratified_holdout,
)

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)


# --- writers for the official on-disk formats ---------------------------------------------


def unique_images(n: int, offset: int = 0, seed: int = 0) -> np.ndarray:
    """(n, 3072) uint8 rows; the first two bytes encode the image's index so every image is
    recognisable after splitting."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    idx = np.arange(offset, offset + n)
    data[:, 0] = idx // 256
    data[:, 1] = idx % 256
    return data


def image_ids(images: torch.Tensor) -> list[int]:
    """Inverse of `unique_images` for uint8 (N, 3, 32, 32)."""
    flat = images.reshape(images.shape[0], -1).to(torch.int64)
    return (flat[:, 0] * 256 + flat[:, 1]).tolist()


def _dump(path: Path, obj: object) -> None:
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=2)


def write_cifar10(root: Path, per_batch: int = 20, n_test: int = 20) -> Path:
    """``<root>/cifar-10-batches-py`` with data_batch_1..5, test_batch and batches.meta as
    python dicts (keys data, labels, batch_label, filenames), labels cycling 0..9."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for b in range(5):
        data = unique_images(per_batch, offset=b * per_batch, seed=b)
        labels = [(b * per_batch + i) % 10 for i in range(per_batch)]
        _dump(
            folder / f"data_batch_{b + 1}",
            {
                "batch_label": f"training batch {b + 1} of 5",
                "labels": labels,
                "data": data,
                "filenames": [f"img_{b}_{i}.png" for i in range(per_batch)],
            },
        )
    _dump(
        folder / "test_batch",
        {
            "batch_label": "testing batch 1 of 1",
            "labels": [i % 10 for i in range(n_test)],
            "data": unique_images(n_test, offset=1000, seed=9),
            "filenames": [f"test_{i}.png" for i in range(n_test)],
        },
    )
    names = ["airplane", "automobile", "bird", "cat", "deer"]
    names += ["dog", "frog", "horse", "ship", "truck"]
    _dump(folder / "batches.meta", {"label_names": names, "num_cases_per_batch": per_batch})
    return folder


def write_cifar100(root: Path, n_train: int = 200, n_test: int = 100) -> Path:
    """``<root>/cifar-100-python`` with train, test and meta (fine and coarse labels)."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for fname, n, offset in (("train", n_train, 0), ("test", n_test, 5000)):
        fine = [i % 100 for i in range(n)]
        _dump(
            folder / fname,
            {
                "filenames": [f"{fname}_{i}.png" for i in range(n)],
                "batch_label": f"{fname} batch",
                "fine_labels": fine,
                "coarse_labels": [f // 5 for f in fine],
                "data": unique_images(n, offset=offset, seed=offset),
            },
        )
    _dump(
        folder / "meta",
        {
            "fine_label_names": [f"class{i}" for i in range(100)],
            "coarse_label_names": [f"super{i}" for i in range(20)],
        },
    )
    return folder


def write_tiny_imagenet(root: Path, per_class: int = 10, val_per_class: int = 3) -> Path:
    """A 2-class ``tiny-imagenet-200`` folder: wnids.txt, train/<wnid>/images/*.JPEG (plus the
    official per-class boxes file), val/images + val/val_annotations.txt; one greyscale JPEG."""
    folder = root / "tiny-imagenet-200"
    wnids = ["n02124075", "n01443537"]  # deliberately unsorted in wnids.txt
    folder.mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    gen = torch.Generator().manual_seed(0)
    for wnid in wnids:
        images = folder / "train" / wnid / "images"
        images.mkdir(parents=True)
        boxes = []
        for i in range(per_class):
            img = torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8, generator=gen)
            if wnid == wnids[0] and i == 0:
                img = img[:1]  # greyscale file: must come back as 3 channels
            write_jpeg(images / f"{wnid}_{i}.JPEG", img)
            boxes.append(f"{wnid}_{i}.JPEG\t0\t0\t63\t63")
        (folder / "train" / wnid / f"{wnid}_boxes.txt").write_text("\n".join(boxes) + "\n")
    val_images = folder / "val" / "images"
    val_images.mkdir(parents=True)
    lines = []
    for k in range(val_per_class * len(wnids)):
        img = torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8, generator=gen)
        write_jpeg(val_images / f"val_{k}.JPEG", img)
        lines.append(f"val_{k}.JPEG\t{wnids[k % 2]}\t0\t0\t63\t63")
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return folder


def write_jpeg(path: Path, image: torch.Tensor) -> None:
    """uint8 (C, H, W) with C in (1, 3) as a JPEG file."""
    array = image.permute(1, 2, 0).numpy()
    Image.fromarray(array[..., 0] if array.shape[2] == 1 else array).save(path, quality=95)


def stack(dataset: torch.utils.data.Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
    return torch.stack(xs), torch.tensor(ys)


# --- registry -----------------------------------------------------------------------------


def test_registry_lists_every_dataset() -> None:
    assert list_datasets() == [
        "20newsgroups",
        "cifar10",
        "cifar100",
        "digits",
        "imagenet",
        "mnist1d",
        "mnist1d_large",
        "sst",
        "tiny_imagenet",
    ]
    assert list_datasets() == DATASETS.names()


def test_unknown_dataset_lists_names() -> None:
    names = r"unknown dataset 'cifar9'; expected one of: 20newsgroups, cifar10, "
    with pytest.raises(ValueError, match=names):
        load_splits("cifar9")


def test_entries_declare_params() -> None:
    # a dataset read from files takes a root; an embedded one does not
    kinds = {e.name: e.tags & {"files", "embedded"} for e in DATASETS}
    assert all(len(k) == 1 for k in kinds.values()), kinds
    assert {n for n, k in kinds.items() if k == {"files"}} == {
        "20newsgroups",
        "cifar10",
        "cifar100",
        "imagenet",
        "sst",
        "tiny_imagenet",
    }
    for entry in DATASETS:
        root = ["root"] if "files" in entry.tags else []
        assert [p.name for p in entry.params] == [*root, "seed", "val_fraction"], entry.name


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"val_fraction": 0.0}, r"digits: val_fraction: expected a number in \(0, 1\), got 0.0"),
        ({"val_fraction": 1.5}, r"val_fraction: expected a number in \(0, 1\), got 1.5"),
        ({"seed": -1}, r"digits: seed: expected an integer in \[0, inf\), got -1"),
        ({"val_fraction": 1e-6}, r"digits: val_fraction: expected a fraction leaving at least"),
    ],
)
def test_split_params_are_validated(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_splits("digits", **kwargs)


def test_root_must_be_a_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cifar10: root: expected a folder path or None, got 3"):
        load_splits("cifar10", root=3)


# --- stratified_holdout -------------------------------------------------------------------


def test_stratified_holdout_largest_remainder_by_hand() -> None:
    # classes 0,1,2 with 5,3,2 samples, 3 held out: exact shares 1.5, 0.9, 0.6 → floors 1,0,0
    # (one placed); the two left go to the largest remainders 0.9 (class 1) and 0.6 (class 2)
    labels = np.array([0] * 5 + [1] * 3 + [2] * 2)
    keep, hold = stratified_holdout(labels, 3, seed=0)
    assert np.bincount(labels[hold], minlength=3).tolist() == [1, 1, 1]
    assert len(keep) == 7
    assert sorted(np.concatenate([keep, hold]).tolist()) == list(range(10))


def test_stratified_holdout_official_sizes() -> None:
    # CIFAR: 50,000 (5,000 per class) → 45,000/5,000 with exactly 500 per class
    cifar = np.repeat(np.arange(10), 5000)
    keep, hold = stratified_holdout(cifar, 5000, seed=1)
    assert (len(keep), len(hold)) == (45000, 5000)
    assert np.bincount(cifar[hold]).tolist() == [500] * 10
    # Tiny-ImageNet: 100,000 (500 per class) → 90,000/10,000, 50 per class
    tiny = np.repeat(np.arange(200), 500)
    keep, hold = stratified_holdout(tiny, 10000, seed=1)
    assert (len(keep), len(hold)) == (90000, 10000)
    assert set(np.bincount(tiny[hold]).tolist()) == {50}


def test_stratified_holdout_seeded_and_disjoint() -> None:
    labels = np.random.default_rng(0).integers(0, 7, 1000)
    a_keep, a_hold = stratified_holdout(labels, 123, seed=5)
    b_keep, b_hold = stratified_holdout(labels, 123, seed=5)
    _, c_hold = stratified_holdout(labels, 123, seed=6)
    assert np.array_equal(a_hold, b_hold) and np.array_equal(a_keep, b_keep)
    assert not np.array_equal(a_hold, c_hold)
    assert np.intersect1d(a_keep, a_hold).size == 0
    assert len(a_hold) == 123 and len(a_keep) == 877
    # every class within one sample of its proportional share
    share = 123 * np.bincount(labels) / 1000
    assert np.all(np.abs(np.bincount(labels[a_hold], minlength=7) - share) < 1)


def test_stratified_holdout_is_uniform_within_class() -> None:
    # each of 10 samples of one class is held out (3 of 10) with probability 0.3
    labels = np.zeros(10, dtype=int)
    counts = np.zeros(10)
    for seed in range(2000):
        counts[stratified_holdout(labels, 3, seed)[1]] += 1
    assert np.allclose(counts / 2000, 0.3, atol=0.05)


# --- CIFAR --------------------------------------------------------------------------------


def test_cifar10_reads_small_official_files(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    s = load_splits("cifar10", root=tmp_path, seed=1, val_fraction=0.1)
    assert isinstance(s, Splits)
    assert (len(s.train), len(s.val), len(s.test)) == (90, 10, 20)
    assert (s.num_classes, s.input_shape, s.augment) == (10, (3, 32, 32), None)
    assert (s.mean, s.std) == (CIFAR10_MEAN, CIFAR10_STD)
    train_ids, val_ids = image_ids(s.train.images), image_ids(s.val.images)
    assert set(train_ids).isdisjoint(val_ids)
    assert sorted(train_ids + val_ids) == list(range(100))
    assert sorted(image_ids(s.test.images)) == list(range(1000, 1020))
    # 10 classes × 10 images, 10 held out → one per class
    assert sorted(s.val.labels.tolist()) == list(range(10))
    for split in (s.train, s.val, s.test):
        _, y = stack(split)
        assert y.min() >= 0 and y.max() < 10


def test_cifar10_split_is_deterministic_per_seed(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    a = load_splits("cifar10", root=tmp_path, seed=3)
    b = load_splits("cifar10", root=tmp_path, seed=3)
    c = load_splits("cifar10", root=tmp_path, seed=4)
    assert image_ids(a.val.images) == image_ids(b.val.images)
    assert image_ids(a.val.images) != image_ids(c.val.images)
    assert image_ids(a.test.images) == image_ids(c.test.images)  # test never depends on seed


def test_cifar_eval_splits_are_normalised_raw_pixels(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    s = load_splits("cifar10", root=tmp_path)
    x, y = s.val[0]
    raw = s.val.images[0].float() / 255
    mean = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    assert x.dtype == torch.float32 and x.shape == (3, 32, 32)
    torch.testing.assert_close(x, (raw - mean) / std)
    # a hand-computed pixel: byte 0 of image 0 (channel R)
    v = int(s.val.images[0, 0, 0, 0])
    assert x[0, 0, 0].item() == pytest.approx((v / 255 - 0.4914) / 0.2470, abs=1e-5)
    assert isinstance(y, int)
    # evaluation splits are not augmented: the same item twice is identical
    torch.manual_seed(0)
    a = s.test[3][0]
    torch.manual_seed(1)
    torch.testing.assert_close(a, s.test[3][0])


def _all_crops_and_flips(raw: torch.Tensor, pad: int) -> torch.Tensor:
    padded = torch.nn.functional.pad(raw, (pad,) * 4)
    h, w = raw.shape[-2:]
    crops = [
        padded[:, i : i + h, j : j + w] for i in range(2 * pad + 1) for j in range(2 * pad + 1)
    ]
    crops = torch.stack(crops)
    return torch.cat([crops, crops.flip(-1)])


def test_cifar_batched_fetch_matches_items(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    s = load_splits("cifar10", root=tmp_path)
    items = s.test.__getitems__([3, 0, 7])
    for (x, y), i in zip(items, [3, 0, 7], strict=True):
        ref_x, ref_y = s.test[i]
        torch.testing.assert_close(x, ref_x)
        assert y == ref_y
    loader = torch.utils.data.DataLoader(s.val, batch_size=4)
    xb, yb = next(iter(loader))
    assert xb.shape == (4, 3, 32, 32) and yb.dtype == torch.int64
    torch.testing.assert_close(xb, torch.stack([s.val[i][0] for i in range(4)]))


def test_cifar_train_augmentation_is_crop_and_flip(tmp_path: Path) -> None:
    write_cifar10(tmp_path)
    s = load_splits("cifar10", root=tmp_path)
    mean = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    candidates = _all_crops_and_flips(s.train.images[5], 4).float()
    seen = set()
    for seed in range(30):
        torch.manual_seed(seed)
        x, _ = s.train[5]
        raw = torch.round((x * std + mean) * 255)
        match = (candidates == raw).flatten(1).all(1).nonzero().flatten().tolist()
        assert match, "augmented image is not a padded crop (+flip) of the original"
        seen.add(match[0])
    assert len(seen) > 5  # the augmentation is random


def test_cifar_batched_train_fetch_is_crop_and_flip(tmp_path: Path) -> None:
    # DataLoader batches use the vectorised path; it must draw the same augmentation
    write_cifar10(tmp_path)
    s = load_splits("cifar10", root=tmp_path)
    mean = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    images = list(range(20))
    candidates = {i: _all_crops_and_flips(s.train.images[i], 4) for i in images}
    torch.manual_seed(0)
    items = s.train.__getitems__(images * 10)
    seen = set()
    flips = 0
    for k, (x, y) in enumerate(items):
        i = images[k % 20]
        assert y == int(s.train.labels[i])
        raw = torch.round((x * std + mean) * 255).to(torch.uint8)
        match = (candidates[i] == raw).flatten(1).all(1).nonzero().flatten().tolist()
        assert match, f"item {k} is not a padded crop (+flip) of image {i}"
        seen.add(match[0] % 81)
        flips += match[0] >= 81
    # 81 offsets, 200 draws: ~74 distinct expected
    assert len(seen) > 60
    assert 0.38 < flips / len(items) < 0.62


def test_cifar100_uses_its_own_statistics(tmp_path: Path) -> None:
    write_cifar100(tmp_path)
    s = load_splits("cifar100", root=tmp_path, seed=1)
    assert (len(s.train), len(s.val), len(s.test)) == (180, 20, 100)
    assert s.num_classes == 100 and s.mean == CIFAR100_MEAN
    x, _ = s.test[0]
    raw = s.test.images[0].float() / 255
    mean = torch.tensor(CIFAR100_MEAN).view(3, 1, 1)
    std = torch.tensor((0.2673, 0.2564, 0.2762)).view(3, 1, 1)
    torch.testing.assert_close(x, (raw - mean) / std)
    assert s.test.labels.max() == 99 and s.val.labels.min() >= 0


def test_cifar_missing_files_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_splits("cifar10", root=tmp_path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("cifar10: dataset files not found: expected ")
    assert str(tmp_path / "cifar-10-batches-py") in msg
    assert "data_batch_1" in msg and "test_batch" in msg and "batches.meta" in msg
    assert "https://www.cs.toronto.edu/~kriz/cifar.html" in msg
    assert isinstance(info.value, ValueError)


def test_cifar_names_the_one_missing_batch(tmp_path: Path) -> None:
    folder = write_cifar10(tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(DatasetNotFoundError, match=r"\(missing: data_batch_3\)"):
        load_splits("cifar10", root=tmp_path)


def test_cifar100_missing_names_its_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"cifar-100-python/ with train, test, meta"):
        load_splits("cifar100", root=tmp_path)


def test_cifar_rejects_malformed_batches(tmp_path: Path) -> None:
    folder = write_cifar10(tmp_path)
    _dump(folder / "data_batch_2", {"data": np.zeros((4, 100), np.uint8), "labels": [0] * 4})
    with pytest.raises(ValueError, match=r"expected 'data' as uint8 of shape \(N, 3072\)"):
        load_splits("cifar10", root=tmp_path)
    _dump(folder / "data_batch_2", {"data": unique_images(2), "labels": [0, 10]})
    with pytest.raises(ValueError, match=r"expected labels in \[0, 10\), got values in \[0, 10\]"):
        load_splits("cifar10", root=tmp_path)
    (folder / "data_batch_2").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"expected a pickled CIFAR batch"):
        load_splits("cifar10", root=tmp_path)


# --- Tiny-ImageNet ------------------------------------------------------------------------


def test_tiny_imagenet_reads_the_folder_layout(tmp_path: Path) -> None:
    write_tiny_imagenet(tmp_path)
    s = load_splits("tiny_imagenet", root=tmp_path, seed=1)
    # 2 classes × 10 train images, 10% (one per class) held out; 6 official val images as test
    assert (len(s.train), len(s.val), len(s.test)) == (18, 2, 6)
    assert (s.num_classes, s.input_shape, s.augment) == (2, (3, 64, 64), None)
    assert sorted(s.val.labels.tolist()) == [0, 1]
    train_files = {p.name for p in s.train.paths}
    assert train_files.isdisjoint(p.name for p in s.val.paths)
    # class ids follow the sorted wnids: n01443537 → 0, n02124075 → 1
    for path, label in zip(s.train.paths, s.train.labels.tolist(), strict=True):
        assert path.name.startswith(["n01443537", "n02124075"][label])
    # val_k was annotated with wnids[k % 2] of the unsorted list ["n02124075", "n01443537"]
    for path, label in zip(s.test.paths, s.test.labels.tolist(), strict=True):
        k = int(path.stem.split("_")[1])
        assert label == [1, 0][k % 2]
    x, y = s.test[0]
    assert x.shape == (3, 64, 64) and x.dtype == torch.float32 and y in (0, 1)


def test_tiny_imagenet_split_is_deterministic_per_seed(tmp_path: Path) -> None:
    write_tiny_imagenet(tmp_path)
    a = load_splits("tiny_imagenet", root=tmp_path, seed=1)
    b = load_splits("tiny_imagenet", root=tmp_path, seed=1)
    c = load_splits("tiny_imagenet", root=tmp_path, seed=2)
    assert a.val.paths == b.val.paths and a.train.paths == b.train.paths
    assert a.val.paths != c.val.paths
    assert a.test.paths == c.test.paths


def _tiny_raw(x: torch.Tensor) -> torch.Tensor:
    """Undo the Tiny-ImageNet normalisation: (3, H, W) float → pixel values on [0, 255]."""
    mean = torch.tensor((0.4802, 0.4481, 0.3975)).view(3, 1, 1)
    std = torch.tensor((0.2302, 0.2265, 0.2262)).view(3, 1, 1)
    return (x * std + mean) * 255


def test_tiny_imagenet_greyscale_and_augmentation(tmp_path: Path) -> None:
    folder = write_tiny_imagenet(tmp_path)
    grey = folder / "train" / "n02124075" / "images" / "n02124075_0.JPEG"
    with Image.open(grey) as img:
        assert img.mode == "L"
        plane = torch.from_numpy(np.array(img)).float()  # (64, 64)
    s = load_splits("tiny_imagenet", root=tmp_path, seed=1)
    # seed 1 trains on the grey file (augmented); the first seed that holds it out (val, not
    # augmented) gives the decoded plane itself
    held = next(
        load_splits("tiny_imagenet", root=tmp_path, seed=k)
        for k in range(2, 60)
        if grey in load_splits("tiny_imagenet", root=tmp_path, seed=k).val.paths
    )
    assert grey in s.train.paths
    x, _ = s.train[s.train.paths.index(grey)]
    v, _ = held.val[held.val.paths.index(grey)]
    for image in (x, v):  # the three channels decode from one grey plane (crop pad is 0 too)
        assert image.shape == (3, 64, 64)
        raw = _tiny_raw(image)
        torch.testing.assert_close(raw[1], raw[0], atol=1e-3, rtol=0)
        torch.testing.assert_close(raw[2], raw[0], atol=1e-3, rtol=0)
    torch.testing.assert_close(_tiny_raw(v)[0], plane, atol=1e-3, rtol=0)
    colour = _tiny_raw(s.train[s.train.paths.index(grey) - 1][0])  # a colour image differs
    assert (colour[0] - colour[1]).abs().max() > 10
    torch.manual_seed(0)
    a = s.train[1][0]
    draws = []
    for seed in range(1, 6):
        torch.manual_seed(seed)
        draws.append(s.train[1][0])
    assert any(not torch.equal(a, b) for b in draws)  # train is augmented
    torch.manual_seed(0)
    v = s.val[0][0]
    torch.manual_seed(1)
    assert torch.equal(v, s.val[0][0])  # val is not


def test_tiny_imagenet_rejects_wrong_image_size(tmp_path: Path) -> None:
    folder = write_tiny_imagenet(tmp_path)
    bad = folder / "val" / "images" / "val_0.JPEG"
    write_jpeg(bad, torch.zeros(3, 32, 32, dtype=torch.uint8))
    # decoded once at load (issue 40), so the file is refused before any training
    with pytest.raises(ValueError, match=r"val_0.JPEG: expected a 64x64 image, got shape"):
        load_splits("tiny_imagenet", root=tmp_path)


def test_tiny_imagenet_missing_and_malformed(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_splits("tiny_imagenet", root=tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("tiny_imagenet: dataset files not found")
    assert str(tmp_path / "tiny-imagenet-200") in msg and "val_annotations.txt" in msg
    assert "http://cs231n.stanford.edu/tiny-imagenet-200.zip" in msg
    folder = write_tiny_imagenet(tmp_path)
    with (folder / "val" / "val_annotations.txt").open("a") as f:
        f.write("val_0.JPEG\tn99999999\t0\t0\t1\t1\n")
    with pytest.raises(ValueError, match=r"val_annotations.txt:7: expected '<file>\\t<wnid>"):
        load_splits("tiny_imagenet", root=tmp_path)


# --- embedded: digits ---------------------------------------------------------------------


def test_digits_sizes_shapes_and_labels() -> None:
    s = load_splits("digits")
    # 1,797 → fixed test round(0.2·1797) = 359; pool 1,438 → val round(0.1·1438) = 144
    assert (len(s.train), len(s.val), len(s.test)) == (1294, 144, 359)
    assert (s.num_classes, s.input_shape) == (10, (1, 8, 8))
    for split in (s.train, s.val, s.test):
        x, y = split.tensors
        assert x.dtype == torch.float32 and x.shape[1:] == (1, 8, 8)
        assert y.dtype == torch.int64 and y.min() == 0 and y.max() == 9
    x, y = s.train[0]
    assert x.shape == (1, 8, 8)


def test_digits_partition_and_determinism() -> None:
    from sklearn.datasets import load_digits

    a, b = load_splits("digits", seed=1), load_splits("digits", seed=1)
    c = load_splits("digits", seed=2)
    assert all(torch.equal(u, v) for u, v in zip(a.val.tensors, b.val.tensors, strict=True))
    assert not torch.equal(a.val.tensors[0], c.val.tensors[0])
    assert torch.equal(a.test.tensors[0], c.test.tensors[0])  # the test split is fixed
    # train ∪ val ∪ test is exactly scikit-learn's dataset, as a multiset of (pixels, label)
    splits = (a.train, a.val, a.test)
    x = torch.cat([d.tensors[0] for d in splits]) * a.std[0] + a.mean[0]
    y = torch.cat([d.tensors[1] for d in splits]).numpy()
    ours = np.column_stack([np.round(x.reshape(-1, 64).numpy() * 16).astype(int), y])
    bunch = load_digits()
    ref = np.column_stack([bunch.data.astype(int), bunch.target])
    assert np.array_equal(np.unique(ours, axis=0), np.unique(ref, axis=0))
    assert np.array_equal(
        np.unique(ours, axis=0, return_counts=True)[1],
        np.unique(ref, axis=0, return_counts=True)[1],
    )


def test_digits_normalisation_uses_pool_statistics() -> None:
    s = load_splits("digits")
    pool = torch.cat([s.train.tensors[0], s.val.tensors[0]])
    assert pool.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert pool.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    assert dataset_stats("digits") == (s.mean, s.std)
    assert 0.2 < s.mean[0] < 0.4  # mostly dark background on [0, 1]


def test_digits_loads_fast_without_files() -> None:
    embedded._digits_numpy.cache_clear()
    embedded.digits_stats.cache_clear()
    start = time.perf_counter()
    load_splits("digits", root="/nonexistent")
    assert time.perf_counter() - start < 1.0


def test_digits_augment_translates_by_at_most_one_pixel() -> None:
    s = load_splits("digits")
    assert isinstance(s.augment, BatchAugment)
    x = s.train.tensors[0][:64]
    torch.manual_seed(0)
    out = s.augment(x)
    torch.manual_seed(0)
    assert torch.equal(out, s.augment(x))  # seedable through the global RNG
    assert out.shape == x.shape
    fill = -s.mean[0] / s.std[0]  # a raw 0 pixel after normalisation
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1), value=fill)
    shifts = torch.stack([padded[:, :, i : i + 8, j : j + 8] for i in range(3) for j in range(3)])
    hits = (shifts == out.unsqueeze(0)).flatten(2).all(2)  # (9, B)
    assert hits.any(0).all()  # every sample is one of the 9 shifts, never a flip
    assert hits[4].float().mean() < 0.5  # the centre (identity) is 1 of 9 options


# --- embedded: mnist1d --------------------------------------------------------------------


def test_mnist1d_splits_and_rng_hygiene() -> None:
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    s = load_splits("mnist1d", seed=1)
    assert np.array_equal(np.random.get_state()[1], before)  # global numpy RNG restored
    assert (len(s.train), len(s.val), len(s.test)) == (3600, 400, 1000)
    assert (s.num_classes, s.input_shape, s.augment) == (10, (1, 40), None)
    pool = torch.cat([s.train.tensors[1], s.val.tensors[1]]).numpy()
    share = 0.1 * np.bincount(pool)  # stratified: each class within one of its 10%
    assert np.abs(np.bincount(s.val.tensors[1].numpy()) - share).max() < 1
    x = torch.cat([s.train.tensors[0], s.val.tensors[0], s.test.tensors[0]])
    assert x.mean().item() == pytest.approx(0.0, abs=1e-4)  # the generator standardises
    assert x.std().item() == pytest.approx(1.0, abs=1e-3)
    t = load_splits("mnist1d", seed=2)
    assert torch.equal(s.test.tensors[0], t.test.tensors[0])
    assert not torch.equal(s.val.tensors[0], t.val.tensors[0])
    assert s.train.tensors[1].max() == 9 and s.train.tensors[1].min() == 0


def test_mnist1d_large_has_the_sizes_of_a_setting_whose_numbers_are_not_noise() -> None:
    """Issue 31 item 6: ≥ 5,000 validation and ≥ 10,000 test signals, 6× the generator's size."""
    s = load_splits("mnist1d_large", seed=3, val_fraction=0.25)
    assert (len(s.train), len(s.val), len(s.test)) == (15_000, 5_000, 10_000)
    assert (s.num_classes, s.input_shape, s.augment, s.name) == (10, (1, 40), None, "mnist1d_large")
    pool = torch.cat([s.train.tensors[1], s.val.tensors[1]]).numpy()
    share = 0.25 * np.bincount(pool)  # stratified: each class within one of its 25 %
    assert np.abs(np.bincount(s.val.tensors[1].numpy()) - share).max() < 1
    x = torch.cat([s.train.tensors[0], s.val.tensors[0], s.test.tensors[0]])
    assert x.mean().item() == pytest.approx(0.0, abs=1e-4)
    assert x.std().item() == pytest.approx(1.0, abs=1e-3)
    small = load_splits("mnist1d", seed=3)  # a different draw, not the small set repeated
    assert not torch.equal(s.test.tensors[0][:1000], small.test.tensors[0])
    t = load_splits("mnist1d_large", seed=4, val_fraction=0.25)
    assert torch.equal(s.test.tensors[0], t.test.tensors[0])
    assert not torch.equal(s.val.tensors[0], t.val.tensors[0])
    assert dataset_shape("mnist1d_large") == (1, 40)


def test_shapes_are_known_without_loading() -> None:
    assert dataset_shape("cifar10") == (3, 32, 32)
    assert dataset_shape("tiny_imagenet") == (3, 64, 64)
    assert dataset_shape("mnist1d") == (1, 40)
    with pytest.raises(ValueError, match="unknown dataset 'x'"):
        dataset_shape("x")


# --- BatchAugment -------------------------------------------------------------------------


def test_batch_augment_identity_and_flip_only() -> None:
    x = torch.randn(200, 3, 5, 7)
    assert torch.equal(BatchAugment(0, False, (0.0, 0.0, 0.0))(x), x)
    torch.manual_seed(0)
    out = BatchAugment(0, True, (0.0, 0.0, 0.0))(x)
    same = (out == x).flatten(1).all(1)
    flipped = (out == x.flip(-1)).flatten(1).all(1)
    assert (same | flipped).all()
    assert 0.35 < flipped.float().mean() < 0.65  # probability 1/2


def test_batch_augment_by_hand_1d() -> None:
    # one signal [1, 2, 3] padded by 1 with fill 9: [9, 1, 2, 3, 9]; the three crops are
    # [9, 1, 2], [1, 2, 3], [2, 3, 9]
    x = torch.tensor([[[1.0, 2.0, 3.0]]]).repeat(300, 1, 1)
    torch.manual_seed(0)
    out = BatchAugment(1, False, (9.0,))(x)
    crops = torch.tensor([[9.0, 1, 2], [1, 2, 3], [2, 3, 9]])
    which = (out[:, 0, None, :] == crops[None]).all(-1)
    assert which.any(1).all()
    assert (which.float().mean(0) > 0.2).all()  # each offset drawn about 1/3 of the time


def test_batch_augment_per_channel_fill() -> None:
    x = torch.zeros(64, 2, 4, 4)
    torch.manual_seed(1)
    out = BatchAugment(2, False, (5.0, -3.0))(x)
    assert set(out[:, 0].unique().tolist()) <= {0.0, 5.0}
    assert set(out[:, 1].unique().tolist()) <= {0.0, -3.0}
    assert (out[:, 0] == 5.0).any()
    # the interior is copied exactly: every sample is an exact shift of the random input
    x = torch.randn(64, 2, 4, 4)
    torch.manual_seed(2)
    out = BatchAugment(1, False, (5.0, -3.0))(x)
    fill = torch.tensor([5.0, -3.0]).view(1, 2, 1, 1)
    padded = torch.where(
        torch.nn.functional.pad(torch.ones(1, 1, 4, 4), (1, 1, 1, 1)).bool(),
        torch.nn.functional.pad(x, (1, 1, 1, 1)),
        fill,
    )
    shifts = torch.stack([padded[:, :, i : i + 4, j : j + 4] for i in range(3) for j in range(3)])
    assert (shifts == out.unsqueeze(0)).flatten(2).all(2).any(0).all()


def test_batch_augment_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"expected a \(B, C, H, W\) or \(B, C, L\) batch"):
        BatchAugment(1, False, (0.0,))(torch.zeros(3, 4))
    with pytest.raises(
        ValueError, match=r"fill: expected 1 or 3 values \(one per channel\), got 2"
    ):
        BatchAugment(1, False, (0.0, 1.0))(torch.zeros(2, 3, 4, 4))
