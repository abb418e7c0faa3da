"""Datasets that ship inside installed packages: no files, no network.

* ``digits``: scikit-learn's copy of the UCI optical handwritten digits, 1,797 greyscale 8×8
  images with 17 grey levels (0–16), 10 classes. The default dataset of quickstart and tests.
* ``mnist1d``: MNIST-1D (Greydanus & Kobak, "Scaling down deep learning with MNIST-1D",
  ICML 2024), 10 classes of 1-D signals of length 40, generated procedurally by the ``mnist1d``
  package with its default arguments (5,000 samples, 4,000 train / 1,000 test, seed 42).
  Harder than digits (measured here on 3,600 training signals: ``mlp`` 39–43% test error,
  ``cnn1d`` 11–14%), so the losses' calibration differences show on a CPU within minutes.
* ``mnist1d_large``: the same generator at 6× the size (30,000 samples, seed 42; the last
  10,000 are the test set, the first 20,000 the train/validation pool), for comparisons whose
  validation (5,000 with ``val_fraction: 0.25``) and test sets are large enough that a fitted
  temperature and an ECE difference are not noise (issue 31 item 6).
"""

from __future__ import annotations

import functools
import importlib.util
import random
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ._common import BatchAugment, Splits, stratified_holdout, validation_count

# Lazy: scikit-learn and mnist1d (each ~1/3 of torch's own import time on the dev box) are
# imported by the loader that needs them, so that `calibtune train` on other data skips them.

__all__ = [
    "DIGITS_TEST_FRACTION",
    "MNIST1D_LARGE",
    "digits_arrays",
    "digits_stats",
    "load_digits_splits",
    "load_mnist1d_large_splits",
    "load_mnist1d_splits",
    "mnist1d_arrays",
]

DIGITS_TEST_FRACTION = 0.2
#: ``mnist1d_large``: (samples asked of the generator, of which the last ones are the test set)
MNIST1D_LARGE = (30_000, 10_000)
# the test split is the same for every seed so that test numbers are comparable across trials
_DIGITS_TEST_SEED = 0


def sklearn_files(folder: str, pattern: str) -> list[Path]:
    """scikit-learn's bundled data files ``sklearn/datasets/<folder>/<pattern>``, sorted, found
    without importing scikit-learn (≈ 0.6–1.5 s cold, in the driver and in every trial process);
    ``[]`` where the installed copy does not lay them out so (callers then use its loader)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted((Path(spec.submodule_search_locations[0]) / "datasets" / folder).glob(pattern))


def _digits_table() -> np.ndarray:
    """The (1797, 65) table behind ``sklearn.datasets.load_digits`` (64 pixels 0–16, target)."""
    if csv := sklearn_files("data", "digits.csv.gz"):
        return np.loadtxt(csv[0], delimiter=",")
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.column_stack([bunch.data, bunch.target])


@functools.cache
def _digits_numpy() -> tuple[np.ndarray, np.ndarray]:
    table = _digits_table()
    x = (table[:, :64] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)  # on [0, 1]
    y = table[:, 64].astype(np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def digits_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(pool_x, pool_y, test_x, test_y)``: digits images on [0, 1] pixels, shape
    ``(N, 1, 8, 8)``, split into the fixed stratified 20% test set and the train+val pool."""
    x, y = _digits_numpy()
    n_test = round(DIGITS_TEST_FRACTION * y.shape[0])
    pool, test = stratified_holdout(y, n_test, _DIGITS_TEST_SEED)
    return x[pool], y[pool], x[test], y[test]


@functools.cache
def digits_stats() -> tuple[tuple[float], tuple[float]]:
    """Mean and std of the train+val pool's pixels on [0, 1] (one channel)."""
    pool_x = digits_arrays()[0]
    return (float(pool_x.mean()),), (float(pool_x.std()),)


def _tensor_split(x: np.ndarray, y: np.ndarray, mean: float, std: float) -> TensorDataset:
    return TensorDataset(torch.tensor((x - mean) / std, dtype=torch.float32), torch.tensor(y))


def load_digits_splits(seed: int, val_fraction: float) -> Splits:
    """Fixed 20% test split (359 images, stratified); the remaining 1,438 are split seeded
    and stratified into train/val with ``val_fraction`` (0.1 → 1,294/144/359, ≈72/8/20%).

    Batch augmentation: random translation by up to one pixel (no flip: digits are not
    mirror-symmetric)."""
    pool_x, pool_y, test_x, test_y = digits_arrays()
    n_val = validation_count(val_fraction, pool_y.shape[0], "digits")
    keep, hold = stratified_holdout(pool_y, n_val, seed)
    (mean,), (std,) = digits_stats()
    return Splits(
        name="digits",
        train=_tensor_split(pool_x[keep], pool_y[keep], mean, std),
        val=_tensor_split(pool_x[hold], pool_y[hold], mean, std),
        test=_tensor_split(test_x, test_y, mean, std),
        num_classes=10,
        input_shape=(1, 8, 8),
        mean=(mean,),
        std=(std,),
        augment=BatchAugment(padding=1, flip=False, fill=(-mean / std,)),
    )


@functools.cache
def _mnist1d_numpy(
    num_samples: int = 5_000, test_samples: int = 1_000
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    args.train_split = (num_samples - test_samples) / num_samples
    # the generator seeds and draws from the global `random`/`numpy.random` state: restore it
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)[:, None]
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    cut = num_samples - test_samples  # the generator's split rounds; ours is exact
    out = (x[:cut], y[:cut], x[cut:], y[cut:])
    for a in out:
        a.setflags(write=False)
    return out


def mnist1d_arrays(
    num_samples: int = 5_000, test_samples: int = 1_000
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(train_x, train_y, test_x, test_y)`` of MNIST-1D generated with ``num_samples``
    samples, the last ``test_samples`` of them the test set (the defaults are the package's
    default data set and its 80/20 split), signals of shape ``(N, 1, 40)`` standardised by the
    generator (mean 0, std 1 over all of them). Generated once per process and size (≈2–3 s for
    5,000, ≈6 s for 30,000) and cached."""
    return _mnist1d_numpy(num_samples, test_samples)


def _mnist1d_splits(name: str, sizes: tuple[int, int], seed: int, val_fraction: float) -> Splits:
    train_x, train_y, test_x, test_y = mnist1d_arrays(*sizes)
    n_val = validation_count(val_fraction, train_y.shape[0], name)
    keep, hold = stratified_holdout(train_y, n_val, seed)
    return Splits(
        name=name,
        train=_tensor_split(train_x[keep], train_y[keep], 0.0, 1.0),
        val=_tensor_split(train_x[hold], train_y[hold], 0.0, 1.0),
        test=_tensor_split(test_x, test_y, 0.0, 1.0),
        num_classes=10,
        input_shape=(1, 40),
        mean=(0.0,),
        std=(1.0,),
        augment=None,
    )


def load_mnist1d_splits(seed: int, val_fraction: float) -> Splits:
    """The package's 4,000/1,000 train/test split; the 4,000 are split seeded and stratified
    into train/val (0.1 → 3,600/400/1,000). No augmentation (as in the benchmark)."""
    return _mnist1d_splits("mnist1d", (5_000, 1_000), seed, val_fraction)


def load_mnist1d_large_splits(seed: int, val_fraction: float) -> Splits:
    """MNIST-1D at `MNIST1D_LARGE`: a 20,000 pool and 10,000 test signals; the pool split
    seeded and stratified into train/val (0.25 → 15,000/5,000/10,000; the default 0.1 →
    18,000/2,000). The test split is the same for every seed."""
    return _mnist1d_splits("mnist1d_large", MNIST1D_LARGE, seed, val_fraction)
