"""The terminal display of a running study: one live status line (trials done/running/failed of
N, best so far, elapsed, ETA), rewritten in place with a carriage return when stdout is a TTY
and not shown otherwise (logs and pipes get only the per-trial lines of `_progress`).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibtune.cluster import clear_line, slot_usage

__all__ = [
    "Counts",
    "EpochLines",
    "SlotReading",
    "live_display",
    "slots_text",
    "status_line",
    "study_slots",
    "train_progress",
]

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


def status_line(
    c: Counts,
    metric: str,
    best: float | None,
    elapsed: float,
    slots: tuple[int, int] | None = None,
) -> str:
    """``trials 3 done, 2 running, 0 failed of 8 | slots 4/4 | best val/ece 0.0213 | 1:05
    elapsed, ETA 1:44`` (``slots`` used/available: `SlotReading`; left out when unknown).

    ETA = elapsed / ended x (N - ended): the mean time per ended trial so far, as trials run
    with the same concurrency; unknown ("?") until one trial has ended.

    >>> status_line(Counts(1, 2, 0, 4), "val/ece", None, 30.0, (2, 2))[:56]
    'trials 1 done, 2 running, 0 failed of 4 | slots 2/2 | be'
    """
    ended = c.done + c.failed
    eta = "?" if ended == 0 else _clock(elapsed / ended * max(c.total - ended, 0))
    shown = "n/a" if best is None else f"{best:.4f}"
    return (
        f"trials {c.done} done, {c.running} running, {c.failed} failed of {c.total} | "
        f"{slots_text(slots)}best {metric} {shown} | {_clock(elapsed)} elapsed, ETA {eta}"
    )


def slots_text(slots: tuple[int, int] | None) -> str:
    """``"slots 3/4 | "`` for 3 of 4 slots in use; ``""`` when unknown."""
    return "" if slots is None else f"slots {slots[0]}/{slots[1]} | "


class SlotReading:
    """The cluster's slots in use and available (``read()``, e.g.
    `calibtune.cluster._concurrency.slot_usage`: two reads of the cluster's state), re-read at
    most every ``every_s`` seconds however often a line is drawn; ``None`` while unreadable."""

    def __init__(
        self,
        read: Any,
        every_s: float = 5.0,
        clock: Any = time.monotonic,
    ) -> None:
        self.read, self.every_s, self.clock = read, every_s, clock
        self.at: float | None = None
        self.value: tuple[int, int] | None = None

    def __call__(self) -> tuple[int, int] | None:
        now = self.clock()
        # a reading unpickled from another process (Tune's state on `resume`) is re-read
        if self.at is None or not 0 <= now - self.at < self.every_s:
            self.at = now
            try:
                self.value = tuple(self.read())  # type: ignore[assignment]
            except Exception:  # Ray gone or not yet up: the line goes on without it
                self.value = None
        return self.value


def study_slots(study: Any) -> SlotReading:
    """A `SlotReading` of ``study``'s slots on the connected Ray cluster."""

    def read() -> tuple[int, int]:
        return slot_usage(study)

    return SlotReading(read)


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
            if getattr(self, "slots", None) is None:  # set on first use
                self.slots = study_slots(study)
            line = status_line(c, objective.metric, best, now - self.start, self.slots())
            sys.stdout.write(_CLEAR + line)
            sys.stdout.flush()

        def on_experiment_end(self, trials, **info):  # type: ignore[override]
            clear_line()

    return LiveDisplay()


class EpochLines:
    """`calibtune train`'s progress: one line per epoch (a `calibtune.trial.TrialCallback`; it
    runs on rank 0). Printed where it runs, or with ``relay`` appended to that file instead
    (`train_progress` prints it from the driver)."""

    KEYS = ("train/loss", "val/error", "val/ece")

    def __init__(self, epochs: int, relay: str | None = None) -> None:
        self.epochs = epochs
        self.relay = relay

    def on_epoch(self, epoch: int, metrics: Any) -> None:
        shown = " | ".join(
            f"{k} {metrics[k]:.4f}" for k in self.KEYS if isinstance(metrics.get(k), (int, float))
        )
        took = metrics.get("epoch_time")
        tail = f" | {took:.1f} s" if isinstance(took, (int, float)) else ""
        line = f"[calibtune] epoch {epoch}/{self.epochs}: {shown}{tail}\n"
        if self.relay is None:
            print(line, end="", flush=True)
        else:
            with open(self.relay, "a", encoding="utf-8") as f:
                f.write(line)  # one write per line: the reader sees whole lines

    def on_trial_end(self, metrics: Any, artifacts_dir: Any) -> None:
        pass


@contextlib.contextmanager
def train_progress(epochs: int, relay: bool) -> Iterator[EpochLines]:
    """The `EpochLines` of `calibtune train`. With ``relay`` (Train workers on this machine whose
    output Ray does not forward, so none of Ray Train's own lines or worker prefixes show), rank
    0 appends its lines to a temporary file that a thread of this process prints from."""
    if not relay:
        yield EpochLines(epochs)
        return
    with tempfile.TemporaryDirectory(prefix="calibtune-epochs-") as tmp:
        path = Path(tmp) / "epochs.txt"
        path.touch()
        stop = threading.Event()
        thread = threading.Thread(target=_pump, args=(path, stop), daemon=True)
        thread.start()
        try:
            yield EpochLines(epochs, str(path))
        finally:
            stop.set()
            thread.join(timeout=10)


def _pump(path: Path, stop: threading.Event) -> None:
    """Print whole lines appended to ``path`` until ``stop`` is set and the file is read."""
    with open(path, encoding="utf-8") as f:
        while True:
            pos = f.tell()
            line = f.readline()
            if line.endswith("\n"):
                print(line, end="", flush=True)
                continue
            f.seek(pos)  # nothing new, or a line still being written
            if stop.is_set():
                return
            time.sleep(0.2)
