"""The terminal display of a running study: one live status line (trials done/running/failed of
N, best so far, elapsed, ETA), rewritten in place with a carriage return when stdout is a TTY
and not shown otherwise (logs and pipes get only the per-trial lines of `_progress`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

# Lazy: Ray Tune's Callback base class, only when a study builds its Tune callback, so that the
# CLI imports this module (progress lines, quiet output) without Ray (bench/bench_cli.py).

__all__ = ["Counts", "EpochLines", "clear_line", "live_display", "quiet_output", "status_line"]

_CLEAR = "\r\x1b[K"


@dataclass(frozen=True)
class Counts:
    done: int
    running: int
    failed: int
    total: int


def _clock(seconds: float) -> str:
    s = round(seconds)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def status_line(c: Counts, metric: str, best: float | None, elapsed: float) -> str:
    """``trials 3 done, 2 running, 0 failed of 8 | best val/ece 0.0213 | 1:05 elapsed, ETA 1:44``.

    ETA = elapsed / ended x (N - ended): the mean time per ended trial so far, as trials run
    with the same concurrency; unknown ("?") until one trial has ended."""
    ended = c.done + c.failed
    eta = "?" if ended == 0 else _clock(elapsed / ended * max(c.total - ended, 0))
    shown = "n/a" if best is None else f"{best:.4f}"
    return (
        f"trials {c.done} done, {c.running} running, {c.failed} failed of {c.total} | "
        f"best {metric} {shown} | {_clock(elapsed)} elapsed, ETA {eta}"
    )


def quiet_output() -> None:
    """The default terminal of `calibtune run`: Tune's legacy reporter at verbose=0 (the new
    one prints its configuration box and a TensorBoard hint at every verbosity), no
    token-auth notice (Ray logs it when RAY_AUTH_MODE is unset; the mode itself is unchanged),
    no INFO lines from Ray, MLflow (store migrations) or Optuna (study created)."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    for name, level in (
        ("ray._private.authentication.authentication_token_setup", logging.ERROR),
        ("ray", logging.WARNING),
        ("mlflow", logging.WARNING),
        ("optuna", logging.WARNING),
    ):
        logging.getLogger(name).setLevel(level)


def clear_line() -> None:
    """Erase the live line before another line is printed (no-op off a TTY)."""
    if sys.stdout.isatty():
        sys.stdout.write(_CLEAR)


def _counts(trials: list[Any], total: int) -> Counts:
    status = [t.status for t in trials]
    return Counts(
        done=status.count("TERMINATED"),
        running=status.count("RUNNING"),
        failed=status.count("ERROR"),
        total=total,
    )


def _best(trials: list[Any], metric: str, mode: str) -> float | None:
    values = [
        float(v)
        for t in trials
        if t.status == "TERMINATED"
        for v in [(t.last_result or {}).get(metric)]
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    if not values:
        return None
    return min(values) if mode == "min" else max(values)


def live_display(study: Any) -> Any:
    """A Tune callback that redraws the status line at most once a second on a TTY (the class
    is built on call: importing this module does not import Ray)."""
    from ray.tune import Callback

    objective = study.search.objectives[0]

    class LiveDisplay(Callback):
        def __init__(self) -> None:
            self.start = time.monotonic()
            self.last = 0.0
            self.tty = sys.stdout.isatty()

        def on_step_end(self, iteration, trials, **info):  # type: ignore[override]
            now = time.monotonic()
            if not self.tty or now - self.last < 1.0:
                return
            self.last = now
            c = _counts(trials, study.search.num_samples)
            best = _best(trials, objective.metric, objective.mode)
            sys.stdout.write(_CLEAR + status_line(c, objective.metric, best, now - self.start))
            sys.stdout.flush()

        def on_experiment_end(self, trials, **info):  # type: ignore[override]
            clear_line()

    return LiveDisplay()


class EpochLines:
    """`calibtune train`'s progress: one line per epoch (a `calibtune.trial.TrialCallback`; it
    runs on rank 0, so with workers Ray forwards the line with the worker's prefix)."""

    KEYS = ("train/loss", "val/error", "val/ece")

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_epoch(self, epoch: int, metrics: Any) -> None:
        shown = " | ".join(
            f"{k} {metrics[k]:.4f}" for k in self.KEYS if isinstance(metrics.get(k), (int, float))
        )
        took = metrics.get("epoch_time")
        tail = f" | {took:.1f} s" if isinstance(took, (int, float)) else ""
        print(f"[calibtune] epoch {epoch}/{self.epochs}: {shown}{tail}", flush=True)

    def on_trial_end(self, metrics: Any, artifacts_dir: Any) -> None:
        pass
