"""Driver CPU per trial in a study (issue 13): the figures a study's driver draws, this checkout
against another (``--baseline``), alternated round by round in one run.

Two long-lived worker processes, one per checkout (``PYTHONPATH``), each warmed up once, then
asked in turn, ``--rounds`` times, to draw
- **trial**: `calibtune.plots.save_trial_figures` on a copy of ``--artifacts`` (a trial's
  artifacts folder: reliability/gamma/ROC/shift/risk–coverage data), what the driver does per
  trial (`render_deferred_figures`);
- **study**: `calibtune.readers._summary._figures` (objective history, ECE vs every searched
  parameter, importances from an in-memory Optuna study) on ``--trials`` synthetic trials with
  quickstart's 10 searched parameters, what a refresh of the parent run draws.
Each answer is the worker's wall and CPU time (``time.process_time``) for the call and the time
its cyclic garbage collector ran meanwhile. With ``--heavy`` (the default) the workers first
import what the study's driver holds (torch, Ray Tune, MLflow, Optuna), so that a full
collection traverses a driver-sized heap.

Usage: python bench/bench_figures.py --artifacts DIR --baseline CHECKOUT [--rounds 10]
    [--trials 16] [--light] [--profile] [--refresh-store COPY]
(--profile: a cProfile of one `save_trial_figures` call in this checkout, top 25, and exit;
--refresh-store: a per-trial refresh of the parent run with and without the study figures
(`FigureThrottle`), alternated, on a copy of a finished quickstart run's folder — its
``mlflow.db`` with artifact paths inside the copy, and ``<storage>/quickstart/`` — and exit.)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _study_inputs(n: int) -> tuple[Any, Any, Any]:
    """(ref, frame, optuna study): ``n`` finished trials over quickstart's searched parameters."""
    import numpy as np
    import optuna
    import pandas as pd

    from calibtune.readers._results import StudyRef

    rng = np.random.default_rng(0)
    names = [f"{loss}.p{i}" for loss in ("focal", "dual_focal", "adafocal") for i in range(3)]
    names.append("loss")
    dists = {k: optuna.distributions.FloatDistribution(0.1, 5.0) for k in names[:-1]}
    dists["loss"] = optuna.distributions.CategoricalDistribution(["focal", "ce"])
    rows, ot = [], optuna.create_study(direction="minimize")
    for i in range(n):
        params = {k: float(rng.uniform(0.1, 5.0)) for k in names[:-1]}
        params["loss"] = ["focal", "ce"][i % 2]
        ece = float(rng.uniform(0.01, 0.1))
        ot.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=ece / 2))
        rows.append(
            {"status": "finished", "start_time": i, "val/ece": ece, "val/ece@ts": ece / 2}
            | {f"param:{k}": v for k, v in params.items()}
        )
    ref = StudyRef("bench", "sqlite://", "0", "p", (("val/ece@ts", "min"),), ())
    return ref, pd.DataFrame(rows), ot


def _gc_timer() -> list[float]:
    spent, start = [0.0], [0.0]

    def cb(phase: str, info: dict) -> None:
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - start[0]

    gc.callbacks.append(cb)
    return spent


def worker(artifacts: str, trials: int, heavy: bool) -> None:
    """Answer each line of stdin (``trial``/``study``) with one JSON line of timings."""
    import optuna

    if heavy:
        import mlflow.tracking  # noqa: F401
        import ray.tune  # noqa: F401
        import torch  # noqa: F401
    from calibtune.plots import save_trial_figures
    from calibtune.readers._summary import _figures

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-figures-") as t:
        _answer(Path(t), artifacts, trials, save_trial_figures, _figures)


def _answer(tmp: Path, artifacts: str, trials: int, save_trial_figures: Any, _figures: Any) -> None:
    """The worker's loop, in the temporary folder ``tmp``."""
    for f in Path(artifacts).glob("*.json"):
        shutil.copy(f, tmp)
    ref, df, ot = _study_inputs(trials)
    (tmp / "study").mkdir()
    calls = {
        "trial": lambda: save_trial_figures(tmp),
        "study": lambda: _figures(None, ref, df, ot, tmp / "study"),
    }
    for call in calls.values():  # warm: imports, fonts, caches
        call()
    gc_spent = _gc_timer()
    print(json.dumps({"objects": len(gc.get_objects())}), flush=True)
    for line in sys.stdin:
        gc_spent[0] = 0.0
        w0, c0 = time.perf_counter(), time.process_time()
        calls[line.strip()]()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        print(json.dumps({"wall": wall, "cpu": cpu, "gc": gc_spent[0]}), flush=True)


def _start(checkout: Path, args: argparse.Namespace) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--worker", "--artifacts", args.artifacts]
    cmd += ["--trials", str(args.trials)] + (["--light"] if args.light else [])
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONWARNINGS": "ignore"}
    p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    print(f"{checkout}: {p.stdout.readline().strip()}", flush=True)
    return p


def _ask(p: subprocess.Popen, what: str) -> dict[str, float]:
    p.stdin.write(what + "\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def profile(artifacts: str) -> None:
    import cProfile
    import pstats

    from calibtune.plots import save_trial_figures

    with tempfile.TemporaryDirectory(prefix="bench-figures-") as t:
        for f in Path(artifacts).glob("*.json"):
            shutil.copy(f, t)
        save_trial_figures(t)
        with cProfile.Profile() as pr:
            save_trial_figures(t)
    pstats.Stats(pr).strip_dirs().sort_stats("tottime").print_stats(25)


def refresh_rounds(store: Path, rounds: int) -> None:
    """A per-trial refresh of the parent run with and without the study figures, alternated,
    on a finished quickstart study's folder (``mlflow.db``, ``<storage>/quickstart/``; it writes
    the summary again: pass a copy, or the folder of a run made for the bench)."""
    from mlflow.tracking import MlflowClient

    from calibtune.readers._summary import rdb_storage, refresh_summary
    from calibtune.record._optuna import open_optuna_study
    from calibtune.record._tracking import TAG_KIND
    from calibtune.studyfile._config import load_study

    uri, sd = (
        f"sqlite:///{store / 'mlflow.db'}",
        next(store.glob("**/quickstart/study.yaml")).parent,
    )
    study, client = load_study(sd / "study.yaml"), MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    exp = client.get_experiment_by_name(study.experiment).experiment_id
    runs = client.search_runs([exp], f"tags.`{TAG_KIND}` = 'study'")
    ids = (uri, exp, runs[0].info.run_id, f"sqlite:///{sd / 'optuna.db'}")
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds + 1):
        for figures in (True, False):
            t0 = time.process_time()
            assert refresh_summary(study, *ids, figures=figures) is None
            if r:  # the first round warms up
                times[figures].append(time.process_time() - t0)
    opens: dict[str, list[float]] = {"url": [], "open": []}
    for r in range(rounds + 1):  # opening the study from its URL vs on one open RDBStorage
        for how, storage in (("url", ids[3]), ("open", rdb_storage(ids[3]))):
            t0 = time.process_time()
            open_optuna_study(study, storage)
            if r:
                opens[how].append(time.process_time() - t0)
    print(
        f"open the Optuna study (median of {rounds}): from its URL "
        f"{1e3 * statistics.median(opens['url']):.1f} ms, on one open storage "
        f"{1e3 * statistics.median(opens['open']):.1f} ms"
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"refresh CPU (median of {rounds}): with figures {med[True]:.3f} s, tables only "
        f"{med[False]:.3f} s ({med[True] / med[False]:.1f}×)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifacts", required=True)
    ap.add_argument("--baseline")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--light", action="store_true", help="workers without the driver's imports")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--refresh-store", type=Path, help="a copy of a finished quickstart store")
    args = ap.parse_args()
    if args.worker:
        return worker(args.artifacts, args.trials, not args.light)
    if args.profile:
        return profile(args.artifacts)
    if args.refresh_store:
        return refresh_rounds(args.refresh_store, args.rounds)
    print(f"load average {os.getloadavg()}", flush=True)
    sides = {"baseline": _start(Path(args.baseline), args), "this": _start(ROOT, args)}
    res: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for what in ("trial", "study"):
            for side, p in sides.items():
                res.setdefault((what, side), []).append(_ask(p, what))
    for p in sides.values():
        p.stdin.close()
        p.wait()
    print(f"load average {os.getloadavg()}")
    # medians, and means: a full collection comes every few calls, so the median misses it
    print("| figures | side | wall | CPU | of which GC |")
    print("|---|---|---|---|---|")
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in res.items()}
    avg = {k: {m: statistics.fmean(r[m] for r in v) for m in v[0]} for k, v in res.items()}
    for key, m in med.items():
        a = avg[key]
        cells = " | ".join(f"{m[c]:.3f} / {a[c]:.3f} s" for c in ("wall", "cpu", "gc"))
        print(f"| {key[0]} | {key[1]} | {cells} |")
    print("(median / mean of the rounds)")
    for what in ("trial", "study"):
        b, t, ab, at = (
            med[(what, "baseline")],
            med[(what, "this")],
            avg[(what, "baseline")],
            avg[(what, "this")],
        )
        print(
            f"{what}: CPU baseline / this = {b['cpu'] / t['cpu']:.2f}× (medians), "
            f"{ab['cpu'] / at['cpu']:.2f}× (means)"
        )


if __name__ == "__main__":
    main()
