"""Wall time of the whole test suite: `make test`'s pytest commands before and after issue 11's
split over two xdist workers, in one run, with the load average sampled while each case runs.

    .ci/run .venv/bin/python bench/bench_suite.py --before REV [--cases after,before,again]

Run it through `.ci/run` (PostgreSQL and chromium for the tracking-server and browser tests).
``before`` is `make test`'s old command (serial) on a clean export of ``REV``; ``after`` is this
tree's Makefile commands (two workers, then the `serial` tests alone); ``again`` repeats
``after`` on the slow files issue 11 restructured (a second run to catch flakiness). The
commands mirror the Makefile's `test` target, which cannot be called here: it would re-install
the shared virtual environment from this tree.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=25"]
XDIST = ["-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder"]
AFTER = [
    [*PYTEST, "--timeout=900", *XDIST, "-m", "not serial"],
    [*PYTEST, "--timeout=900", "-m", "serial"],
]
BEFORE = [[*PYTEST, "--timeout=900"]]
CHANGED = [  # the fault tests' waits changed; the cluster and terminal tests share the box now
    "tests/test_faults.py",
    "tests/test_cluster.py",
    "tests/test_cluster_ddp.py",
    "tests/test_terminal.py",
]
AGAIN = [[*PYTEST, "--timeout=900", *XDIST, "-m", "not serial", *CHANGED]]


def _export(rev: str) -> Path:
    """A clean copy of ``rev``'s tree (its own tests and code, on PYTHONPATH)."""
    out = Path(tempfile.mkdtemp(prefix="suite_before_"))
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def _loads(stop: threading.Event, samples: list[float]) -> None:
    while not stop.wait(15):
        samples.append(os.getloadavg()[0])


def _case(name: str, tree: Path, commands: list[list[str]], log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg", "CI": "1"}
    samples: list[float] = [os.getloadavg()[0]]
    stop = threading.Event()
    sampler = threading.Thread(target=_loads, args=(stop, samples), daemon=True)
    sampler.start()
    t0, codes = time.perf_counter(), []
    with log.open("w") as out:
        for cmd in commands:
            codes.append(subprocess.run(cmd, cwd=tree, env=env, stdout=out, stderr=out).returncode)
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    mean = sum(samples) / len(samples)
    print(
        f"{name:7s} wall {wall:7.1f} s ({wall / 60:5.1f} min)  exit {codes}  "
        f"load avg (1 min) mean {mean:.2f} max {max(samples):.2f}  log {log}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="HEAD~1", help="git revision of the old suite")
    ap.add_argument("--cases", default="after,before,again")
    ap.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "bench_suite")
    args = ap.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} CPUs; uptime: {os.popen('uptime').read().strip()}", flush=True)
    cases = {
        "after": lambda: (ROOT, AFTER),
        "before": lambda: (_export(args.before), BEFORE),
        "again": lambda: (ROOT, AGAIN),
    }
    for name in args.cases.split(","):
        tree, commands = cases[name]()
        _case(name, tree, commands, args.logs / f"{name}.log")


if __name__ == "__main__":
    main()
