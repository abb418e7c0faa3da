"""Trial and study overhead (issue 13, targets 1 and 3); every ratio is from one run of this script.

1. **Trial overhead**: a quickstart trial (the trial config `calibtune run studies/quickstart.yaml`
   gives its trials, objective ``val/ece@ts`` included, logged to MLflow on SQLite by the study's
   own callback) run in this process through `calibtune.trial.run`: its wall time vs the sum of
   its epochs' ``epoch_time`` (training + validation/test passes + per-epoch metrics). The first
   trial of a process pays the imports (matplotlib, scikit-learn, ...); the second is what a
   warm process pays. The wall time outside the epochs is split into the per-epoch MLflow
   logging, the final evaluation (post-hoc fits, OOD sets), the artifacts and figures, and the
   final MLflow logging.
   Trials alternate between drawing their figures and leaving them to the study's driver
   (``figures_for``, as a study's trials do); the driver's drawing is timed after the trial.
2. **make quickstart**: the time of ``calibtune run studies/quickstart.yaml --quiet`` (a fresh
   process, its own Ray) into a temporary storage and tracking store, split by `timeline` from
   the study's own records; ``--quickstart-baseline`` alternates it with another checkout's.
3. **Study**: a 16-trial digits study (quickstart's trial and losses), 2 trials at a time, run in
   this process after ``init_ray`` (whose time is the Ray start-up): study wall time vs
   ``Σ trial time_total_s / 2 + Ray start-up``.

4. **Per-epoch validation metrics** at 5000 × 100 with and without the selective keys
   (AURC/AUGRC/refinement NLL: computed every epoch only when a study names one).

Usage: python bench/bench_trial_overhead.py [--quick]
    [--skip-trial|--skip-quickstart|--skip-study|--skip-epoch-metrics|--skip-study-figures]
    [--trial-runs N]
    [--quickstart-baseline CHECKOUT --quickstart-rounds N]
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
        self.defers_figures = inner.defers_figures  # the trial asks its callbacks

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


def bench_trial(tmp: Path, loss: str, epochs: int, runs: int = 5) -> list[dict[str, Any]]:
    """``runs`` quickstart trials in this process: the first pays the imports (cold, figures
    drawn by the trial), then the trial draws its figures or leaves them to the study's driver
    (``figures_for``, what a study does), alternated; the driver's drawing is timed apart."""
    from calibtune import trial as T
    from calibtune.record import _tracking as TR
    from calibtune.study._trainable import trial_dict
    from calibtune.studyfile._config import load_study

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
        defer = i % 2 == 0 and i > 0
        run_id = TR._client(uri).create_run(exp).info.run_id
        cfg = T.config_from_dict(trial_dict(study, sampled, 1, f"{loss}-{i}"))
        inner = TR.MlflowTrialCallback(
            uri, run_id, background=True, figures_for=study.name if defer else None
        )
        cb = _Timed(inner)  # as a study's
        with _stage_timers() as stages:
            t0 = time.perf_counter()
            res = T.run(cfg, callbacks=[cb], storage_path=tmp / "trials")
            wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        drawn = TR.render_deferred_figures(uri, exp, study.name)
        driver_s = time.perf_counter() - t1
        assert drawn == int(defer), (drawn, defer)
        epochs_s = sum(h["epoch_time"] for h in res.history)
        out.append(
            {
                "case": "cold" if i == 0 else "deferred" if defer else "drawn",
                "wall_s": wall,
                "epochs_s": epochs_s,
                "train_s": sum(h["train_time"] for h in res.history),
                "ratio": wall / epochs_s,
                "mlflow_epochs_s": cb.epoch_s,
                "mlflow_final_s": cb.end_s,
                "rest_s": wall - epochs_s - cb.epoch_s - cb.end_s,
                "metrics": len(res.metrics),
                "stages_s": dict(stages),
                "driver_figures_s": driver_s,
            }
        )
    return out


def bench_study_figures(reps: int = 5) -> dict[str, float]:
    """The parent run's study figures for an 8-trial, 10-parameter study (as the quickstart's),
    drawn and saved with their fixed margins vs with ``tight_layout`` added (what they had),
    alternated; medians."""
    import io

    import numpy as np

    from calibtune.plots import _study as P

    rng = np.random.default_rng(0)
    params = {f"loss.p{i}": rng.uniform(0, 5, 8).tolist() for i in range(9)}
    params["loss.update_every"] = ["epoch", "10"] * 4
    series = {m: rng.uniform(0.01, 0.1, 8).tolist() for m in ("val/ece", "val/ece@ts")}
    imp = {f"adafocal/param_{i}": float(v) for i, v in enumerate(rng.dirichlet(np.ones(10)))}
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(reps):
        for tight in (False, True):
            t0 = time.perf_counter()
            for fig in (
                P.plot_objective_history(series["val/ece@ts"], "val/ece@ts", "min"),
                P.plot_metric_vs_params(params, series),
                P.plot_importances(imp),
            ):
                if tight:
                    fig.tight_layout()
                fig.savefig(io.BytesIO(), format="png", dpi=100)
            times[tight].append(time.perf_counter() - t0)
    fixed, tight = sorted(times[False])[reps // 2], sorted(times[True])[reps // 2]
    return {"fixed_s": fixed, "tight_s": tight, "ratio": tight / fixed}


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


def bench_quickstart(tmp: Path, checkout: Path | None = None) -> dict[str, Any]:
    """``make quickstart``'s command, timed from outside (a fresh process), with `timeline`;
    the code of ``checkout`` (default: the one this script imports) on ``PYTHONPATH``."""
    import calibtune

    checkout = checkout or Path(calibtune.__file__).parents[1]
    cwd = Path(tempfile.mkdtemp(prefix="quickstart-", dir=tmp))
    study_file = checkout / "studies" / "quickstart.yaml"
    # `python -m calibtune` runs the checkout's own entry point (the venv's `calibtune` script
    # names one function, which another checkout may not have)
    cmd = [sys.executable, "-m", "calibtune", "run", str(study_file), "--quiet"]
    cmd += ["--storage", str(cwd / "studies")]
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines = [(time.time(), line.rstrip("\n")) for line in proc.stdout]  # stamped as printed
    rc = proc.wait(timeout=1800)
    t_end = time.time()
    if rc != 0:
        raise RuntimeError(f"quickstart failed ({rc}): {lines[-20:]}")
    return timeline(cwd / "studies" / "quickstart", cwd / "mlflow.db", t0, t_end, lines)


def timeline(
    study: Path, db: Path, t0: float, t_end: float, lines: list[tuple[float, str]]
) -> dict[str, Any]:
    """Where a study's wall time went, from its own records: its stamped output ``lines``
    (``[calibtune] study …`` once set up; ``study …`` with the outcome table after the end
    summary), each trial's Tune ``result.json`` (``time_total_s`` counts from the trainable's
    start; ``epoch_time`` per epoch; the last row is the final report) and the MLflow child
    runs' end times (closed just before that final report). ``t0``/``t_end``: the command's
    start and exit."""
    import sqlite3

    con = sqlite3.connect(db)
    ends = dict(
        con.execute(
            "select t.value, r.end_time from runs r join tags t on t.run_uuid = r.run_uuid "
            "where t.key = 'calibtune.trial_id' and r.end_time is not null"
        ).fetchall()
    )
    con.close()
    trials = []
    for res in study.glob("study_trainable_*/result.json"):
        rows = [json.loads(line) for line in res.read_text().splitlines() if line.strip()]
        if not rows or rows[-1]["trial_id"] not in ends:
            continue  # a reused configuration (issue 24): no training, no epochs to time
        end = ends[rows[-1]["trial_id"]] / 1000
        trials.append(
            {
                "start": end - rows[-1]["time_total_s"],
                "end": end,
                "total": rows[-1]["time_total_s"],
                "epochs": sum(r["epoch_time"] for r in rows[:-1]),
                # trainable start -> first epoch: imports (a fresh actor), data, model, MLflow run
                "before_epochs": rows[0]["time_total_s"] - rows[0]["epoch_time"],
                "reports": sum(r["time_this_iter_s"] - r["epoch_time"] for r in rows[1:-1]),
                "after_epochs": rows[-1]["time_this_iter_s"],  # final evaluation to the report
            }
        )
    trials.sort(key=lambda t: t["start"])
    set_up = next((t for t, text in lines if text.startswith("[calibtune] study")), t0)
    printed = next((t for t, text in lines if text.startswith("study ")), t_end)
    first, last = trials[0]["start"], max(t["end"] for t in trials)
    total = {k: sum(t[k] for t in trials) for k in trials[0] if k not in ("start", "end")}
    return {
        "wall_s": t_end - t0,
        "cli_start_s": set_up - t0,  # imports, study file checks
        "to_first_trial_s": first - set_up,  # Ray start, Tuner set-up, first actors' start
        "trials_window_s": last - first,
        "end_summary_s": printed - last,  # drain, final summary, outcome table
        "exit_s": t_end - printed,  # after the last line: Ray shutdown, interpreter exit
        "slot_idle_s": 2 * (last - first) - total["total"],  # 2 slots: between trials
        **{f"sum_{k}_s": v for k, v in total.items()},
        "trials": len(trials),
    }


_RAY_START: dict[str, float] = {}


def bench_study(tmp: Path, samples: int, epochs: int, reuse: bool = True) -> dict[str, float]:
    """One study; Ray is started by the first call in a process (its start-up counted then),
    the later calls find it running and count the first call's start-up again."""
    from calibtune.cluster._raycluster import init_ray
    from calibtune.study._search import run_study
    from calibtune.studyfile._config import load_study

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
    ap.add_argument("--skip-study-figures", action="store_true")
    ap.add_argument("--trial-runs", type=int, default=5, help="cold, then drawn/deferred")
    ap.add_argument("--quickstart-rounds", type=int, default=1)
    ap.add_argument(
        "--quickstart-baseline",
        type=Path,
        help="another checkout whose quickstart alternates with this one's (e.g. /work/main)",
    )
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
        if not args.skip_study_figures:
            out["study_figures"] = bench_study_figures()
        trial = [] if args.skip_trial else bench_trial(tmp, args.loss, epochs, args.trial_runs)
        out["trial"] = trial
        if not args.skip_quickstart:
            base = [args.quickstart_baseline] if args.quickstart_baseline else []
            for _ in range(args.quickstart_rounds):  # alternated with the baseline's
                for checkout in [None, *base]:
                    q = bench_quickstart(tmp, checkout)
                    out.setdefault("quickstart", []).append({"checkout": str(checkout), **q})
        if not args.skip_study:
            reuse = {"true": [True], "false": [False], "both": [False, True]}[args.study_reuse]
            out["study"] = [bench_study(tmp, 4 if args.quick else 16, epochs, r) for r in reuse]
    out["load_after"] = os.getloadavg()
    for r in out["trial"]:
        print(
            f"trial {r['case']}: wall {r['wall_s']:.2f}s, epochs "
            f"{r['epochs_s']:.2f}s (training {r['train_s']:.2f}s) -> ratio {r['ratio']:.2f}; "
            f"outside the epochs: MLflow per epoch {r['mlflow_epochs_s']:.2f}s, final MLflow "
            f"{r['mlflow_final_s']:.2f}s, rest {r['rest_s']:.2f}s; {r['metrics']} final metrics"
        )
        print(
            "   stages:",
            ", ".join(f"{k} {v:.2f}s" for k, v in r["stages_s"].items()),
            f"| the driver's drawing after it {r['driver_figures_s']:.2f}s",
        )
    for case in ("drawn", "deferred"):
        if rs := sorted(r["ratio"] for r in out["trial"] if r["case"] == case):
            print(f"trial {case}, warm: median ratio {rs[len(rs) // 2]:.2f} of {len(rs)}")
    if "epoch_metrics" in out:
        e = out["epoch_metrics"]
        print(
            f"val metrics of one epoch at 5000x100 (median of 5, alternated): "
            f"{e['plain_s']:.3f}s, with AURC/AUGRC/refinement NLL {e['selective_s']:.3f}s "
            f"(x{e['ratio']:.1f})"
        )
    if "study_figures" in out:
        f = out["study_figures"]
        print(
            f"study figures (objective, ECE vs 10 parameters, importances; median of 5, "
            f"alternated): fixed margins {f['fixed_s']:.2f}s, with tight_layout "
            f"{f['tight_s']:.2f}s (x{f['ratio']:.2f})"
        )
    for q in out.get("quickstart", []):
        print(
            f"quickstart ({q['checkout']}): {q['wall_s']:.1f}s = CLI start {q['cli_start_s']:.1f}s "
            f"+ to the first trial (Ray, Tuner, actors) "
            f"{q['to_first_trial_s']:.1f}s + trials {q['trials_window_s']:.1f}s + end summary "
            f"{q['end_summary_s']:.1f}s + exit {q['exit_s']:.1f}s; in the {q['trials']} trials "
            f"(Σ {q['sum_total_s']:.1f}s): before the first epoch {q['sum_before_epochs_s']:.1f}s, "
            f"epochs {q['sum_epochs_s']:.1f}s, reports {q['sum_reports_s']:.1f}s, after the "
            f"last epoch {q['sum_after_epochs_s']:.1f}s; slots idle between trials "
            f"{q['slot_idle_s']:.1f}s"
        )
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
