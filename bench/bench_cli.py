"""CLI answer time (issue 13, target 4): `calibtune --help` and compare/report/export on a finished
study, each in a fresh interpreter as a user runs it.

    python bench/bench_cli.py [--study quickstart --storage runs/studies] [--rounds 5]
                              [--against OLD_CHECKOUT]

Per round the cases run one after another (alternating, so load drifts hit them alike).
Printed: the median wall and CPU time of each; its ratio to the floors (a bare
``python -c pass``; for the commands that read MLflow, ``import mlflow.tracking`` and an MLflow
client opening the study's store — MLflow's own import and SQL store set-up, which the reading
commands cannot avoid — also with the cyclic garbage collector paused, as the reading commands
run); with ``--against``, its ratio to the same command run from another checkout (e.g.
``git archive REV calibtune | tar -x -C /tmp/old``). Last, the import-time top list of each
command (``python -X importtime``: self time summed per top-level package). Without a finished
study only ``--help`` is timed (run ``make quickstart`` first).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE_FLOOR = "MLflow client on the store"
STORE_CODE = (
    "from mlflow.tracking import MlflowClient; "
    "MlflowClient(tracking_uri={uri!r}).search_experiments(max_results=1)"
)
#: the same with the collector paused, as compare/report/export run (`calibtune._lazy.gc_paused`)
PAUSED_FLOOR = f"{STORE_FLOOR}, GC paused"
FLOORS = {
    "python -c pass": ["-c", "pass"],
    "import mlflow.tracking": ["-c", "import mlflow.tracking"],
}


def _commands(study: str | None, storage: str, out: str) -> dict[str, list[str]]:
    cmds = {"--help": ["--help"]}
    if study:
        where = ["--storage", storage]
        cmds["compare"] = ["compare", study, *where]
        cmds["report"] = ["report", study, *where]
        cmds["export"] = ["export", study, *where, "--out", out]
    return cmds


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run(args: list[str], src: Path, cwd: Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of ``python ARGS`` with calibtune imported from
    ``src``. On a loaded machine the CPU time is the better guess of an idle machine's wall time
    (the process waits for a core, not for I/O)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    t, c = time.perf_counter(), _cpu()
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True)
    elapsed, cpu = time.perf_counter() - t, _cpu() - c
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {done.stderr.decode()[-500:]}")
    return elapsed, cpu


def import_top(argv: list[str], src: Path, cwd: Path, n: int = 8) -> list[tuple[str, float]]:
    """The ``n`` top-level packages with the most import self time (ms) when running ``argv``."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = f"from calibtune.cli import main; main({argv!r})"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], cwd=cwd, env=env, capture_output=True
    )
    per: dict[str, float] = defaultdict(float)
    for line in done.stderr.decode().splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cum, name = line[len("import time:") :].split("|")
        per[name.strip().split(".")[0]] += int(self_us) / 1000
    return sorted(per.items(), key=lambda kv: -kv[1])[:n]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", default="quickstart", help="a finished study (default: %(default)s)")
    p.add_argument("--storage", default=str(ROOT / "runs" / "studies"), help="its storage")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--against", type=Path, help="another checkout to time the same commands from")
    args = p.parse_args()
    study = args.study if (Path(args.storage) / args.study).is_dir() else None
    if study is None:
        print(f"no study {args.study!r} under {args.storage}: timing --help only")
    print(f"load average before: {os.getloadavg()} ({time.strftime('%Y-%m-%d %H:%M:%S %Z')})")
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        cmds = _commands(study, args.storage, str(cwd / "exported"))
        floors = dict(FLOORS)
        if study:  # MLflow's client opening the study's store: the reading commands' own floor
            uri = json.loads((Path(args.storage) / study / "calibtune_study.json").read_text())
            floors[STORE_FLOOR] = ["-c", STORE_CODE.format(uri=uri["tracking_uri"])]
            paused = "import gc; gc.disable(); " + STORE_CODE.format(uri=uri["tracking_uri"])
            floors[PAUSED_FLOOR] = ["-c", paused]
        cases = {f"floor: {k}": (v, ROOT) for k, v in floors.items()}
        for name, argv in cmds.items():
            cases[name] = (["-m", "calibtune", *argv], ROOT)
            if args.against:
                cases[f"{name} (against)"] = (["-m", "calibtune", *argv], args.against.resolve())
        times: dict[str, list[float]] = defaultdict(list)
        cpus: dict[str, list[float]] = defaultdict(list)
        for _ in range(args.rounds):
            for name, (argv, src) in cases.items():
                wall, cpu = _run(argv, src, cwd)
                times[name].append(wall)
                cpus[name].append(cpu)
        med = {k: statistics.median(v) for k, v in times.items()}
        cpu = {k: statistics.median(v) for k, v in cpus.items()}
        print(f"load average after: {os.getloadavg()}; {args.rounds} rounds, median wall time")
        bare, mlflow = med["floor: python -c pass"], med["floor: import mlflow.tracking"]
        for name in cmds:
            line = (
                f"{name:<10} {med[name]:6.2f} s (CPU {cpu[name]:5.2f} s)   "
                f"{med[name] / bare:5.1f}× python -c pass"
            )
            if name != "--help":
                line += f"   {med[name] / mlflow:4.2f}× import mlflow.tracking"
                line += f"   CPU {cpu[name] / cpu[f'floor: {STORE_FLOOR}']:4.2f}× MLflow client"
                line += f" ({cpu[name] / cpu[f'floor: {PAUSED_FLOOR}']:4.2f}× GC paused)"
            if args.against:
                line += f"   {med[f'{name} (against)'] / med[name]:5.1f}× faster than --against"
            print(line)
        for name in floors:
            k = f"floor: {name}"
            print(f"floor {name}: {med[k]:.2f} s (CPU {cpu[k]:.2f} s)")
        for name, argv in cmds.items():
            top = import_top(argv, ROOT, cwd)
            print(f"import time, {name}: " + ", ".join(f"{k} {ms:.0f} ms" for k, ms in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
