"""Load study (`make load`): many short trials through one driver, nothing lost, no growth.

Runs an N-trial study (default 200), 1 epoch each on the embedded digits set (mlp, no OOD sets,
TS only, no figures), 2 trials at a time, through `calibtune.study.run_study` in this process (the
driver), and records: trials per hour, the driver's resident memory (RSS) at start, after each
quarter of the trials and at the end, the MLflow store's size on disk, and the child runs MLflow
holds (all finished, each once). ``--trials 6`` is the small version CI runs
(tests/test_load_smoke.py). Prints a markdown table for bench/README.md; exit 1 if a trial is
missing or not finished in MLflow.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml


def rss_mib() -> float:
    """This process's resident set size (Linux ``/proc/self/status``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


def _study(root: Path, trials: int) -> Path:
    raw = {
        "name": f"load{trials}",
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 64},
            "eval": {"posthoc": ["ts"], "figures": False},
        },
        "losses": [
            "cross_entropy",
            {"name": "focal", "params": {"gamma": {"type": "float", "low": 0.5, "high": 5}}},
        ],
        "search": {
            "sampler": "random",
            "num_samples": trials,
            "max_concurrent": 2,
            "objectives": ["val/ece"],
        },
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}", "experiment": f"load{trials}"},
        "storage": str(root / "studies"),
    }
    path = root / "load.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class RssSampler(threading.Thread):
    """The driver's RSS every second (MiB), stamped with the number of finished trials."""

    def __init__(self, done: Path, trials: int) -> None:
        super().__init__(daemon=True)
        self.done, self.trials = done, trials
        self.samples: list[tuple[int, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            finished = len(list(self.done.glob("trials/*/result.json")))
            self.samples.append((finished, rss_mib()))


def _du(path: Path) -> float:
    """Size on disk of a file, or of every file under a folder, MiB."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1024**2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--root", type=Path, help="working folder (default: a temp dir)")
    args = parser.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="calibtune-load-"))
    root.mkdir(parents=True, exist_ok=True)
    os.chdir(root)
    from mlflow.tracking import MlflowClient

    from calibtune.study import load_study, run_study

    study = load_study(_study(root, args.trials))
    sampler = RssSampler(root / "studies" / study.name, args.trials)
    rss_start = rss_mib()
    t0 = time.time()
    sampler.start()
    outcome = run_study(study, verbose=0)
    wall = time.time() - t0
    sampler.stop.set()
    client = MlflowClient(outcome.tracking_uri)
    runs = client.search_runs(
        [outcome.experiment_id], "tags.`calibtune.kind` = 'trial'", max_results=10000
    )
    finished = [r for r in runs if r.data.tags.get("calibtune.status") == "finished"]
    ids = {r.data.tags.get("calibtune.trial_id") for r in runs}
    quarters = [
        max(
            (rss for done, rss in sampler.samples if done <= q * args.trials // 4),
            default=float("nan"),
        )
        for q in (1, 2, 3, 4)
    ]
    print(
        "| trials | wall | trials/hour | driver RSS start | ≤25% | ≤50% | ≤75% | ≤100% |"
        " MLflow store | child runs (finished, distinct) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {args.trials} | {wall:.0f} s | {3600 * args.trials / wall:.0f} | {rss_start:.0f} MiB"
        + "".join(f" | {q:.0f} MiB" for q in quarters)
        + f" | {_du(root / 'mlflow.db') if (root / 'mlflow.db').exists() else 0:.1f} MiB"
        + f" + {_du(root / 'mlruns'):.1f} MiB artifacts"
        + f" | {len(runs)} ({len(finished)}, {len(ids)}) |"
    )
    ok = len(runs) == len(finished) == len(ids) == args.trials
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
