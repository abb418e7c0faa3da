"""Does data loading starve training? Loader time as a fraction of step time, measured in one run.

Two cases through the loader + a small model (forward, backward, SGD step):

* ``digits`` (embedded default): in-memory tensors, index slicing + `BatchAugment` on the batch
  (what the training loop does for embedded sets); models ``small_cnn`` and ``mlp``; 20
  epochs by default, since one lasts only ~10–40 ms; plus the alternative of augmenting the
  whole training tensor once per epoch.
* ``cifar10``-sized synthetic set: 50,000 + 10,000 random images written as the official
  python pickle batches, read by ``load_splits("cifar10")`` (45,000 train), iterated with a
  ``DataLoader`` (crop + flip inside the dataset, vectorised per batch); one epoch with
  ``small_cnn``, for 0 and 1 loader workers.

"loader" is the wall time spent obtaining the next batch (including augmentation), "step" the
whole iteration (loader + forward + backward + update); target: loader/step < 10% on 2 cores.

    .venv/bin/python bench/bench_data.py                  # full CIFAR-sized epoch
    .venv/bin/python bench/bench_data.py --cifar-batches 60 --workers 0 1
"""

from __future__ import annotations

import argparse
import pickle
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from calibtune.data import load_splits
from calibtune.models import build_model


def write_synthetic_cifar10(root: Path) -> None:
    """CIFAR-10-sized random data in the official on-disk format (5×10,000 + 10,000)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            "data": rng.integers(0, 256, (10000, 3072), dtype=np.uint8),
            "labels": rng.integers(0, 10, 10000).tolist(),
        }
        with (folder / name).open("wb") as f:
            pickle.dump(batch, f, protocol=4)
    with (folder / "batches.meta").open("wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)


def timed_epoch(
    batches: Iterable[tuple[Tensor, Tensor]], model: nn.Module, max_batches: int | None
) -> tuple[float, float, int, int]:
    """Run the loop; return (loader seconds, total seconds, batches, samples)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    loader_s = 0.0
    n_batches = n_samples = 0
    it: Iterator[tuple[Tensor, Tensor]] = iter(batches)
    start = time.perf_counter()
    while max_batches is None or n_batches < max_batches:
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        loader_s += time.perf_counter() - t0
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        n_batches += 1
        n_samples += y.shape[0]
    return loader_s, time.perf_counter() - start, n_batches, n_samples


def tensor_batches(
    x: Tensor,
    y: Tensor,
    batch_size: int,
    augment: Callable[[Tensor], Tensor] | None,
    epochs: int,
) -> Iterator[tuple[Tensor, Tensor]]:
    """What the training loop does for embedded sets: slice, then augment the batch."""
    for _ in range(epochs):
        for idx in torch.randperm(y.shape[0]).split(batch_size):
            xb = x[idx]
            yield (augment(xb) if augment is not None else xb), y[idx]


def epoch_augmented_batches(
    x: Tensor,
    y: Tensor,
    batch_size: int,
    augment: Callable[[Tensor], Tensor] | None,
    epochs: int,
) -> Iterator[tuple[Tensor, Tensor]]:
    """Alternative for tiny steps: one augment call over the whole training tensor per epoch
    (it runs inside a next(), so it is counted as loader time)."""
    for _ in range(epochs):
        xa = augment(x) if augment is not None else x
        for idx in torch.randperm(y.shape[0]).split(batch_size):
            yield xa[idx], y[idx]


def report(label: str, loader_s: float, total_s: float, n_batches: int, n_samples: int) -> None:
    print(
        f"{label:<56} {n_samples:>6} samples {n_batches:>4} batches  "
        f"step {1000 * total_s / n_batches:7.2f} ms  loader {1000 * loader_s / n_batches:6.2f} ms  "
        f"loader/step {100 * loader_s / total_s:5.1f}%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument(
        "--cifar-batches", type=int, default=None, help="stop the CIFAR epoch early"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--no-cifar", action="store_true", help="only the embedded case")
    parser.add_argument(
        "--digits-epochs",
        type=int,
        default=20,
        help="digits epochs last ~10 ms each: time several so noise averages out",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, batch {args.batch_size}")

    t0 = time.perf_counter()
    digits = load_splits("digits")
    print(f"load_splits('digits'): {1000 * (time.perf_counter() - t0):.1f} ms")
    x, y = digits.train.tensors
    n = args.digits_epochs
    for name in ("small_cnn", "mlp"):
        model = build_model(name, digits.num_classes, digits.input_shape)
        timed_epoch(tensor_batches(x, y, args.batch_size, digits.augment, 1), model, 2)  # warm-up
        stats = timed_epoch(tensor_batches(x, y, args.batch_size, digits.augment, n), model, None)
        report(f"digits / {name} (per-batch augment), {n} epochs", *stats)
    model = build_model("mlp", digits.num_classes, digits.input_shape)
    batches = epoch_augmented_batches(x, y, args.batch_size, digits.augment, n)
    report(f"digits / mlp (per-epoch augment), {n} epochs", *timed_epoch(batches, model, None))

    if args.no_cifar:
        return
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_cifar10(Path(tmp))
        t0 = time.perf_counter()
        cifar = load_splits("cifar10", root=tmp)
        print(
            f"load_splits('cifar10') on synthetic CIFAR-10-sized files: "
            f"{time.perf_counter() - t0:.2f} s ({len(cifar.train)} train)"
        )
    for workers in args.workers:
        model = build_model("small_cnn", cifar.num_classes, cifar.input_shape)
        loader = DataLoader(
            cifar.train,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=workers,
            persistent_workers=False,
        )
        stats = timed_epoch(loader, model, args.cifar_batches)
        report(f"cifar10-sized / small_cnn ({workers} loader workers)", *stats)


if __name__ == "__main__":
    main()
