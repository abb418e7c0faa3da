"""Cluster use of a paper-shaped study (issue 29, "How to measure the cluster use without GPUs").

A grid over 6 arms × seeds [1, 2, 3] (the shape of the shipped paper studies: grid sampler, one
trial per arm, three initialisation seeds) on the embedded digits set, trials of a few seconds,
run in this process on a local Ray whose ``--slots`` logical CPUs are the slots (each seed of a
trial trains in local mode on 1 CPU, as a paper study's seed takes 1 GPU). ``max_concurrent`` is
the one the checkout's shipped paper study sets (studies/mukhoti2020_focal_cifar10.yaml), so that
the same script measures the code before (``1``, seeds one after another) and after (``auto``,
seeds in parallel); ``--max-concurrent`` overrides it.

Measured: the study's wall time (``run_study``, Ray already started) and each seed run's own
training time (``wall_time_s`` of its saved result), and from them

    ideal makespan = Σ seed-run times / slots,   busy = ideal makespan / study wall

(busy ≥ 0.9 ⇔ wall ≤ 1.1 × ideal; the issue's target is wall ≤ 1.2 × ideal, busy ≥ 0.83);
``busy_by_run_spans`` counts each seed run's whole MLflow span (opened to closed) instead;
``busy_by_run_spans_after_startup`` the same from the first seed run's start to the last one's
end (``startup_s``: the study's start-up before it: Ray's worker processes and their imports).
Everything runs on this machine's real cores whatever ``--slots`` says: with more slots than
cores the seed runs slow each other down, which the seed-run times include, so the ratio still
measures how full the slots were, not how fast the machine is.

Usage: python bench/bench_cluster_use.py [--checkout PATH] [--slots 4] [--epochs 2]
    [--max-concurrent N|auto] [--json OUT] [--keep DIR]
(--checkout: run another checkout's code, e.g. a clean clone of the previous commit.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PAPER_STUDY = Path("studies") / "mukhoti2020_focal_cifar10.yaml"

ARMS = [
    {"name": "cross_entropy"},
    {"name": "brier"},
    {"name": "label_smoothing", "params": {"alpha": 0.05}},
    {"name": "focal", "label": "focal_g1", "params": {"gamma": 1.0}},
    {"name": "focal", "label": "focal_g2", "params": {"gamma": 2.0}},
    {"name": "focal", "label": "focal_g3", "params": {"gamma": 3.0}},
]


def study_yaml(epochs: int, max_concurrent: object) -> str:
    raw = {
        "name": "bench_cluster_use",
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "small_cnn"},
            "optimizer": {"name": "sgd", "lr": 0.05},
            "train": {"epochs": epochs, "batch_size": 64, "checkpoint_every": epochs},
            "eval": {"n_bins": 15, "posthoc": ["ts"]},
            "scaling": {"num_workers": 0},
        },
        "losses": ARMS,
        "search": {
            "sampler": "grid",
            "num_samples": len(ARMS),
            "max_concurrent": max_concurrent,
            "seeds": [1, 2, 3],
            "objectives": [{"metric": "val/ece@ts", "mode": "min"}],
        },
        "tracking": {"experiment": "bench_cluster_use"},
    }
    return yaml.safe_dump(raw, sort_keys=False)


def seed_times(storage: Path) -> list[float]:
    """Each seed run's training time: ``wall_time_s`` of every saved trial result."""
    return [
        float(json.loads(p.read_text())["wall_time_s"])
        for p in sorted(storage.rglob("result.json"))
        if "-seed" in p.parent.name
    ]


def seed_spans(uri: str, experiment_id: str) -> list[tuple[float, float]]:
    """Each seed run's MLflow span (opened to closed: setup, training, final logging), in
    seconds since the epoch."""
    from mlflow.tracking import MlflowClient

    from calibtune.record._tracking import TAG_KIND

    runs = MlflowClient(uri).search_runs([experiment_id], f"tags.`{TAG_KIND}` = 'seed'")
    return [(r.info.start_time / 1000, r.info.end_time / 1000) for r in runs if r.info.end_time]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkout", type=Path, default=ROOT)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-concurrent", default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--keep", type=Path, default=None, help="keep the study's folder and store here"
    )
    args = ap.parse_args()
    checkout = args.checkout.resolve()
    sys.path.insert(0, str(checkout))
    os.environ["PYTHONPATH"] = str(checkout)  # Ray's workers (started by this process) too
    os.chdir(checkout)  # Ray puts the driver's working directory first on its workers' path
    mc = args.max_concurrent
    if mc is None:
        mc = yaml.safe_load((checkout / PAPER_STUDY).read_text())["search"]["max_concurrent"]
    mc = mc if mc == "auto" else int(mc)

    import ray

    from calibtune.cluster._raycluster import init_ray
    from calibtune.study import run_study

    assert Path(sys.modules["calibtune"].__file__).is_relative_to(checkout), "calibtune"

    with tempfile.TemporaryDirectory(prefix="bench-cluster-use-") as tmp_dir:
        tmp = str(args.keep or tmp_dir)
        Path(tmp).mkdir(parents=True, exist_ok=True)
        path = Path(tmp) / "study.yaml"
        path.write_text(study_yaml(args.epochs, mc))
        init_ray(num_cpus=args.slots, verbose=False)
        t0, started = time.perf_counter(), time.time()
        outcome = run_study(
            path, storage=Path(tmp) / "runs", tracking_uri=f"sqlite:///{tmp}/mlflow.db", verbose=0
        )
        wall = time.perf_counter() - t0
        ray.shutdown()
        times = seed_times(Path(tmp) / "runs")
        spans = seed_spans(f"sqlite:///{tmp}/mlflow.db", outcome.experiment_id)
    ideal = sum(times) / args.slots
    busy = sum(b - a for a, b in spans)
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    out = {
        "checkout": str(checkout),
        "max_concurrent": mc,
        "slots": args.slots,
        "seed_runs": len(times),
        "finished": outcome.counts.get("finished", 0),
        "sum_seed_run_s": round(sum(times), 2),
        "mean_seed_run_s": round(sum(times) / max(len(times), 1), 2),
        "study_wall_s": round(wall, 2),
        "ideal_makespan_s": round(ideal, 2),
        "wall_over_ideal": round(wall / ideal, 3) if ideal else None,
        "busy": round(ideal / wall, 3) if wall else None,
        # the same with each seed run's whole MLflow span (its setup and logging too)
        "busy_by_run_spans": round(busy / args.slots / wall, 3) if wall else None,
        # before the first seed run opens (Ray's workers start, imports, the trials' runs)
        "startup_s": round(first - started, 1),
        # the same from the first seed run's start to the last one's end
        "busy_by_run_spans_after_startup": round(busy / args.slots / (last - first), 3),
        # after the last seed run closed: the driver's end of the study (summary, figures)
        "tail_s": round(started + wall - last, 1),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
