"""A failed trial says where: one line for the user, the full traceback in its artifacts.

The one line names the error, calibtune's innermost frame (file:line, function) and where the
training loop was (`calibtune.training.Progress`: epoch and step, or the phase); the traceback
goes to ``<trial>/artifacts/error.txt`` (other ranks: ``error_rank<r>.txt``) and, through each
callback's ``on_trial_error``, to the trial's MLflow run.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibtune._io import atomic_write
from calibtune.training import NonFiniteLossError, Progress

__all__ = ["TrialStepError", "failure", "innermost_frame"]

_PACKAGE = Path(__file__).resolve().parent.parent  # .../calibtune


class TrialStepError(RuntimeError):
    """An unexpected error inside a trial, re-raised with the place it happened."""


def innermost_frame(exc: BaseException) -> str | None:
    """``calibtune/<module>.py:<line> in <function>`` of the deepest calibtune frame of
    ``exc``'s traceback (None when no frame is calibtune's).

    >>> try:
    ...     innermost_frame(None)  # type: ignore[arg-type]
    ... except AttributeError as e:
    ...     innermost_frame(e).startswith("calibtune/trial/_errors.py:")
    True
    """
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(_PACKAGE):
            rel = path.relative_to(_PACKAGE.parent).as_posix()
            return f"{rel}:{frame.lineno} in {frame.name}"
    return None


def _one_line(exc: BaseException, progress: Progress) -> str:
    lines = str(exc).strip().splitlines()
    where = innermost_frame(exc)
    at = f"at {where}; " if where else ""
    return f"{type(exc).__name__}: {lines[0] if lines else ''} ({at}{progress.where()})"


def failure(
    exc: BaseException,
    progress: Progress,
    trial_dir: Path,
    rank: int,
    callbacks: Sequence[Any],
) -> BaseException:
    """Record ``exc`` (traceback file, callbacks) and return what the trial raises: ``exc``
    itself for bad input and divergence (their messages already say what and where, and the
    driver tells them apart by type), else a `TrialStepError` with the one-line reason."""
    known = isinstance(exc, ValueError | NonFiniteLossError)
    reason = str(exc).strip() if known else _one_line(exc, progress)
    text = f"{reason}\n\n" + "".join(traceback.format_exception(exc))
    name = "error.txt" if rank == 0 else f"error_rank{rank}.txt"
    try:
        (trial_dir / "artifacts").mkdir(parents=True, exist_ok=True)
        atomic_write(trial_dir / "artifacts" / name, text)
    except OSError:
        pass  # a full or read-only disk must not hide the original error
    for cb in callbacks:
        if hasattr(cb, "on_trial_error"):
            # the trial's own error is what the user needs, not a logging one
            with contextlib.suppress(Exception):
                cb.on_trial_error(reason, text)
    return exc if known else TrialStepError(reason)
