"""Trial and study overhead (issue 13, targets 1 and 3); every ratio is from one run of this script.

1. **Trial overhead**: a quickstart trial (the trial config `calibtune run studies/quickstart.yaml`
   gives its trials, objective ``val/ece@ts`` included, logged to MLflow on SQLite by the study's
   own callback) run in this process through `calibtune.trial.run`: its wall time vs the sum of
   its epochs' ``epoch_time`` (training + validation/test passes + per-epoch metrics). The first
   trial of a process pays the imports (matplotlib, scikit-learn, ...); the second is what a
   warm process pays. The wall time outside the epochs is split into the per-epoch MLflow
   logging, the final evaluation (post-hoc fits, OOD sets), the artifacts and figures, and the
   final MLflow logging.
2. **make quickstart**: the time of ``calibtune run studies/quickstart.yaml --quiet`` (a fresh
   process, its own Ray) into a temporary storage and tracking store.
3. **Study**: a 16-trial digits study (quickstart's trial and losses), 2 trials at a time, run in
   this process after ``init_ray`` (whose time is the Ray start-up): study wall time vs
   ``Σ trial time_total_s / 2 + Ray start-up``.

4. **Per-epoch validation metrics** at 5000 × 100 with and without the selective keys
   (AURC/AUGRC/refinement NLL: computed every epoch only when a study names one).

Usage: python bench/bench_trial_overhead.py [--quick]
    [--skip-trial|--skip-quickstart|--skip-study|--skip-epoch-metrics]
(--quick: 3 epochs and a 4-trial study, for a smoke run.)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "studies" / "quickstart.yaml"


def _quickstart_raw(**search: Any) -> dict[str, Any]:
    """quickstart.yaml as a mapping, its search-space paths absolute (written elsewhere)."""
    raw = yaml.safe_load(QUICKSTART.read_text())
    for loss in raw["losses"]:
        if "space" in loss:
            loss["space"] = str((QUICKSTART.parent / loss["space"]).resolve())
    raw["search"].update(search)
    return raw


class _Timed:
    """The study's MLflow trial callback with the time spent in each hook added up."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.epoch_s, self.end_s = inner, 0.0, 0.0

    def on_start(self, history: Any) -> None:
        self.inner.on_start(history)

    def on_epoch(self, epoch: int, metrics: Any) -> None:
        t0 = time.perf_counter()
        self.inner.on_epoch(epoch, metrics)
        self.epoch_s += time.perf_counter() - t0

    def on_trial_end(self, metrics: Any, artifacts_dir: Path) -> None:
        t0 = time.perf_counter()
        self.inner.on_trial_end(metrics, artifacts_dir)
        self.end_s += time.perf_counter() - t0


#: the end-of-trial stages timed inside a trial (module, function), patched for the bench only
STAGES = (
    ("calibtune.trial._driver", "check_data_files"),
    ("calibtune.trial._worker", "_ood_logits"),
    ("calibtune.trial._worker", "shift_logits"),
    ("calibtune.trial._worker", "evaluate_final"),
    ("calibtune.trial._worker", "write_artifacts"),
    ("calibtune.plots", "save_trial_figures"),
)


@contextlib.contextmanager
def _stage_timers() -> Any:
    """Add up the time of each of `STAGES` while inside (the modules' attributes are wrapped,
    then restored)."""
    import importlib

    acc: dict[str, float] = {}
    saved = []
    for mod_name, name in STAGES:
        mod = importlib.import_module(mod_name)
        fn = getattr(mod, name)
        saved.append((mod, name, fn))

        def timed(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[_name] = acc.get(_name, 0.0) + time.perf_counter() - t0

        setattr(mod, name, timed)
    try:
        yield acc
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def bench_trial(tmp: Path, loss: str, epochs: int, runs: int = 2) -> list[dict[str, float]]:
    from calibtune import trial as T
    from calibtune.study import _tracking as TR
    from calibtune.study._config import load_study
    from calibtune.study._trainable import trial_dict

    raw = _quickstart_raw()
    raw["trial"]["train"]["epochs"] = epochs
    path = tmp / "quickstart_bench.yaml"
    path.write_text(yaml.safe_dump(raw))
    study = load_study(path)
    sampled = {"loss": loss, loss: {"gamma": 2.0}} if loss == "focal" else {"loss": loss}
    uri = f"sqlite:///{tmp / 'trial_mlflow.db'}"
    exp = TR.experiment_id(uri, "bench-trial")
    out = []
    for i in range(runs):
        run_id = TR._client(uri).create_run(exp).info.run_id
        cfg = T.config_from_dict(trial_dict(study, sampled, 1, f"{loss}-{i}"))
        cb = _Timed(TR.MlflowTrialCallback(uri, run_id, background=True))  # as a study
        with _stage_timers() as stages:
            t0 = time.perf_counter()
            res = T.run(cfg, callbacks=[cb], storage_path=tmp / "trials")
            wall = time.perf_counter() - t0
        epochs_s = sum(h["epoch_time"] for h in res.history)
        out.append(
            {
                "wall_s": wall,
                "epochs_s": epochs_s,
                "train_s": sum(h["train_time"] for h in res.history),
                "ratio": wall / epochs_s,
                "mlflow_epochs_s": cb.epoch_s,
                "mlflow_final_s": cb.end_s,
                "rest_s": wall - epochs_s - cb.epoch_s - cb.end_s,
                "metrics": len(res.metrics),
                "stages_s": dict(stages),
            }
        )
    return out


def bench_epoch_metrics(n: int = 5000, k: int = 100, reps: int = 5) -> dict[str, float]:
    """One epoch's validation metrics on (n, k) logits, with and without the selective keys
    (`calibtune.metrics.keys.FINAL_ONLY_KEYS`, ``eval.epoch_selective``), alternated; 1 thread
    (a trial's default)."""
    import torch

    from calibtune.training import epoch_metrics

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    logits, labels = 3 * torch.randn(n, k, generator=g), torch.randint(0, k, (n,), generator=g)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(reps):
        for selective in (False, True):
            t0 = time.perf_counter()
            epoch_metrics("val", logits, labels, 15, selective=selective)
            times[selective].append(time.perf_counter() - t0)
    plain, full = sorted(times[False])[reps // 2], sorted(times[True])[reps // 2]
    return {"plain_s": plain, "selective_s": full, "ratio": full / plain}


def bench_quickstart(tmp: Path) -> dict[str, float]:
    """``make quickstart``'s command, timed from outside (a fresh process)."""
    cwd = tmp / "quickstart"
    cwd.mkdir()
    exe = Path(sys.executable).with_name("calibtune")
    cmd = [str(exe), "run", str(QUICKSTART), "--quiet", "--storage", str(cwd / "studies")]
    import calibtune  # the checkout this script imports (PYTHONPATH) runs the command too

    env = {**os.environ, "PYTHONPATH": str(Path(calibtune.__file__).parents[1])}
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"quickstart failed ({res.returncode}): {res.stderr[-2000:]}")
    return {"wall_s": wall}


_RAY_START: dict[str, float] = {}


def bench_study(tmp: Path, samples: int, epochs: int, reuse: bool = True) -> dict[str, float]:
    """One study; Ray is started by the first call in a process (its start-up counted then),
    the later calls find it running and count the first call's start-up again."""
    from calibtune.study._config import load_study
    from calibtune.study._raycluster import init_ray
    from calibtune.study._search import run_study

    raw = _quickstart_raw(num_samples=samples, max_concurrent=2, reuse_actors=reuse)
    raw["name"] = f"bench_overhead_study_{'reuse' if reuse else 'fresh'}"
    raw["trial"]["train"]["epochs"] = epochs
    path = tmp / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(copy.deepcopy(raw)))
    study = load_study(path)
    t0 = time.perf_counter()
    init_ray(verbose=False)
    ray_s = _RAY_START.setdefault("s", time.perf_counter() - t0)
    t1 = time.perf_counter()
    outcome = run_study(
        study, tracking_uri=f"sqlite:///{tmp / 'study_mlflow.db'}", storage=tmp / "s", verbose=0
    )
    study_s = time.perf_counter() - t1
    from mlflow.tracking import MlflowClient

    trial_s = [float(r.metrics["time_total_s"]) for r in outcome.results]
    ideal = sum(trial_s) / 2 + ray_s
    # each trial's own wall time vs its epochs (target 1 inside Tune), from its result.json
    ratios = sorted(
        r["wall_time_s"] / sum(h["epoch_time"] for h in r["history"])
        for r in (json.loads(p.read_text()) for p in outcome.storage.glob("trials/*/result.json"))
    )
    parent = MlflowClient(outcome.tracking_uri).get_run(outcome.parent_run_id)
    return {
        "reuse_actors": reuse,
        "trials": len(trial_s),
        "ray_start_s": ray_s,
        "study_s": study_s,
        "tuner_fit_s": parent.data.metrics["study/wall_time_s"],
        "sum_trial_s": sum(trial_s),
        "ratio": (study_s + ray_s) / ideal,
        "trial_ratio_median": ratios[len(ratios) // 2],
        "trial_ratio_max": ratios[-1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--loss", default="focal")
    ap.add_argument("--skip-trial", action="store_true")
    ap.add_argument("--skip-study", action="store_true")
    ap.add_argument("--skip-quickstart", action="store_true")
    ap.add_argument("--skip-epoch-metrics", action="store_true")
    ap.add_argument(
        "--study-reuse",
        default="true",
        choices=("true", "false", "both"),
        help="search.reuse_actors of the 16-trial study; both: fresh processes, then reused",
    )
    args = ap.parse_args()
    epochs = 3 if args.quick else 10
    out: dict[str, Any] = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="calibtune-bench-") as d:
        tmp = Path(d)
        if not args.skip_epoch_metrics:
            out["epoch_metrics"] = bench_epoch_metrics()
        out["trial"] = [] if args.skip_trial else bench_trial(tmp, args.loss, epochs)
        if not args.skip_quickstart:
            out["quickstart"] = bench_quickstart(tmp)
        if not args.skip_study:
            reuse = {"true": [True], "false": [False], "both": [False, True]}[args.study_reuse]
            out["study"] = [bench_study(tmp, 4 if args.quick else 16, epochs, r) for r in reuse]
    out["load_after"] = os.getloadavg()
    for i, r in enumerate(out["trial"]):
        print(
            f"trial {'cold' if i == 0 else 'warm'}: wall {r['wall_s']:.2f}s, epochs "
            f"{r['epochs_s']:.2f}s (training {r['train_s']:.2f}s) -> ratio {r['ratio']:.2f}; "
            f"outside the epochs: MLflow per epoch {r['mlflow_epochs_s']:.2f}s, final MLflow "
            f"{r['mlflow_final_s']:.2f}s, rest {r['rest_s']:.2f}s; {r['metrics']} final metrics"
        )
        print("   stages:", ", ".join(f"{k} {v:.2f}s" for k, v in r["stages_s"].items()))
    if "epoch_metrics" in out:
        e = out["epoch_metrics"]
        print(
            f"val metrics of one epoch at 5000x100 (median of 5, alternated): "
            f"{e['plain_s']:.3f}s, with AURC/AUGRC/refinement NLL {e['selective_s']:.3f}s "
            f"(x{e['ratio']:.1f})"
        )
    if "quickstart" in out:
        print(f"calibtune run studies/quickstart.yaml: {out['quickstart']['wall_s']:.1f}s")
    for s in out.get("study", []):
        print(
            f"study (reuse_actors={s['reuse_actors']}): {s['trials']} trials, Ray start-up "
            f"{s['ray_start_s']:.1f}s, study "
            f"{s['study_s']:.1f}s (Tuner.fit {s['tuner_fit_s']:.1f}s), Σ trial "
            f"{s['sum_trial_s']:.1f}s -> (study + start-up) / (Σ trial / 2 + start-up) = "
            f"{s['ratio']:.2f}; trial wall / its epochs in the study: median "
            f"{s['trial_ratio_median']:.2f}, max {s['trial_ratio_max']:.2f}"
        )
    print("load average before/after:", out["load_before"], out["load_after"])
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
