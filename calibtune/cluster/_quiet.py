"""Ray's, Tune's, MLflow's and Optuna's console output kept to what a user of `calibtune run` needs:
`quiet_output` (the default terminal) and `clear_line` (erase the live status line before
another line is printed)."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

from calibtune._raysettings import QUIET_ENV

__all__ = ["clear_line", "quiet_output"]

_CLEAR = "\r\x1b[K"


def quiet_output() -> None:
    """The default terminal of `calibtune run`: Tune's legacy reporter at verbose=0 (the new
    one prints its configuration box and a TensorBoard hint at every verbosity), no
    token-auth notice (Ray logs it when RAY_AUTH_MODE is unset; the mode itself is unchanged),
    no INFO lines from Ray, MLflow (store migrations; MLflow re-applies its level on import, so
    also ``MLFLOW_LOGGING_LEVEL``, which Ray's local workers inherit) or Optuna (study
    created), no MLflow progress bars (`QUIET_ENV`), no "Failed to fetch metrics" from Tune's
    analysis of a restored study (it reads Tune's own result files of trials that never
    started; the study's results are MLflow's), no Optuna "step=N is already reported"
    (a retried trial reports its epochs again; Optuna keeps the first value, as calibtune's
    MLflow curve does) nor OptunaSearch's "additional result … already finished" with its
    whole result (`_AlreadyFinished`; Tune replays them on ``resume``); once Ray is imported,
    the cluster's error reports one line each (`_one_line_ray_errors`)."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore", message=r".*`step=\d+` is already reported")
    searcher = logging.getLogger("ray.tune.search.optuna.optuna_search")
    if not any(isinstance(f, _AlreadyFinished) for f in searcher.filters):
        searcher.addFilter(_AlreadyFinished())
    _one_line_ray_errors()


class _AlreadyFinished(logging.Filter):
    """Drops OptunaSearch's "Received additional result for trial …, but it already finished.
    Result: {…}" (the whole result dict, once per late result): on `resume` Tune replays the
    results of trials the searcher already completed; Optuna keeps what it had."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Received additional result for trial")


def _one_line_ray_errors() -> None:
    """Once Ray is imported: each error the cluster publishes to the driver (a raylet's crash
    dump, a worker or node that died) becomes one ``[calibtune] Ray: <its first line>`` on
    stderr instead of Ray's multi-line ``(raylet)`` block, which the driver prints whatever
    ``log_to_driver`` says (``ray._private.worker.listen_error_messages`` calls the module's
    ``print_to_stdstream``; worker logs, when forwarded, keep their own handler)."""
    worker = sys.modules.get("ray._private.worker")
    if worker is None or getattr(worker.print_to_stdstream, "calibtune_quiet", False):
        return
    ray_print = worker.print_to_stdstream

    def one_line(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") != "raylet":
            ray_print(data, ignore_prefix)
            return
        for message in data.get("lines", []):
            first = next((ln.strip() for ln in str(message).splitlines() if ln.strip()), "")
            if first:
                clear_line()
                print(f"[calibtune] Ray: {first[:300]}", file=sys.stderr, flush=True)

    one_line.calibtune_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = one_line
    for name, level in (
        ("ray._private.authentication.authentication_token_setup", logging.ERROR),
        ("ray", logging.WARNING),
        ("ray.tune.analysis.experiment_analysis", logging.ERROR),
        ("mlflow", logging.WARNING),
        ("optuna", logging.WARNING),
    ):
        logging.getLogger(name).setLevel(level)


def clear_line() -> None:
    """Erase the live line before another line is printed (no-op off a TTY)."""
    if sys.stdout.isatty():
        sys.stdout.write(_CLEAR)
