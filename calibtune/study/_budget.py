"""``search.time_budget``: a study session (one `run` or `resume`) starts no trial after this many
seconds; the trials still running are checkpointed and the study stops with its state saved,
resumable, the way Ctrl-C stops it (Tune's graceful stop).

Why not Tune's own ``TuneConfig(time_budget_s=...)``: its `TimeoutStopper` ends the running
trials as TERMINATED (never resumed: their epochs are lost) and marks the searcher finished, so
the trials it did not start could never run from the same state. Stopping gracefully at the
budget instead keeps both: `calibtune resume` finishes the checkpointed trials and starts the
rest, with a fresh budget per session.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["budget_callbacks", "budget_message", "budget_note"]

_SPENT: dict[str, float] = {}  # storage folder -> the budget that stopped its study (driver)


def _record(storage: Path, budget: float) -> None:
    # a function, not the dict, in the callback's closure: Tune pickles its callbacks
    _SPENT[str(storage)] = budget


def budget_message(storage: Path) -> float | None:
    """The budget (seconds) that stopped the study in ``storage`` in this process, if one did;
    read once (a later session of the same study starts without it)."""
    return _SPENT.pop(str(storage), None)


def budget_note(name: str, budget: float, not_run: int, total: int, storage: Path) -> str:
    """The one line a budget-stopped study ends with: what was not run and how to run it.

    >>> budget_note("s", 60.0, 3, 8, Path("d"))  # doctest: +ELLIPSIS
    'study s: time budget of 60 s spent: 3 of 8 trials not run yet ...`calibtune resume d`'
    """
    return (
        f"study {name}: time budget of {budget:g} s spent: {not_run} of {total} trials not run "
        f"yet (running ones checkpointed); run them with `calibtune resume {storage}`"
    )


def budget_callbacks(
    budget: float | None, storage: Path, clock: Callable[[], float] = time.monotonic
) -> list[Any]:
    """The Tune callback that enforces ``budget`` seconds from the start of each ``Tuner.fit``
    (none without a budget). Built on call: importing this module does not import Ray."""
    if budget is None:
        return []
    from ray.tune import Callback

    class TimeBudget(Callback):
        """Tune's graceful stop (SIGUSR1, state saved) once ``budget`` seconds have passed."""

        def __init__(self) -> None:
            self.start: float | None = None
            self.spent = False

        def setup(self, **info: Any) -> None:  # type: ignore[override]
            # every session (a resumed one runs the unpickled callback) gets the whole budget
            self.start, self.spent = clock(), False

        def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:  # type: ignore[override]
            if self.spent or self.start is None or clock() - self.start < budget:
                return
            self.spent = True
            _record(storage, budget)
            os.kill(os.getpid(), signal.SIGUSR1)

    return [TimeBudget()]
