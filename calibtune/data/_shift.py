"""Shift sets: a dataset's splits under corruption, for calibration under dataset shift.

A shift set corrupts the *test* split (what ``shift/<set>/…`` keys report, via the OOD set that
holds it) and, where calibtune can reproduce the corruption, the *validation* split the same way
(``val_shift/<set>/…``: the only shift data a study may select on). Severities 1–5 each.

- ``digits_noise`` (digits): test side = OOD set ``digits_noise``; validation side = the same
  noise on the validation images;
- ``cifar10c-gaussian_noise`` (cifar10): test side = CIFAR-10-C ``gaussian_noise.npy`` (the
  official file: ``calibtune data fetch cifar10c``); validation side = the same noise on the
  validation images;
- ``cifar10c-<corruption>`` (cifar10, the other 18): test side = CIFAR-10-C
  ``<corruption>.npy``; no validation side.

CIFAR-10-C (Hendrycks & Dietterich, ICLR 2019) is made from CIFAR-10's test images only, so its
validation side must be generated: calibtune reproduces Gaussian noise exactly (the reference
formula, `gaussian_noise_uint8`); the other 18 corruptions need the authors' ImageMagick/Wand
pipeline and have no validation side (their ``val_shift/`` keys do not exist, so a study cannot
select on them). The validation side draws its noise from seed 1 (the test side's generated
noise and ``digits_noise`` use seed 0), so the two sides never share noise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from ._common import NormalizedImages, Splits
from ._ood import (
    CIFAR10C_CORRUPTIONS,
    DIGITS_NOISE_STD,
    OOD_SETS,
    SEVERITIES,
    gaussian_noise_uint8,
    load_ood,
)

__all__ = [
    "SHIFT_SIDES",
    "VAL_NOISE_SEED",
    "ShiftSet",
    "dataset_labels",
    "default_shift",
    "get_shift",
    "list_shift",
    "load_shift",
    "ood_twin",
    "shift_sets_for",
    "shift_severities",
]

#: the split each side corrupts, named as its metric keys' split (`calibtune.metrics.keys`)
SHIFT_SIDES = {"shift": "test", "val_shift": "val"}
VAL_NOISE_SEED = 1


@dataclass(frozen=True)
class ShiftSet:
    """One shift set: ``name`` is the ``<set>`` part of its keys; the test side is OOD set
    ``ood`` with ``corruption``; ``val_side`` says whether the validation split can be corrupted
    alike."""

    name: str
    dataset: str
    ood: str
    corruption: str | None
    val_side: bool
    summary: str


_SETS = {
    s.name: s
    for s in (
        ShiftSet(
            "digits_noise",
            "digits",
            "digits_noise",
            None,
            True,
            "Gaussian noise, std 0.1–0.5 on [0, 1] pixels",
        ),
        *(
            ShiftSet(
                f"cifar10c-{c}",
                "cifar10",
                "cifar10c",
                c,
                c == "gaussian_noise",
                f"CIFAR-10-C {c.replace('_', ' ')}",
            )
            for c in CIFAR10C_CORRUPTIONS
        ),
    )
}
_DEFAULT = {"digits": ("digits_noise",), "cifar10": ("cifar10c-gaussian_noise",)}


def list_shift() -> list[str]:
    """Every shift set name, sorted."""
    return sorted(_SETS)


def shift_sets_for(dataset: str) -> list[str]:
    """The shift sets that corrupt ``dataset``'s splits (none for cifar100, tiny_imagenet and
    mnist1d: no corruption ladder is shipped for them)."""
    return [n for n in list_shift() if _SETS[n].dataset == dataset]


def default_shift(dataset: str) -> list[str]:
    """What a trial evaluates when ``data.shift`` is not given: digits → ``digits_noise``,
    cifar10 → ``cifar10c-gaussian_noise`` (the sets the OOD defaults already load)."""
    return list(_DEFAULT.get(dataset, ()))


def get_shift(name: str) -> ShiftSet:
    """The set called ``name``; ``ValueError`` listing the known names otherwise."""
    try:
        return _SETS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown shift set {name!r}; expected one of: {', '.join(list_shift())}"
        ) from None


def shift_severities(name: str) -> dict[str, tuple[int, ...]]:
    """Side (``shift``/``val_shift``) -> severities evaluated; no ``val_shift`` entry for sets
    without a validation side."""
    sides = ("shift", "val_shift") if get_shift(name).val_side else ("shift",)
    return {side: SEVERITIES for side in sides}


def ood_twin(name: str) -> str | None:
    """The OOD set whose data (at its default corruption) *is* ``name``'s test side, so that one
    inference pass serves both (``digits_noise``, ``cifar10c-gaussian_noise`` → ``cifar10c``);
    None when the test side is a corruption the OOD set does not load by default."""
    s = get_shift(name)
    default = OOD_SETS.get(s.ood).defaults().get("corruption")
    return s.ood if s.corruption is None or s.corruption == default else None


def dataset_labels(ds: Dataset) -> Tensor:
    """The int64 labels of an in-memory split or set (`NormalizedImages` or `TensorDataset`)."""
    labels = ds.labels if isinstance(ds, NormalizedImages) else ds.tensors[1]  # type: ignore[attr-defined]
    return torch.as_tensor(labels, dtype=torch.int64)


def load_shift(
    name: str,
    side: str,
    severity: int,
    *,
    splits: Splits | None = None,
    root: str | os.PathLike[str] | None = None,
) -> Dataset:
    """Shift set ``name`` at ``severity`` on ``side`` (`SHIFT_SIDES`), normalised like
    ``splits``: the test side is loaded from its OOD set (files for CIFAR-10-C; never
    downloaded), the validation side is ``splits.val`` corrupted (``splits`` required)."""
    s = get_shift(name)
    if side == "shift":
        kw = {"corruption": s.corruption} if s.corruption else {}
        return load_ood(s.ood, root, in_distribution=s.dataset, severity=severity, **kw).dataset
    if side == "val_shift" and s.val_side and splits is None:
        raise ValueError(f"{name}: the validation side needs splits=, got None")
    if side != "val_shift" or not s.val_side or splits is None:
        raise ValueError(
            f"{name}: expected a side in {', '.join(shift_severities(name))}, got {side!r}"
        )
    if s.dataset == "digits":
        return _noisy_val_floats(splits, DIGITS_NOISE_STD[severity - 1], severity)
    val = splits.val
    assert isinstance(val, NormalizedImages)  # cifar10's splits keep uint8 images
    noisy = gaussian_noise_uint8(val.images.numpy(), severity, VAL_NOISE_SEED)
    return NormalizedImages(torch.from_numpy(noisy), val.labels, splits.mean, splits.std)


def _noisy_val_floats(splits: Splits, std: float, severity: int) -> TensorDataset:
    """``clip(x + N(0, std²), 0, 1)`` of the validation images on [0, 1] pixels, drawn from
    ``numpy.random.default_rng([VAL_NOISE_SEED, severity])`` as `load_ood`'s digits_noise
    draws the test side's, then normalised back."""
    x, y = splits.val.tensors  # type: ignore[attr-defined]
    mean = np.asarray(splits.mean).reshape(1, -1, *([1] * (x.ndim - 2)))
    sd = np.asarray(splits.std).reshape(mean.shape)
    pixels = x.double().numpy() * sd + mean
    rng = np.random.default_rng([VAL_NOISE_SEED, severity])
    noisy = np.clip(pixels + rng.normal(scale=std, size=pixels.shape), 0, 1)
    return TensorDataset(torch.tensor((noisy - mean) / sd, dtype=torch.float32), y)
