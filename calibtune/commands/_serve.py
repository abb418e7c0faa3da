"""`calibtune ui` and `calibtune dashboard`: the MLflow UI or optuna-dashboard served on
127.0.0.1 until Ctrl-C (or SIGTERM/SIGHUP).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibtune._usage import usage
from calibtune.cluster import check_tracking_uri
from calibtune.readers import check_port_free, start_dashboard, start_ui, stop_ui, ui_lines
from calibtune.record import optuna_storage_url, resolve_tracking_uri
from calibtune.studyfile import StudyDir, load_study

__all__ = ["dashboard", "ui"]


def ui(args: argparse.Namespace) -> int:
    with usage():
        uri = resolve_tracking_uri(args.tracking_uri)
        key = "--tracking-uri" if args.tracking_uri else "tracking store (default ./mlflow.db)"
        if uri.startswith(("http://", "https://")):
            raise ValueError(
                f"{key}: expected a store to serve (sqlite:///PATH, a database URL or a folder), "
                f"got the server {uri} (open it in a browser)"
            )
        check_tracking_uri(uri, key, must_exist=True)
        if args.port is not None:
            check_port_free(args.port)

    return _serve("ui", lambda url: ui_lines(uri, url), lambda: start_ui(uri, args.port))


def dashboard(args: argparse.Namespace) -> int:
    with usage():
        p = Path(args.study)
        if p.is_file() and p.suffix in (".yaml", ".yml"):
            cfg = load_study(p)
            sd = StudyDir.find(cfg.name, args.storage or cfg.storage)
        else:
            sd = StudyDir.find(args.study, args.storage)
        storage = optuna_storage_url(sd.read_study(), sd)
        if storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///") :]).is_file():
            raise ValueError(
                f"{args.study}: expected the study's Optuna storage {storage}, found none yet "
                "(it is written when a trial ends)"
            )
        if args.port is not None:
            check_port_free(args.port)
    return _serve(
        "dashboard",
        lambda url: [f"optuna-dashboard for {storage}: {url}   (Ctrl-C to stop)"],
        lambda: start_dashboard(storage, args.port),
    )


def _serve(
    command: str, lines: Callable[[str], list[str]], start: Callable[[], tuple[Any, str]]
) -> int:
    """Start a server process (``start() -> (process, URL)``), print ``lines(URL)`` and wait
    for it; Ctrl-C stops it. Exit code 1, with the reason, when it does not come up."""
    try:
        proc, url = start()
    except RuntimeError as exc:
        print(f"calibtune {command}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
        return 1
    try:
        with _stop_signals_interrupt():  # before the URL is out: a reader may stop us at once
            print("\n".join(lines(url)), flush=True)
            proc.wait()
    except KeyboardInterrupt:
        stop_ui(proc)
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _stop_signals_interrupt() -> Any:
    """SIGTERM and SIGHUP stop the server like Ctrl-C: it runs in its own session (so that a
    Ctrl-C reaches only us), and would otherwise outlive a `kill` of this command or a closed
    terminal."""
    if threading.current_thread() is not threading.main_thread():  # no handlers off the main one
        yield
        return
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
