"""The dashboards' processes (MLflow UI, optuna-dashboard): started on 127.0.0.1 on a free (or a
given, checked) port, returned once they answer."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from calibtune.record import EXPERIMENT_TAGS

# Lazy: MLflow's client only in `ui_lines`, which runs once the UI server is up, so that
# `calibtune ui` starts the server without first importing MLflow in this process.

__all__ = [
    "check_port_free",
    "free_port",
    "runs_url",
    "start_dashboard",
    "start_ui",
    "stop_ui",
    "ui_lines",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_ui(uri: str, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``mlflow ui`` on 127.0.0.1 (a free port by default); return it once it answers."""
    port = port or free_port()
    argv = [_bin("mlflow"), "ui", "--backend-store-uri", uri]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    return _start(argv, env, f"http://127.0.0.1:{port}", "/health", "mlflow ui")


def start_dashboard(storage: str, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start ``optuna-dashboard`` on the Optuna RDB ``storage`` bound to 127.0.0.1 (a free port
    by default); return it once its API answers (``GET /api/studies``)."""
    port = port or free_port()
    argv = [_bin("optuna-dashboard"), storage, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--server", "wsgiref", "--quiet"]
    return _start(
        argv, dict(os.environ), f"http://127.0.0.1:{port}", "/api/studies", "optuna-dashboard"
    )


def runs_url(base: str, experiment_id: str) -> str:
    """The experiment's training-runs table. MLflow 3.17 opens an experiment on its GenAI pages
    unless the browser chose "Model training" before or the URL carries ``workflowType`` (the
    ``mlflow.experimentKind`` tag does not decide it); checked in Chromium against 3.17.2."""
    return f"{base}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def ui_lines(uri: str, base: str) -> list[str]:
    """What `calibtune ui` prints: the UI's URL, then each calibtune experiment of the store
    (tagged ``mlflow.experimentKind=custom_model_development``, newest first) with the URL that
    opens on its runs."""
    from mlflow.tracking import MlflowClient

    kind = "mlflow.experimentKind"
    exps = MlflowClient(uri).search_experiments(
        filter_string=f"tags.`{kind}` = '{EXPERIMENT_TAGS[kind]}'",
        order_by=["creation_time DESC"],
    )
    lines = [f"MLflow UI for {uri}: {base}   (Ctrl-C to stop)"]
    lines += [f"  {e.name}: {runs_url(base, e.experiment_id)}" for e in exps]
    return lines


def _bin(name: str) -> str:
    """The console script next to this interpreter (the venv's), else from PATH."""
    return shutil.which(name, path=str(Path(sys.executable).parent)) or name


def _start(
    argv: list[str], env: dict[str, str], url: str, health: str, what: str
) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}: {err.strip()[-500:]}")
        try:
            with urllib.request.urlopen(url + health, timeout=2) as r:
                # an answer while our server has exited came from another one on this port
                if r.status == 200 and proc.poll() is None:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    stop_ui(proc)
    raise RuntimeError(f"{what} did not answer on {url} within 60 s")


def stop_ui(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def check_port_free(port: int, key: str = "--port") -> None:
    """Fail unless 127.0.0.1:port can be bound now: a port another server (perhaps another
    store's MLflow UI) holds would make us print a URL that serves something else."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            why = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc)).lower()
            raise ValueError(f"{key}: expected a free port, got {port} ({why})") from None
