"""Driver cost per trial against the trials already run (issue 29 item 5): flat, or growing?

Runs an N-trial study of short trials (1 epoch of the embedded digits set, mlp, TS only, no
figures, random sampler over focal's gamma, 2 at a time, local Ray) through
`calibtune.study.run_study` in this process (the driver), sampling every 0.5 s the driver's
CPU time (``time.process_time``: this process only; the trials run in Ray's worker processes)
and its resident memory. Reports, per tenth of the trials (by the order they finished, from
their MLflow runs' end times): the wall time per trial and the driver's CPU per trial; then the
driver's RSS, the MLflow and Optuna store sizes, the study folder (Tune's state, the start
records), and the wall time of ``compare``, ``report`` and ``export`` on the finished study.
Prints markdown for bench/README.md; exit 1 if a trial is missing in MLflow.

``PYTHONPATH=/path/to/other/checkout python bench/bench_scale.py --trials 100`` measures another
version of calibtune (the "before" of bench/README.md) with this same script.
"""

from __future__ import annotations

import argparse
import bisect
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


def _study(root: Path, trials: int) -> Path:
    raw = {
        "name": f"scale{trials}",
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 128},
            "eval": {"posthoc": ["ts"], "figures": False},
        },
        "losses": [
            {"name": "focal", "params": {"gamma": {"type": "float", "low": 0.5, "high": 5}}}
        ],
        "search": {
            "sampler": "random",
            "num_samples": trials,
            "max_concurrent": 2,
            "objectives": ["val/ece"],
        },
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}", "experiment": f"scale{trials}"},
        "storage": str(root / "studies"),
    }
    path = root / "scale.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class Sampler(threading.Thread):
    """(wall clock s, driver CPU s, RSS MiB) every 0.5 s. The driver's CPU leaves out this
    thread's own (``time.thread_time``)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float, float]] = []
        self.stop = threading.Event()
        self.own_cpu = 0.0  # this thread's CPU seconds, left out of the driver's

    def run(self) -> None:
        while not self.stop.wait(0.5):
            own0 = time.thread_time()
            rss = rss_mib()
            self.own_cpu += time.thread_time() - own0
            self.samples.append((time.time(), time.process_time() - self.own_cpu, rss))


def _du(path: Path) -> float:
    if not path.exists():
        return 0.0
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1024**2


def _cpu_at(samples: list[tuple[float, float, float]], t: float) -> float:
    """The driver's CPU seconds at wall-clock time ``t``, interpolated between samples."""
    times = [s[0] for s in samples]
    i = min(max(bisect.bisect_left(times, t), 1), len(times) - 1)
    (t0, c0, _), (t1, c1, _) = samples[i - 1], samples[i]
    return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1


def _tenths(
    samples: list[tuple[float, float, float]], ends: list[float]
) -> list[tuple[float, float]]:
    """(wall s per trial, driver CPU s per trial) over each tenth of the trials, between the
    ends of its first and its last trial (their MLflow runs' end times: exact, where a count of
    the trial folders in the storage moves only at Tune's uploads); the first trial's end is the
    start (Ray's and the study's start-up left out)."""
    n, out = len(ends), []
    for k in range(10):
        lo, hi = max(1, k * n // 10), (k + 1) * n // 10
        if hi <= lo or len(samples) < 2:
            out.append((float("nan"), float("nan")))
            continue
        ta, tb = ends[lo - 1], ends[hi - 1]
        cpu = _cpu_at(samples, tb) - _cpu_at(samples, ta)
        out.append(((tb - ta) / (hi - lo), cpu / (hi - lo)))
    return out


def _timed(args: list[str]) -> str:
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "calibtune", *args], capture_output=True)
    took = time.time() - t0
    return f"{took:.1f} s" + ("" if res.returncode == 0 else f" (exit {res.returncode})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--root", type=Path, help="working folder (default: a temp dir)")
    parser.add_argument("--label", default="", help="a name for the row (e.g. before, after)")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="calibtune-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    os.chdir(root)
    from mlflow.tracking import MlflowClient

    from calibtune.study import load_study, run_study

    study = load_study(_study(root, args.trials))
    sdir = root / "studies" / study.name
    sampler = Sampler()
    rss0, cpu0, t0 = rss_mib(), time.process_time(), time.time()
    sampler.start()
    outcome = run_study(study, verbose=0)
    wall = time.time() - t0
    sampler.stop.set()
    sampler.join()
    cpu = time.process_time() - cpu0 - sampler.own_cpu
    runs = MlflowClient(outcome.tracking_uri).search_runs(
        [outcome.experiment_id], "tags.`calibtune.kind` = 'trial'", max_results=50000
    )
    finished = [r for r in runs if r.data.tags.get("calibtune.status") == "finished"]
    ends = sorted(r.info.end_time / 1000 for r in finished if r.info.end_time)
    tenths = _tenths(sampler.samples, ends)
    times = {cmd: _timed([cmd, str(sdir)]) for cmd in ("compare", "report")}
    times["export"] = _timed(["export", str(sdir), "--top", "1", "--out", str(root / "best")])
    head = f"{args.label or 'run'}: {args.trials} trials, {wall:.0f} s wall"
    print(f"### {head}, driver CPU {cpu:.0f} s")
    print()
    print("| tenth of the trials | " + " | ".join(str(k + 1) for k in range(10)) + " |")
    print("|---|" + "---|" * 10)
    print("| wall s / trial | " + " | ".join(f"{w:.3f}" for w, _ in tenths) + " |")
    print("| driver CPU s / trial | " + " | ".join(f"{c:.3f}" for _, c in tenths) + " |")
    print("| driver CPU / wall (cores) | " + " | ".join(f"{c / w:.2f}" for w, c in tenths) + " |")
    print()
    rss = max((s[2] for s in sampler.samples), default=rss0)
    print(
        f"driver RSS {rss0:.0f} → max {rss:.0f} MiB; MLflow store {_du(root / 'mlflow.db'):.1f} MiB"
        f" + {_du(root / 'mlruns'):.1f} MiB artifacts; Optuna {_du(sdir / 'optuna.db'):.2f} MiB;"
        f" study folder {_du(sdir):.1f} MiB (start records {_du(sdir / 'trial_starts'):.2f} MiB);"
        f" child runs {len(runs)} ({len(finished)} finished); "
        + ", ".join(f"`{k}` {v}" for k, v in times.items())
    )
    return 0 if len(finished) == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
