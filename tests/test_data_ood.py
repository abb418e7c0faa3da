"""OOD sets: SVHN .mat, CIFAR-10-C .npy (read; Gaussian noise generated only as the named set
cifar10c_generated), and the embedded near/far sets."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import sliding_window_view
from scipy.io import savemat

import calibtune.data._ood as ood_module
from calibtune.data import (
    CIFAR10C_CORRUPTIONS,
    OOD_SETS,
    DatasetNotFoundError,
    OODSet,
    dataset_stats,
    default_ood,
    gaussian_noise_uint8,
    list_datasets,
    list_ood,
    load_ood,
    load_splits,
    ood_severities,
)

CIFAR10_MEAN = torch.tensor((0.4914, 0.4822, 0.4465)).view(3, 1, 1)
CIFAR10_STD = torch.tensor((0.2470, 0.2435, 0.2616)).view(3, 1, 1)


def write_svhn(root: Path, n: int = 30) -> np.ndarray:
    """``<root>/test_32x32.mat`` as in the official file: X (32, 32, 3, N) uint8, y (N, 1) with
    digit 0 stored as 10. Returns the images as (N, 3, 32, 32)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
    y = (np.arange(n) % 10 + 1).reshape(-1, 1).astype(np.uint8)  # 1..10
    root.mkdir(parents=True, exist_ok=True)
    savemat(root / "test_32x32.mat", {"X": x, "y": y})
    return x.transpose(3, 2, 0, 1)


def write_cifar10c(root: Path, corruption: str, per_severity: int = 8) -> np.ndarray:
    """``<root>/CIFAR-10-C/<corruption>.npy`` (5·n, 32, 32, 3) uint8 and labels.npy; every
    pixel of a severity-s row equals 10·s + (row index within the severity) so the rows read
    back identify themselves."""
    folder = root / "CIFAR-10-C"
    folder.mkdir(parents=True, exist_ok=True)
    sev = np.repeat(np.arange(1, 6), per_severity)
    within = np.tile(np.arange(per_severity), 5)
    data = np.broadcast_to(
        (10 * sev + within).astype(np.uint8)[:, None, None, None], (5 * per_severity, 32, 32, 3)
    )
    np.save(folder / f"{corruption}.npy", np.ascontiguousarray(data))
    np.save(folder / "labels.npy", np.tile(np.arange(per_severity) % 10, 5).astype(np.uint8))
    return data


def write_cifar10_test(root: Path, n: int = 20, value: int | None = None) -> np.ndarray:
    """Only what CIFAR-10-C generation needs: test_batch and batches.meta of the python
    version. ``value`` fills every pixel (else random). Returns (N, 3072) uint8."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    data = (
        np.full((n, 3072), value, np.uint8)
        if value is not None
        else rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    )
    with (folder / "test_batch").open("wb") as f:
        pickle.dump({"data": data, "labels": [i % 10 for i in range(n)]}, f, protocol=2)
    with (folder / "batches.meta").open("wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f, protocol=2)
    return data


def all_x(dataset: torch.utils.data.Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))), strict=True)
    return torch.stack(xs), torch.as_tensor(ys)


# --- registry -----------------------------------------------------------------------------


def test_registry_lists_every_ood_set() -> None:
    expected = [
        "cifar10c",
        "cifar10c_generated",
        "digits_far",
        "digits_noise",
        "mnist1d_far",
        "svhn",
    ]
    assert list_ood() == expected == OOD_SETS.names()
    with pytest.raises(ValueError, match=r"unknown OOD set 'lsun'; expected one of: cifar10c, "):
        load_ood("lsun")


def test_severities_and_default_pairings() -> None:
    assert ood_severities("cifar10c") == (1, 2, 3, 4, 5)
    assert ood_severities("digits_noise") == (1, 2, 3, 4, 5)
    assert ood_severities("svhn") is None
    assert ood_severities("digits_far") is None
    assert default_ood("cifar10") == ["svhn", "cifar10c"]
    assert default_ood("digits") == ["digits_noise", "digits_far"]
    assert default_ood("mnist1d") == ["mnist1d_far"] == default_ood("mnist1d_large")
    assert default_ood("tiny_imagenet") == []
    for name in list_datasets():  # every default pairing is one its OOD set accepts
        for o in default_ood(name):
            OOD_SETS.get(o).param("in_distribution").validate(name)  # raises if not allowed
    with pytest.raises(ValueError, match="unknown dataset 'svhn'"):
        default_ood("svhn")


def test_parameters_are_validated() -> None:
    with pytest.raises(
        ValueError, match=r"digits_noise: severity: expected an integer in \[1, 5\]"
    ):
        load_ood("digits_noise", severity=6)
    with pytest.raises(ValueError, match=r"digits_far: unknown parameter 'severity'"):
        load_ood("digits_far", severity=3)
    with pytest.raises(ValueError, match=r"digits_noise: unknown parameter 'corruption'"):
        load_ood("digits_noise", corruption="fog")
    # pairing is restricted to datasets with the same input shape
    with pytest.raises(
        ValueError,
        match=r"svhn: in_distribution: expected one of 'cifar10', 'cifar100', got 'digits'",
    ):
        load_ood("svhn", in_distribution="digits")
    with pytest.raises(ValueError, match=r"cifar10c: corruption: expected one of 'brightness'"):
        load_ood("cifar10c", corruption="rain")
    with pytest.raises(ValueError, match=r"svhn: root: expected a folder path or None, got 3"):
        load_ood("svhn", root=3)
    assert len(CIFAR10C_CORRUPTIONS) == 19


# --- svhn ---------------------------------------------------------------------------------


def test_svhn_reads_mat_and_normalises_with_in_distribution_stats(tmp_path: Path) -> None:
    images = write_svhn(tmp_path, n=30)
    o = load_ood("svhn", root=tmp_path)
    assert isinstance(o, OODSet)
    assert (o.name, o.severity, o.corruption, o.in_distribution) == ("svhn", None, None, "cifar10")
    x, y = all_x(o.dataset)
    assert x.shape == (30, 3, 32, 32) and x.dtype == torch.float32
    assert y.tolist() == [(i + 1) % 10 for i in range(30)]  # 10 means digit 0
    raw = torch.from_numpy(images).float() / 255
    torch.testing.assert_close(x, (raw - CIFAR10_MEAN) / CIFAR10_STD)
    o100 = load_ood("svhn", root=tmp_path, in_distribution="cifar100")
    mean, std = dataset_stats("cifar100")
    ref = (raw - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)
    torch.testing.assert_close(all_x(o100.dataset)[0], ref)


def test_svhn_missing_and_malformed(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_ood("svhn", root=tmp_path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("svhn: dataset file not found: expected ")
    assert str(tmp_path / "test_32x32.mat") in msg
    assert "http://ufldl.stanford.edu/housenumbers/" in msg
    savemat(
        tmp_path / "test_32x32.mat", {"X": np.zeros((28, 28, 3, 2), np.uint8), "y": np.ones((2, 1))}
    )
    with pytest.raises(ValueError, match=r"svhn: .*expected 'X' of shape \(32, 32, 3, N\)"):
        load_ood("svhn", root=tmp_path)
    (tmp_path / "test_32x32.mat").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"expected a MATLAB .mat file"):
        load_ood("svhn", root=tmp_path)


# --- cifar10c -----------------------------------------------------------------------------


@pytest.mark.parametrize("severity", [1, 3, 5])
def test_cifar10c_selects_severity_rows(tmp_path: Path, severity: int) -> None:
    write_cifar10c(tmp_path, "gaussian_noise", per_severity=8)
    o = load_ood("cifar10c", root=tmp_path, severity=severity)
    assert (o.severity, o.corruption) == (severity, "gaussian_noise")
    assert len(o.dataset) == 8
    raw = o.dataset.images  # uint8 (8, 3, 32, 32): rows 8·(s−1) … 8·s
    assert raw[:, 0, 0, 0].tolist() == [10 * severity + i for i in range(8)]
    x, y = all_x(o.dataset)
    assert y.tolist() == [i % 10 for i in range(8)]
    torch.testing.assert_close(x, (raw.float() / 255 - CIFAR10_MEAN) / CIFAR10_STD)


def test_cifar10c_default_is_gaussian_noise_severity_5_and_any_corruption(tmp_path: Path) -> None:
    write_cifar10c(tmp_path, "gaussian_noise")
    write_cifar10c(tmp_path, "fog")
    o = load_ood("cifar10c", root=tmp_path)
    assert (o.severity, o.corruption) == (5, "gaussian_noise")
    fog = load_ood("cifar10c", root=tmp_path, corruption="fog", severity=2)
    assert (fog.severity, fog.corruption) == (2, "fog")
    assert fog.dataset.images[0, 0, 0, 0].item() == 20


def test_cifar10c_rejects_malformed_files(tmp_path: Path) -> None:
    folder = tmp_path / "CIFAR-10-C"
    folder.mkdir()
    np.save(folder / "fog.npy", np.zeros((10, 32, 32), np.uint8))
    np.save(folder / "labels.npy", np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match=r"fog.npy: expected uint8 of shape \(5·N, 32, 32, 3\)"):
        load_ood("cifar10c", root=tmp_path, corruption="fog")
    np.save(folder / "fog.npy", np.zeros((12, 32, 32, 3), np.uint8))
    np.save(folder / "labels.npy", np.zeros(12, np.uint8))
    with pytest.raises(ValueError, match=r"a multiple of 5 images"):
        load_ood("cifar10c", root=tmp_path, corruption="fog")


def test_cifar10c_missing_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_ood("cifar10c", root=tmp_path, corruption="fog")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("cifar10c: dataset files not found: expected ")
    assert f"{tmp_path / 'CIFAR-10-C'}/ with fog.npy and labels.npy" in msg
    assert "https://zenodo.org/records/2535967" in msg
    assert f"run `calibtune data fetch cifar10c --root {tmp_path}`" in msg
    assert "generated" not in msg  # only Gaussian noise can be generated
    with pytest.raises(DatasetNotFoundError, match=r"the named set cifar10c_generated generates"):
        load_ood("cifar10c", root=tmp_path)


def test_cifar10c_never_generates_silently(tmp_path: Path) -> None:
    # issue 30 item 5: CIFAR-10's test set present, CIFAR-10-C absent -> refused, nothing written
    write_cifar10_test(tmp_path, n=10)
    with pytest.raises(DatasetNotFoundError, match=r"calibtune data fetch cifar10c"):
        load_ood("cifar10c", root=tmp_path)
    assert not (tmp_path / "CIFAR-10-C-generated").exists()
    o = load_ood("cifar10c_generated", root=tmp_path, severity=5)
    assert (o.name, o.corruption, o.severity, len(o.dataset)) == (
        "cifar10c_generated",
        "gaussian_noise",
        5,
        10,
    )


def test_gaussian_noise_by_hand() -> None:
    # severity 5: c = 0.10 on [0, 1] pixels, i.e. 25.5 grey levels; on mid-grey 128 clipping
    # is ~5σ away, so the truncated result has mean ≈ 128 − 0.5 and std ≈ 25.5 (+ rounding)
    grey = np.full((200, 32, 32, 3), 128, np.uint8)
    for severity, c in zip(range(1, 6), (0.04, 0.06, 0.08, 0.09, 0.10), strict=True):
        out = gaussian_noise_uint8(grey, severity, seed=0).astype(float)
        assert out.std() == pytest.approx(c * 255, rel=0.02)
        assert out.mean() == pytest.approx(127.5, abs=0.1)
    # clipping: black stays ≥ 0 and about half its pixels stay exactly 0
    black = gaussian_noise_uint8(np.zeros((50, 32, 32, 3), np.uint8), 5, seed=0)
    assert 0.45 < (black == 0).mean() < 0.6
    # seeded; severities use independent streams
    a = gaussian_noise_uint8(grey[:5], 3, seed=7)
    assert np.array_equal(a, gaussian_noise_uint8(grey[:5], 3, seed=7))
    assert not np.array_equal(a, gaussian_noise_uint8(grey[:5], 3, seed=8))
    with pytest.raises(ValueError, match="expected uint8, got float64"):
        gaussian_noise_uint8(grey.astype(float), 1, seed=0)
    with pytest.raises(ValueError, match=r"severity: expected one of 1..5, got 0"):
        gaussian_noise_uint8(grey, 0, seed=0)


def test_cifar10c_generated_from_cifar10_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_cifar10_test(tmp_path, n=20, value=128)
    o = load_ood("cifar10c_generated", root=tmp_path, severity=5, seed=3)
    assert (o.severity, o.corruption, len(o.dataset)) == (5, "gaussian_noise", 20)
    raw = o.dataset.images.float()
    assert raw.std().item() == pytest.approx(0.10 * 255, rel=0.03)
    assert o.dataset.labels.tolist() == [i % 10 for i in range(20)]
    cache = tmp_path / "CIFAR-10-C-generated" / "seed3"
    data = np.load(cache / "gaussian_noise.npy")
    labels = np.load(cache / "labels.npy")
    assert data.shape == (100, 32, 32, 3) and data.dtype == np.uint8  # official layout
    assert labels.shape == (100,)
    # severity s = rows 20·(s−1) … 20·s; the noise grows with s
    stds = [data[20 * (s - 1) : 20 * s].astype(float).std() for s in range(1, 6)]
    assert stds == sorted(stds)
    assert np.array_equal(data[80:100].transpose(0, 3, 1, 2), o.dataset.images.numpy())
    # second call reads the cache and must not regenerate
    monkeypatch.setattr(ood_module, "_generate_gaussian", lambda *a: pytest.fail("regenerated"))
    again = load_ood("cifar10c_generated", root=tmp_path, severity=1, seed=3)
    assert np.array_equal(data[0:20].transpose(0, 3, 1, 2), again.dataset.images.numpy())


def test_cifar10c_generation_is_seeded(tmp_path: Path) -> None:
    write_cifar10_test(tmp_path, n=10)
    a = load_ood("cifar10c_generated", root=tmp_path, severity=2, seed=0).dataset.images
    b = load_ood("cifar10c_generated", root=tmp_path, severity=2, seed=1).dataset.images
    assert not torch.equal(a, b)
    (tmp_path / "CIFAR-10-C-generated" / "seed0" / "gaussian_noise.npy").unlink()
    again = load_ood("cifar10c_generated", root=tmp_path, severity=2, seed=0).dataset.images
    assert torch.equal(a, again)  # regenerated identically


def test_official_cifar10c_files_take_precedence(tmp_path: Path) -> None:
    write_cifar10_test(tmp_path, n=10)
    write_cifar10c(tmp_path, "gaussian_noise", per_severity=4)
    o = load_ood("cifar10c", root=tmp_path, severity=4)
    assert o.dataset.images[:, 0, 0, 0].tolist() == [40, 41, 42, 43]
    assert not (tmp_path / "CIFAR-10-C-generated").exists()


# --- embedded -----------------------------------------------------------------------------


def test_digits_noise_severities() -> None:
    splits = load_splits("digits")
    clean = splits.test.tensors[0]
    mean, std = splits.mean[0], splits.std[0]
    gaps = []
    for s in (1, 2, 3, 4, 5):
        o = load_ood("digits_noise", severity=s)
        assert (o.name, o.severity, o.corruption, o.in_distribution) == (
            "digits_noise",
            s,
            "gaussian_noise",
            "digits",
        )
        x, y = o.dataset.tensors
        assert x.shape == clean.shape and torch.equal(y, splits.test.tensors[1])
        pixels = x * std + mean
        assert pixels.min() >= -1e-6 and pixels.max() <= 1 + 1e-6  # clipped to [0, 1]
        gaps.append((x - clean).abs().mean().item())
    assert gaps == sorted(gaps) and gaps[0] > 0
    a = load_ood("digits_noise", severity=3, seed=5).dataset.tensors[0]
    assert torch.equal(a, load_ood("digits_noise", severity=3, seed=5).dataset.tensors[0])
    assert not torch.equal(a, load_ood("digits_noise", severity=3, seed=6).dataset.tensors[0])


def test_digits_far_patches() -> None:
    o = load_ood("digits_far", seed=0)
    x, y = o.dataset.tensors
    assert x.shape == (500, 1, 8, 8) and (y == -1).all()
    (mean,), (std,) = dataset_stats("digits")
    pixels = x * std + mean
    assert pixels.min() >= -1e-6 and pixels.max() <= 1 + 1e-6
    assert pixels.std() > 0.05  # real image content, not a constant
    assert torch.equal(x, load_ood("digits_far", seed=0).dataset.tensors[0])
    assert not torch.equal(x, load_ood("digits_far", seed=1).dataset.tensors[0])
    assert len(load_ood("digits_far", num_samples=7).dataset) == 7


def test_digits_far_patches_are_block_averages_of_photo_windows() -> None:
    from sklearn.datasets import load_sample_images

    luma = np.array([0.299, 0.587, 0.114])
    photos = [(img.astype(float) @ luma) / 255 for img in load_sample_images().images]
    # a 32×32 window at (top, left) averaged over 4×4 blocks is box[top + 4i, left + 4j],
    # box = the 4×4 mean at every pixel
    boxes = [sliding_window_view(g, (4, 4)).mean(axis=(2, 3)) for g in photos]
    o = load_ood("digits_far", seed=0, num_samples=6)
    (mean,), (std,) = dataset_stats("digits")
    patches = (o.dataset.tensors[0][:, 0].double() * std + mean).numpy()  # (6, 8, 8) on [0, 1]
    for patch in patches:
        found = []  # search every window of both photos for the patch
        for k, box in enumerate(boxes):
            tops, lefts = np.nonzero(np.abs(box[:-28, :-28] - patch[0, 0]) < 1e-5)
            for t, left in zip(tops, lefts, strict=True):
                if np.allclose(box[t : t + 32 : 4, left : left + 32 : 4], patch, atol=1e-5):
                    found.append((k, t, left))
        assert found, "a digits_far patch is not the 4×4 block average of any 32×32 window"


def test_mnist1d_far_signals_are_standardised_row_segments_of_the_photos() -> None:
    from sklearn.datasets import load_sample_images

    luma = np.array([0.299, 0.587, 0.114])
    o = load_ood("mnist1d_far", seed=0, num_samples=3)
    (mean,), (std,) = dataset_stats("mnist1d")
    signals = (o.dataset.tensors[0][:, 0].double() * std + mean).numpy()  # (3, 40)
    found = [False] * len(signals)
    for img in load_sample_images().images:
        grey = ((img.astype(float) @ luma) / 255).astype(np.float32)
        # every 160-pixel row segment averaged over blocks of 4: box[r, start + 4k], k < 40
        box = sliding_window_view(grey, 4, axis=1).mean(axis=2)
        segs = sliding_window_view(box, 157, axis=1)[:, :, ::4]  # (rows, starts, 40)
        centred = segs - segs.mean(axis=2, keepdims=True)
        # documented: per-signal std 1, with a 1e-3 floor that keeps flat segments flat
        cand = centred / np.maximum(centred.std(axis=2, keepdims=True), 1e-3)
        for i, sig in enumerate(signals):
            found[i] |= bool((np.abs(cand - sig.astype(np.float32)).max(axis=2) < 1e-3).any())
    assert all(found), found


def test_mnist1d_far_signals() -> None:
    o = load_ood("mnist1d_far", seed=0)
    x, y = o.dataset.tensors
    assert x.shape == (1000, 1, 40) and (y == -1).all()
    per_signal_std = x.std(dim=-1, unbiased=False)
    busy = per_signal_std > 0.5
    assert busy.float().mean() > 0.9
    assert torch.allclose(per_signal_std[busy], torch.ones(1), atol=1e-4)
    assert torch.allclose(x.mean(dim=-1), torch.zeros(1), atol=1e-4)


def test_sample_photos_are_read_as_sklearn_reads_them_without_importing_it() -> None:
    from sklearn.datasets import load_sample_images

    ours = ood_module._sample_photos_rgb()
    theirs = load_sample_images().images
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    code = (
        "import sys; from calibtune.data import load_ood, load_splits; "
        "load_ood('digits_far', num_samples=3); load_splits('digits', seed=0); "
        "print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
