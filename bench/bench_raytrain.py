"""Ray Train worker mode vs local mode: fixed cost per trial and per-epoch reporting overhead.

`python bench/bench_raytrain.py [--quick] [--epochs 1,100,300] [--ray-defaults] [--timeline]`

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
``/proc``: what the polling costs). ``--timeline`` shows where a 1-epoch worker-mode trial's
time goes (`_timeline`): when each process the local raylet starts for it began, registered and
took each Ray task title, rank 0's marks, when the controller took the first report, and the
CPU seconds of each process. Prints markdown tables for bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
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
        self._mark("start")

    def on_epoch(self, epoch: int, metrics: Any) -> None:
        self._mark("epoch")

    def on_trial_end(self, metrics: Any, artifacts_dir: Any) -> None:
        self._mark("end")

    def _mark(self, what: str) -> None:
        with open(self.path, "a") as f:
            f.write(f"{what} {time.time()}\n")


def _report_clock(path: str) -> Any:
    """A ``ray.train.UserCallback`` (it runs in the Train controller) that marks ``report`` in
    ``path`` each time the controller has taken the workers' reports."""
    import ray.train

    class ReportClock(ray.train.UserCallback):
        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            with open(path, "a") as f:
                f.write(f"report {time.time()}\n")

    return ReportClock()


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


class ProcWatch:
    """Samples /proc every 20 ms for the children of one process (the local raylet) started
    after it was made: each one's start (wall clock), the first time each process title was seen
    (``ray::IDLE``, then ``ray::TrainController.__init__`` …, Ray's names for what the process
    runs), and its CPU seconds (user + system) when last seen alive."""

    def __init__(self, parent: int) -> None:
        self.t0 = time.time()
        self.parent = parent
        self.procs: dict[int, dict[str, Any]] = {}
        self._tick = os.sysconf("SC_CLK_TCK")
        self._boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tasks = Path(f"/proc/{self.parent}/task")
        while not self._stop.wait(0.02):
            now = time.time()
            kids: set[str] = set()
            for t in tasks.iterdir():  # the raylet's threads: each lists the children it forked
                with contextlib.suppress(OSError):
                    kids.update((t / "children").read_text().split())
            for pid in kids:
                self._sample(int(pid), Path("/proc", pid), now)

    def _sample(self, pid: int, d: Path, now: float) -> None:
        rec = self.procs.get(pid)
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if rec is None:
                start = self._boot + int(fields[19]) / self._tick
                if start < self.t0 - 0.05:
                    self.procs[pid] = rec = {"old": True}
                else:
                    self.procs[pid] = rec = {"pid": pid, "start": start, "titles": {}}
            if rec.get("old"):
                return
            title = (d / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            return
        rec["titles"].setdefault(title.split(" ")[0][:60], now)
        rec["cpu"] = (int(fields[11]) + int(fields[12])) / self._tick
        rec["last"] = now

    def stop(self) -> list[dict[str, Any]]:
        """The new processes, oldest first."""
        self._stop.set()
        self._thread.join()
        return sorted(
            (r for r in self.procs.values() if not r.get("old")), key=lambda r: r["start"]
        )


def _raylet_pid() -> int:
    import ray

    node = ray._private.worker.global_worker.node  # the local Ray this process started
    return node.all_processes["raylet"][0].process.pid


# (milestone, process title prefix or rank-0 mark): a 1-epoch worker-mode trial in order
_MILESTONES = (
    ("controller process started", "spawn TrainController"),
    ("controller registered with the raylet (`import ray`)", "ray::IDLE TrainController"),
    ("controller running its loop (Train imports, PG cleaner created)", "ray::TrainController.run"),
    ("worker process started (after a start-up slot freed)", "spawn RayTrainWorker"),
    ("worker registered (`import ray`)", "ray::IDLE RayTrainWorker"),
    ("worker actor up (Train worker imports)", "ray::RayTrainWorker.get_metadata"),
    ("torch back end set up on the worker (`import torch`)", "ray::execute."),
    ("train function launched", "ray::RayTrainWorker.run_train_fn"),
    ("rank 0 built (calibtune imports, data, model)", "mark start"),
    ("epoch 1 logged on rank 0, about to report", "mark epoch"),
    ("controller took the report (`UserCallback.after_report`)", "mark report"),
    ("rank 0 finalised", "mark end"),
)


def _milestones(procs: list[dict[str, Any]], marks: dict[str, float]) -> dict[str, float]:
    """Seconds from ``run()`` to each event seen: ``spawn X`` (the start of the process that
    later ran actor X), ``ray::IDLE X`` (when it registered), each process title, ``mark m``
    (rank 0's mark ``m``); `_MILESTONES` names them by prefix."""
    out = {f"mark {k}": v for k, v in marks.items()}
    for r in procs:
        named = (t for t in r["titles"] if t.startswith("ray::") and t != "ray::IDLE")
        actor = next(named, "ray::")[5:].split(".")[0]
        out.setdefault(f"spawn {actor}", r["start"])
        if "ray::IDLE" in r["titles"]:
            out.setdefault(f"ray::IDLE {actor}", r["titles"]["ray::IDLE"])
        for title, at in r["titles"].items():
            out.setdefault(title, at)
    return out


def _cpu_by_role(procs: list[dict[str, Any]]) -> dict[str, float]:
    """CPU seconds of the trial's processes: controller, worker, Train's other actors."""
    roles = {"controller": 0.0, "worker": 0.0, "other actors": 0.0}
    for r in procs:
        titles = " ".join(r["titles"])
        role = (
            "controller"
            if "TrainController" in titles
            else "worker"
            if "RayTrainWorker" in titles
            else "other actors"
        )
        roles[role] += r.get("cpu", 0.0)
    return roles


def _timeline(storage: str, reps: int) -> None:
    """Where a 1-epoch worker-mode trial's time goes, in seconds from the call to ``run()``
    (`_MILESTONES`, from the processes the local raylet starts and rank 0's marks), the CPU
    seconds of those processes and of the driver, local mode's wall beside it; one markdown
    table, a column per repetition."""
    from calibtune.trial import run

    cols = []
    for rep in range(reps):
        local = _one(storage, f"tl{rep}", 0, 1)
        watch = ProcWatch(_raylet_pid())
        cpu0 = time.process_time()
        clock = os.path.join(storage, f"tw{rep}.clock")
        cfg = _cfg(storage, f"tw{rep}", 1, 1)
        run(cfg, callbacks=[EpochClock(clock)], train_callbacks=[_report_clock(clock)])
        wall = time.time() - watch.t0
        driver_cpu = time.process_time() - cpu0
        procs = watch.stop()
        for r in procs:
            r["start"] -= watch.t0
            r["titles"] = {t: at - watch.t0 for t, at in r["titles"].items()}
        marks: dict[str, str] = {}
        for line in Path(clock).read_text().splitlines():  # the first of each mark
            what, at = line.split()
            marks.setdefault(what, at)
        at = _milestones(procs, {k: float(v) - watch.t0 for k, v in marks.items()})
        col = {
            label: min((v for k, v in at.items() if k.startswith(key)), default=None)
            for label, key in _MILESTONES
        }
        col["`run()` returned"] = wall
        col["local mode, same trial: wall"] = local["wall"]
        cpu = _cpu_by_role(procs)
        for role, sec in cpu.items():
            col[f"CPU s: {role}"] = sec
        col["CPU s: driver (`run()` in this process)"] = driver_cpu
        col["CPU s: all"] = sum(cpu.values()) + driver_cpu
        col["load average (1 min) after"] = os.getloadavg()[0]
        cols.append(col)
        print(f"rep {rep + 1}: worker {wall:.1f} s, local {local['wall']:.1f} s", flush=True)
    print("\n| s from `run()` | " + " | ".join(f"rep {i + 1}" for i in range(reps)) + " |")
    print("|---|" + "---|" * reps)
    for label in cols[0]:
        vals = ["—" if c[label] is None else f"{c[label]:.2f}" for c in cols]
        print(f"| {label} | " + " | ".join(vals) + " |")


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
    marks = [line.split() for line in Path(clock).read_text().splitlines()]
    ends = [float(t) for what, t in marks if what == "epoch"]
    gaps = [
        b - a - h["epoch_time"]
        for a, b, h in zip(ends[:-1], ends[1:], res.history[1:], strict=True)
    ]
    return {"wall": wall, "gap_ms": 1000 * statistics.median(gaps) if gaps else float("nan")}


def _by_poll(storage: str, epochs: list[int], polls: list[str]) -> None:
    """Worker mode at each poll interval, alternated per epoch count, local mode beside; the
    Train controller's CPU seconds per second alive (what the polling costs)."""
    rows = []
    for n in epochs:
        local = _one(storage, f"pl{n}", 0, n)
        for poll in polls:
            watch = ProcWatch(_raylet_pid())
            worker = _one(storage, f"pw{n}_{poll}", 1, n, poll)
            ctl = [r for r in watch.stop() if any("TrainController" in t for t in r["titles"])]
            alive = sum(r["last"] - r["start"] for r in ctl)
            frac = sum(r["cpu"] for r in ctl) / alive if alive else float("nan")
            rows.append((n, poll, local, worker, frac))
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
    ap.add_argument("--timeline", action="store_true", help="where a 1-epoch trial's time goes")
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
    if args.timeline:
        _timeline(storage, reps)
        ray.shutdown()
        print(f"ray.init: {ray_init:.1f} s; load average after: {os.getloadavg()[0]:.1f}")
        return
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
