"""Ray Train worker mode vs local mode: fixed cost per trial and per-epoch reporting overhead.

`python bench/bench_raytrain.py [--quick] [--epochs 1,100,300] [--ray-defaults]`

Runs the same digits / `mlp` cross-entropy trial (no OOD sets, no post-hoc, no figures: the
evaluation content does not differ between the modes) through `calibtune.trial.run` in this
process, Ray started once (its start-up is reported on its own), alternating local mode
(``num_workers: 0``) and Ray Train with one worker, and reports:

- **fixed cost** of worker mode: wall(1 worker) − wall(local) for a 1-epoch trial (worker-group
  start-up — the Train controller, its helper actors and the worker process with its imports —
  plus the tail), median over the repetitions;
- **per-epoch overhead**: a rank-0 `TrialCallback` records the wall clock at every epoch end; the
  gap between consecutive epoch ends minus the next epoch's own ``epoch_time`` is what each epoch
  costs outside training (checkpoint when due, callbacks, ``ray.train.report``); reported as the
  median over epochs, worker mode minus local mode, at each epoch count.

``--ray-defaults`` runs with Ray's own Train settings instead of calibtune's
(calibtune/_raysettings.py) for comparison. Prints a markdown table for bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class EpochClock:
    """Rank-0 trial callback: appends ``time.time()`` at each epoch end to a file (the callback
    runs in the worker process, so the file is how the times come back)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_start(self, history: Any) -> None:
        pass

    def on_epoch(self, epoch: int, metrics: Any) -> None:
        with open(self.path, "a") as f:
            f.write(f"{time.time()}\n")

    def on_trial_end(self, metrics: Any, artifacts_dir: Any) -> None:
        pass


def _cfg(storage: str, name: str, workers: int, epochs: int) -> Any:
    from calibtune.trial import config_from_dict

    return config_from_dict(
        {
            "name": name,
            "storage_path": storage,
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "loss": {"name": "cross_entropy"},
            "train": {"epochs": epochs, "batch_size": 128, "checkpoint_every": max(epochs, 1)},
            "eval": {"posthoc": [], "test_every_epoch": False, "figures": False},
            "scaling": {"num_workers": workers},
        }
    )


def _one(storage: str, name: str, workers: int, epochs: int) -> dict[str, float]:
    from calibtune.trial import run

    clock = os.path.join(storage, f"{name}.clock")
    t0 = time.perf_counter()
    res = run(_cfg(storage, name, workers, epochs), callbacks=[EpochClock(clock)])
    wall = time.perf_counter() - t0
    ends = [float(x) for x in Path(clock).read_text().split()]
    gaps = [
        b - a - h["epoch_time"]
        for a, b, h in zip(ends[:-1], ends[1:], res.history[1:], strict=True)
    ]
    return {"wall": wall, "gap_ms": 1000 * statistics.median(gaps) if gaps else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repetition, epochs 1 and 20")
    ap.add_argument("--epochs", default="1,100,300")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the 1-epoch pair")
    ap.add_argument("--ray-defaults", action="store_true", help="Ray's Train settings")
    args = ap.parse_args()
    epochs = [1, 20] if args.quick else [int(e) for e in args.epochs.split(",")]
    reps = 1 if args.quick else args.reps
    import ray

    from calibtune._raysettings import TRAIN_ENV, apply_train_env

    if not args.ray_defaults:
        apply_train_env()
    t0 = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ray_init = time.perf_counter() - t0
    storage = tempfile.mkdtemp(prefix="bench-raytrain-")
    fixed = []
    for rep in range(reps):
        local = _one(storage, f"l1_{rep}", 0, 1)
        worker = _one(storage, f"w1_{rep}", 1, 1)
        fixed.append((worker["wall"], local["wall"]))
    rows = []
    for n in epochs:
        local, worker = _one(storage, f"l{n}", 0, n), _one(storage, f"w{n}", 1, n)
        rows.append((n, local, worker))
    ray.shutdown()
    settings = {k: os.environ.get(k, "(Ray default)") for k in TRAIN_ENV}
    print(f"settings: {settings}; load average after: {os.getloadavg()[0]:.1f}")
    print(f"ray.init: {ray_init:.1f} s")
    diffs = [w - local for w, local in fixed]
    print("| 1-epoch trial | local | 1 worker | worker − local |\n|---|---|---|---|")
    for i, (w, local) in enumerate(fixed):
        print(f"| rep {i + 1} | {local:.1f} s | {w:.1f} s | {w - local:.1f} s |")
    print(f"| median | | | **{statistics.median(diffs):.1f} s** |\n")
    print("| epochs | local wall | worker wall | per-epoch gap local | worker | worker − local |")
    print("|---|---|---|---|---|---|")
    for n, local, worker in rows:
        d = worker["gap_ms"] - local["gap_ms"]
        print(
            f"| {n} | {local['wall']:.1f} s | {worker['wall']:.1f} s | {local['gap_ms']:.1f} ms "
            f"| {worker['gap_ms']:.1f} ms | **{d:.1f} ms** |"
        )


if __name__ == "__main__":
    main()
