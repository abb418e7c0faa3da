"""Out-of-distribution sets: ``load_ood(name, root=None, in_distribution=None, ...) -> OODSet``.

Real sets (files): ``svhn`` (SVHN test, 26,032 images) and ``cifar10c`` (CIFAR-10-C, any of its
19 corruptions at severity 1–5; Gaussian noise at severity 5 is the seeds' setting), both as
``calibtune data fetch`` writes them. ``cifar10c_generated`` is CIFAR-10-C's Gaussian noise
generated from CIFAR-10's test set: a named set of its own, never a silent stand-in for
``cifar10c`` (its metrics and lineage say ``cifar10c_generated``).
Embedded sets (no files): ``digits_noise`` (near-OOD: Gaussian-noise corruption of the digits
test images, severity 1–5), ``digits_far`` (far-OOD: greyscale patches of scikit-learn's
two sample photographs) and ``mnist1d_far`` (far-OOD: scanline segments of the same
photos). Every set is normalised with its in-distribution dataset's statistics.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from .._registry import Param, Registry
from ._cifar import read_cifar
from ._common import DatasetNotFoundError, NormalizedImages, OODSet, data_param, resolve_root
from ._datasets import DATASETS, dataset_shape, dataset_stats
from ._embedded import digits_arrays, sklearn_files
from ._verify import check_stamp

# Lazy: SciPy's .mat reader (SVHN) and scikit-learn's sample photos are imported by the OOD
# sets that use them, so that `calibtune train` without those sets skips them.

__all__ = [
    "CIFAR10C_CORRUPTIONS",
    "DIGITS_NOISE_STD",
    "GAUSSIAN_NOISE_STD",
    "OOD_SETS",
    "SEVERITIES",
    "default_ood",
    "gaussian_noise_uint8",
    "list_ood",
    "load_ood",
    "ood_severities",
]

OOD_SETS: Registry[OODSet] = Registry("OOD set")

SEVERITIES = (1, 2, 3, 4, 5)
#: Hendrycks & Dietterich (ICLR 2019) Gaussian-noise std for CIFAR-10-C severities 1–5, on
#: [0, 1] pixels
GAUSSIAN_NOISE_STD = (0.04, 0.06, 0.08, 0.09, 0.10)
#: noise std for digits_noise severities 1–5 on [0, 1] pixels: 8×8 images with 17 grey levels
#: barely notice CIFAR's levels (measured: entropy AUROC 0.52–0.58 for an MLP), these give
#: 0.57–0.87
DIGITS_NOISE_STD = (0.1, 0.2, 0.3, 0.4, 0.5)
CIFAR10C_CORRUPTIONS = (
    "brightness",
    "contrast",
    "defocus_blur",
    "elastic_transform",
    "fog",
    "frost",
    "gaussian_blur",
    "gaussian_noise",
    "glass_blur",
    "impulse_noise",
    "jpeg_compression",
    "motion_blur",
    "pixelate",
    "saturate",
    "shot_noise",
    "snow",
    "spatter",
    "speckle_noise",
    "zoom_blur",
)
SVHN_URL = "http://ufldl.stanford.edu/housenumbers/"
CIFAR10C_URL = "https://zenodo.org/records/2535967"
#: generated Gaussian-noise CIFAR-10-C lives here, apart from the official files
GENERATED_FOLDER = "CIFAR-10-C-generated"

_ROOT = data_param("root", None, "folder holding the files (None: ./data)", kind="any")
_SEVERITY = data_param("severity", 5, "corruption severity 1–5", kind="int", low=1, high=5)
_SEED = data_param("seed", 0, "seed of generated noise or patches", kind="int", low=0)


def _in_distribution(default: str) -> Param:
    shape = dataset_shape(default)
    choices = tuple(n for n in DATASETS.names() if dataset_shape(n) == shape)
    doc = "dataset whose statistics normalise the set (same input shape)"
    return data_param("in_distribution", default, doc, kind="categorical", choices=choices)


def gaussian_noise_uint8(images: np.ndarray, severity: int, seed: int) -> np.ndarray:
    """CIFAR-10-C Gaussian noise (Hendrycks & Dietterich 2019) on uint8 images of any shape.

    ``x = images/255``; ``out = uint8(clip(x + N(0, c_s²), 0, 1)·255)`` with
    ``c = GAUSSIAN_NOISE_STD[severity-1]`` and truncation to uint8 as in the reference code.
    Noise comes from ``numpy.random.default_rng([seed, severity])``, drawn in chunks of 1,000
    images to bound memory.
    """
    if images.dtype != np.uint8:
        raise ValueError(f"gaussian_noise_uint8: images: expected uint8, got {images.dtype}")
    if severity not in SEVERITIES:
        raise ValueError(f"gaussian_noise_uint8: severity: expected one of 1..5, got {severity!r}")
    c = GAUSSIAN_NOISE_STD[severity - 1]
    rng = np.random.default_rng([seed, severity])
    out = np.empty_like(images)
    for start in range(0, images.shape[0], 1000):
        chunk = images[start : start + 1000] / 255.0
        noisy = np.clip(chunk + rng.normal(scale=c, size=chunk.shape), 0.0, 1.0)
        out[start : start + 1000] = (noisy * 255).astype(np.uint8)
    return out


# --- svhn ---------------------------------------------------------------------------------


@OOD_SETS.register(
    "svhn",
    params=[_ROOT, _in_distribution("cifar10")],
    summary="SVHN test set (26,032 32×32 house-number crops), far-OOD for CIFAR",
    tags=("files", "far"),
)
def _svhn(root: Any, in_distribution: str) -> OODSet:
    path = resolve_root(root, "svhn") / "test_32x32.mat"
    if not path.is_file():
        raise DatasetNotFoundError(
            f"svhn: dataset file not found: expected {path} (the cropped-digits test set, "
            f"format 2); run `calibtune data fetch svhn --root {path.parent}` (or get "
            f"test_32x32.mat from {SVHN_URL} and put it into {path.parent})"
        )
    check_stamp(path.parent, "svhn", [path.name])
    from scipy.io import loadmat

    try:
        mat = loadmat(path)
    except Exception as exc:  # any parse failure means "not a MATLAB file"
        raise ValueError(f"svhn: {path}: expected a MATLAB .mat file, got ({exc})") from None
    x, y = mat.get("X"), mat.get("y")
    if not isinstance(x, np.ndarray) or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        got = None if not isinstance(x, np.ndarray) else (x.dtype, x.shape)
        raise ValueError(f"svhn: {path}: expected 'X' of shape (32, 32, 3, N), got {got}")
    n = x.shape[3]
    if not isinstance(y, np.ndarray) or y.size != n:
        got = None if not isinstance(y, np.ndarray) else y.shape
        raise ValueError(f"svhn: {path}: expected 'y' with {n} labels, got {got}")
    # (H, W, C, N) -> (N, C, H, W); SVHN labels digit 0 as 10
    images = torch.from_numpy(np.ascontiguousarray(x.astype(np.uint8).transpose(3, 2, 0, 1)))
    labels = torch.from_numpy(y.reshape(-1).astype(np.int64) % 10)
    mean, std = dataset_stats(in_distribution)
    return OODSet("svhn", NormalizedImages(images, labels, mean, std), None, None, in_distribution)


# --- cifar10c -----------------------------------------------------------------------------


def _read_corruption(data_path: Path, labels_path: Path, severity: int) -> tuple[np.ndarray, ...]:
    data = np.load(data_path, mmap_mode="r")
    labels = np.load(labels_path, mmap_mode="r")
    if data.dtype != np.uint8 or data.ndim != 4 or data.shape[1:] != (32, 32, 3):
        raise ValueError(
            f"cifar10c: {data_path}: expected uint8 of shape (5·N, 32, 32, 3), "
            f"got {data.dtype} of shape {data.shape}"
        )
    if labels.shape != (data.shape[0],) or data.shape[0] % 5:
        raise ValueError(
            f"cifar10c: {labels_path}: expected one label per image of {data_path.name} and a "
            f"multiple of 5 images (rows N·(s−1)…N·s are severity s), got {labels.shape[0]} "
            f"labels for {data.shape[0]} images"
        )
    per = data.shape[0] // 5
    rows = slice(per * (severity - 1), per * severity)
    return np.ascontiguousarray(data[rows]), np.asarray(labels[rows], dtype=np.int64)


def _generate_gaussian(root: Path, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """All five severities from the CIFAR-10 test set in the official layout, cached under
    ``<root>/CIFAR-10-C-generated/seed<seed>/`` when the folder is writable."""
    test = read_cifar(root, "cifar10", test_only=True)
    images = test.test_images.numpy().transpose(0, 2, 3, 1)  # NHWC like CIFAR-10-C
    data = np.concatenate([gaussian_noise_uint8(images, s, seed) for s in SEVERITIES])
    labels = np.tile(test.test_labels.numpy().astype(np.uint8), len(SEVERITIES))
    folder = root / GENERATED_FOLDER / f"seed{seed}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for fname, array in (("gaussian_noise.npy", data), ("labels.npy", labels)):
            tmp = folder / f".{fname}.tmp.npy"
            np.save(tmp, array)
            os.replace(tmp, folder / fname)  # atomic: readers never see half a file
    except OSError as exc:
        warnings.warn(
            f"cifar10c: could not cache the generated corruption in {folder} ({exc}); "
            f"it will be regenerated next time",
            stacklevel=3,
        )
    return data, labels


_CIFAR10C_PARAMS = [
    _ROOT,
    _in_distribution("cifar10"),
    data_param(
        "corruption",
        "gaussian_noise",
        "CIFAR-10-C corruption (file <corruption>.npy)",
        kind="categorical",
        choices=CIFAR10C_CORRUPTIONS,
    ),
    _SEVERITY,
]


@OOD_SETS.register(
    "cifar10c",
    params=_CIFAR10C_PARAMS,
    summary="CIFAR-10-C (Hendrycks & Dietterich 2019) corruption at one severity, from the "
    "official .npy files (`calibtune data fetch cifar10c`)",
    tags=("files", "near"),
)
def _cifar10c(root: Any, in_distribution: str, corruption: str, severity: int) -> OODSet:
    base = resolve_root(root, "cifar10c")
    official = base / "CIFAR-10-C"
    if not ((official / f"{corruption}.npy").is_file() and (official / "labels.npy").is_file()):
        alt = (
            "; without them, the named set cifar10c_generated generates Gaussian noise from "
            "CIFAR-10's test set (another draw, recorded under its own name)"
            if corruption == "gaussian_noise"
            else ""
        )
        raise DatasetNotFoundError(
            f"cifar10c: dataset files not found: expected {official}/ with {corruption}.npy and "
            f"labels.npy; run `calibtune data fetch cifar10c --root {base}` (or get "
            f"CIFAR-10-C.tar from {CIFAR10C_URL} and extract it into {base}){alt}"
        )
    check_stamp(base, "cifar10c", [f"CIFAR-10-C/{corruption}.npy", "CIFAR-10-C/labels.npy"])
    images, labels = _read_corruption(
        official / f"{corruption}.npy", official / "labels.npy", severity
    )
    return _corrupted("cifar10c", images, labels, severity, corruption, in_distribution)


def _corrupted(
    name: str,
    images: np.ndarray,
    labels: np.ndarray,
    severity: int,
    corruption: str,
    in_distribution: str,
) -> OODSet:
    """`OODSet` of NHWC uint8 CIFAR-10-C rows, normalised with ``in_distribution``'s stats."""
    tensor = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    mean, std = dataset_stats(in_distribution)
    dataset = NormalizedImages(tensor, torch.from_numpy(labels), mean, std)
    return OODSet(name, dataset, severity, corruption, in_distribution)


@OOD_SETS.register(
    "cifar10c_generated",
    params=[_ROOT, _in_distribution("cifar10"), _SEVERITY, _SEED],
    summary="CIFAR-10-C Gaussian noise generated from CIFAR-10's test set (the reference "
    "formula, another noise draw than the official files); cached under CIFAR-10-C-generated/",
    tags=("files", "near", "generated"),
)
def _cifar10c_generated(root: Any, in_distribution: str, severity: int, seed: int) -> OODSet:
    base = resolve_root(root, "cifar10c_generated")
    cached = base / GENERATED_FOLDER / f"seed{seed}"
    if (cached / "gaussian_noise.npy").is_file() and (cached / "labels.npy").is_file():
        images, labels = _read_corruption(
            cached / "gaussian_noise.npy", cached / "labels.npy", severity
        )
    else:
        data, all_labels = _generate_gaussian(base, seed)
        per = data.shape[0] // 5
        rows = slice(per * (severity - 1), per * severity)
        images, labels = data[rows], all_labels[rows].astype(np.int64)
    return _corrupted(
        "cifar10c_generated", images, labels, severity, "gaussian_noise", in_distribution
    )


# --- embedded: digits ---------------------------------------------------------------------


def _normalised(x: np.ndarray, in_distribution: str) -> torch.Tensor:
    mean, std = dataset_stats(in_distribution)
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, *([1] * (x.ndim - 2)))
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, *([1] * (x.ndim - 2)))
    return (torch.tensor(x, dtype=torch.float32) - m) / s


@OOD_SETS.register(
    "digits_noise",
    params=[_in_distribution("digits"), _SEVERITY, _SEED],
    summary="near-OOD: Gaussian noise (std 0.1–0.5 on [0, 1] pixels) on the 359 digits test images",
    tags=("embedded", "near"),
)
def _digits_noise(in_distribution: str, severity: int, seed: int) -> OODSet:
    """``clip(x + N(0, c_s²), 0, 1)`` of the fixed digits test images on [0, 1] pixels, with
    ``c = DIGITS_NOISE_STD`` and ``numpy.random.default_rng([seed, severity])``; kept as floats
    (no 8-bit quantisation: the originals have 17 grey levels)."""
    _, _, test_x, test_y = digits_arrays()
    rng = np.random.default_rng([seed, severity])
    noisy = np.clip(
        test_x + rng.normal(scale=DIGITS_NOISE_STD[severity - 1], size=test_x.shape), 0, 1
    )
    dataset = TensorDataset(_normalised(noisy, in_distribution), torch.tensor(test_y))
    return OODSet("digits_noise", dataset, severity, "gaussian_noise", in_distribution)


def _sample_photos_rgb() -> list[np.ndarray]:
    """scikit-learn's two bundled photographs (china.jpg, flower.jpg; 427×640×3 uint8), read
    as ``load_sample_images`` reads them (PIL, sorted file names) without importing it."""
    if paths := sklearn_files("images", "*.jpg"):
        from PIL import Image

        out = []
        for path in paths:
            with Image.open(path) as img:
                out.append(np.asarray(img))
        return out
    from sklearn.datasets import load_sample_images

    return list(load_sample_images().images)


def _sample_photos_grey() -> list[np.ndarray]:
    """`_sample_photos_rgb` as greyscale on [0, 1] (ITU-R 601 luma)."""
    luma = np.array([0.299, 0.587, 0.114])
    return [(img.astype(np.float64) @ luma) / 255.0 for img in _sample_photos_rgb()]


def _photo_crops(num_samples: int, seed: int, height: int, width: int) -> np.ndarray:
    """``(num_samples, height, width)`` crops of `_sample_photos_grey` at uniform random
    positions: with ``numpy.random.default_rng(seed)``, the photo, then the top row, then the
    left column; one fancy-index gather."""
    photos = np.stack(_sample_photos_grey())  # (2, 427, 640)
    rng = np.random.default_rng(seed)
    which = rng.integers(0, photos.shape[0], num_samples)[:, None, None]
    top = rng.integers(0, photos.shape[1] - height + 1, num_samples)[:, None, None]
    left = rng.integers(0, photos.shape[2] - width + 1, num_samples)[:, None, None]
    return photos[which, top + np.arange(height)[:, None], left + np.arange(width)]


def _far_set(name: str, x: np.ndarray, in_distribution: str) -> OODSet:
    """Far-OOD set ``name`` of inputs ``x`` (N, C, ...), labelled ``-1`` (no class)."""
    labels = torch.full((x.shape[0],), -1, dtype=torch.int64)
    dataset = TensorDataset(_normalised(x, in_distribution), labels)
    return OODSet(name, dataset, None, None, in_distribution)


def _digits_far(in_distribution: str, num_samples: int, seed: int) -> OODSet:
    """32×32 `_photo_crops`, each averaged over 4×4 blocks to 8×8. Labels are ``-1``."""
    patches = _photo_crops(num_samples, seed, 32, 32)
    small = patches.reshape(num_samples, 8, 4, 8, 4).mean(axis=(2, 4))[:, None]
    return _far_set("digits_far", small, in_distribution)


# --- embedded: mnist1d --------------------------------------------------------------------


def _mnist1d_far(in_distribution: str, num_samples: int, seed: int) -> OODSet:
    """1×160 `_photo_crops` (row segments), averaged over blocks of 4 pixels to length 40,
    each standardised to mean 0 and std 1 so that scale alone does not give them away
    (MNIST-1D is standardised too). Labels are ``-1``.

    A Gaussian-noise near-OOD set is deliberately absent for MNIST-1D: its signals already
    carry generated noise, and measured entropy AUROCs for added noise of std 0.1–1.0 stayed
    within 0.41–0.57 (cnn1d and mlp), i.e. no usable severity ladder."""
    segments = _photo_crops(num_samples, seed, 1, 160)[:, 0]
    signals = segments.reshape(num_samples, 40, 4).mean(axis=2)
    centred = signals - signals.mean(axis=1, keepdims=True)
    # flat segments (sky) have std ~0: the floor keeps them flat instead of amplifying noise
    signals = centred / np.maximum(centred.std(axis=1, keepdims=True), 1e-3)
    return _far_set("mnist1d_far", signals[:, None], in_distribution)


#: name -> (builder, in-distribution dataset, default number of samples, what one sample is,
#: summary)
_FAR_SETS = {
    "digits_far": (
        _digits_far,
        "digits",
        500,
        "patches",
        "far-OOD: random 32×32 greyscale patches of scikit-learn's sample photos, "
        "area-downsampled to 8×8",
    ),
    "mnist1d_far": (
        _mnist1d_far,
        "mnist1d",
        1000,
        "signals",
        "far-OOD: 160-pixel greyscale scanline segments of scikit-learn's sample photos, "
        "averaged to length 40 and standardised per signal",
    ),
}
for _name, (_build, _in, _n, _what, _summary) in _FAR_SETS.items():
    _count = data_param("num_samples", _n, f"number of {_what}", kind="int", low=1)
    OOD_SETS.add(
        _name,
        _build,
        params=[_in_distribution(_in), _count, _SEED],
        summary=_summary,
        tags=("embedded", "far"),
    )


# --- API ----------------------------------------------------------------------------------

_DEFAULT_OOD: dict[str, tuple[str, ...]] = {
    "cifar10": ("svhn", "cifar10c"),
    "cifar100": ("svhn",),
    "tiny_imagenet": (),
    "digits": ("digits_noise", "digits_far"),
    "mnist1d": ("mnist1d_far",),
    "mnist1d_large": ("mnist1d_far",),
}


def list_ood() -> list[str]:
    """Registered OOD set names, sorted."""
    return OOD_SETS.names()


def ood_severities(name: str) -> tuple[int, ...] | None:
    """``(1, 2, 3, 4, 5)`` for sets with a ``severity`` parameter (evaluate each), None for
    sets without one (``svhn``, ``digits_far``)."""
    entry = OOD_SETS.get(name)
    return SEVERITIES if any(p.name == "severity" for p in entry.params) else None


def default_ood(dataset_name: str) -> list[str]:
    """The OOD sets evaluated by default for a dataset: the seeds' CIFAR-10 → SVHN and
    CIFAR-10-C, CIFAR-100 → SVHN, digits → digits_noise and digits_far, MNIST-1D →
    mnist1d_far; none for Tiny-ImageNet."""
    DATASETS.get(dataset_name)
    return list(_DEFAULT_OOD.get(dataset_name, ()))


def load_ood(
    name: str,
    root: str | os.PathLike[str] | None = None,
    in_distribution: str | None = None,
    severity: int | None = None,
    corruption: str | None = None,
    seed: int = 0,
    **params: Any,
) -> OODSet:
    """Load OOD set ``name`` normalised with ``in_distribution``'s statistics.

    ``None`` arguments take the set's defaults (its natural in-distribution dataset, severity
    5, corruption ``gaussian_noise``); ``severity``/``corruption`` given to a set without them
    raise ``ValueError``. ``root`` and ``seed`` are ignored by sets that do not use them.
    ``params`` are other declared parameters (e.g. ``num_samples`` of the far sets).
    Missing files raise `DatasetNotFoundError`; nothing is downloaded.
    """
    entry = OOD_SETS.get(name)
    declared = {p.name for p in entry.params}
    kwargs: dict[str, Any] = dict(params)
    if "root" in declared:
        kwargs["root"] = root
    if "seed" in declared:
        kwargs["seed"] = seed
    for key, value in (
        ("in_distribution", in_distribution),
        ("severity", severity),
        ("corruption", corruption),
    ):
        if value is not None:
            kwargs[key] = value
    return OOD_SETS.build(name, **kwargs)
