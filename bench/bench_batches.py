"""The CPU training epoch: this checkout against a baseline checkout, alternated in one run.

Issue 21 moved batching into one owner (`calibtune.training.DeviceBatches`: resident data,
augmentation and fused normalisation on the trial's device, no host read per step). On the CPU
that must not be slower. For digits (small_cnn, augmented), mnist1d (cnn1d) and CIFAR-format data
(10,000 training images written in the official format, small_cnn, augmented, loader workers 0),
each side trains ``--epochs`` epochs in a fresh process (`calibtune.training.train_epochs`, one
torch thread, the epoch's ``train_time``), the sides alternating ``--rounds`` times so that load
hits both alike; printed: the median epoch time of each side and baseline / this.

Usage: python bench/bench_batches.py --baseline CHECKOUT [--rounds 3] [--epochs 3]
(a baseline checkout: ``git worktree add /tmp/base <commit>``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EPOCHS = """
import json, sys, torch
from calibtune.data import load_splits
from calibtune.losses import build_loss
from calibtune.models import build_model
from calibtune.training import LoopSpec, train_epochs

torch.set_num_threads(1)
name, model, root, epochs, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), 128
torch.manual_seed(1)
s = load_splits(name, root=root or None, seed=1, val_fraction=0.1)
net = build_model(model, s.num_classes, s.input_shape)
spec = LoopSpec(model=net, loss_fn=build_loss("focal", gamma=3.0),
                optimizer=torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                lr_at=lambda e: 0.05, train_set=s.train, val_set=s.val, test_set=None,
                epochs=epochs, batch_size=batch, augment=s.augment)
times = []
train_epochs(spec, on_epoch_end=lambda e, m, c: times.append(m["train_time"]))
print(json.dumps(times))
"""

CASES = [("digits", "small_cnn"), ("mnist1d", "cnn1d"), ("cifar10", "small_cnn")]


def _epochs(checkout: Path, case: tuple[str, str], root: str, epochs: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.run(
        [sys.executable, "-c", EPOCHS, *case, root, str(epochs)],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=1800, check=True,
    )  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_check import write_cifar10

    with tempfile.TemporaryDirectory() as tmp:
        write_cifar10(Path(tmp), 10_000, 1_000)
        for case in CASES:
            root = tmp if case[0] == "cifar10" else ""
            sides: dict[str, list[float]] = {"baseline": [], "this": []}
            for _ in range(args.rounds):
                sides["baseline"] += _epochs(args.baseline, case, root, args.epochs)
                sides["this"] += _epochs(ROOT, case, root, args.epochs)
            base, this = (statistics.median(sides[k]) for k in ("baseline", "this"))
            print(
                f"{case[0]:8s} {case[1]:10s} epoch: baseline {base:.3f} s, this {this:.3f} s, "
                f"baseline / this = {base / this:.2f}x ({len(sides['this'])} epochs each)"
            )


if __name__ == "__main__":
    main()
