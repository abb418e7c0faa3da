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
(calibtune/_raysettings.py) for comparison. ``--polls 0.05,0.02`` alternates the controller's
poll interval (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, read by each new Train controller) within
the run, and reports the CPU the Train controller process used per second of its life (from
``/proc``: what the polling costs). Prints a markdown table for bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
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


class ControllerCpu:
    """Samples /proc every 0.2 s for Ray Train controller processes (``ray::TrainController``
    in the command line) and keeps each one's last (CPU seconds, seconds alive)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[float, float]] = {}
        self._stop = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for d in Path("/proc").iterdir():
                if d.name.isdigit():
                    self._sample(d)

    def _sample(self, d: Path) -> None:
        try:
            if b"TrainController" not in (d / "cmdline").read_bytes():
                return
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return
        cpu = (int(fields[11]) + int(fields[12])) / self._tick  # utime + stime
        alive = time.monotonic() - self._boot_offset(int(fields[19]))
        self.seen[int(d.name)] = (cpu, alive)

    def _boot_offset(self, start_ticks: int) -> float:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.monotonic() - uptime + start_ticks / self._tick

    def take(self) -> float:
        """CPU fraction (CPU seconds / seconds alive) of the controllers seen since the last
        call; forget them."""
        cpu = sum(c for c, _ in self.seen.values())
        alive = sum(a for _, a in self.seen.values())
        self.seen.clear()
        return cpu / alive if alive else float("nan")


def _one(
    storage: str, name: str, workers: int, epochs: int, poll: str | None = None
) -> dict[str, float]:
    from calibtune.trial import run

    if poll is not None:
        os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = poll
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


def _by_poll(storage: str, epochs: list[int], polls: list[str]) -> None:
    """Worker mode at each poll interval, alternated per epoch count, local mode beside."""
    cpu = ControllerCpu()
    rows = []
    for n in epochs:
        local = _one(storage, f"pl{n}", 0, n)
        for poll in polls:
            worker = _one(storage, f"pw{n}_{poll}", 1, n, poll)
            rows.append((n, poll, local, worker, cpu.take()))
    print(
        "| epochs | poll | local wall | worker wall | per-epoch gap, worker − local "
        "| controller CPU |"
    )
    print("|---|---|---|---|---|---|")
    for n, poll, local, worker, frac in rows:
        d = worker["gap_ms"] - local["gap_ms"]
        print(
            f"| {n} | {poll} s | {local['wall']:.1f} s | {worker['wall']:.1f} s | **{d:.1f} ms** "
            f"| {100 * frac:.1f} % of a core |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repetition, epochs 1 and 20")
    ap.add_argument("--epochs", default="1,100,300")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the 1-epoch pair")
    ap.add_argument("--ray-defaults", action="store_true", help="Ray's Train settings")
    ap.add_argument("--polls", help="alternate these controller poll intervals, e.g. 0.05,0.02")
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
    if args.polls:
        _by_poll(storage, epochs, args.polls.split(","))
        ray.shutdown()
        print(f"ray.init: {ray_init:.1f} s; load average after: {os.getloadavg()[0]:.1f}")
        return
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
