"""Ray Jobs for studies: the dashboard address, the job client, submission and following.

`calibtune submit` runs ``calibtune run`` on the cluster as a Ray Job with the project as working
directory and the study (search spaces inlined) in an environment variable.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from calibtune.study._preflight import check_address
from calibtune.study._raycluster import client_token_auth

# Lazy: Ray's job client is imported by the cluster subcommands alone (submit, status, logs),
# so that `calibtune --help` does not import Ray (bench/bench_cli.py).

__all__ = ["JOB_EXCLUDES", "follow", "job_client", "project_root", "ray_address", "submit_job"]

# Left out of the job's working directory (gitignore patterns, as Ray reads them). Anchored with
# "/": a bare "data" also matches the package calibtune/data, which the job then cannot import.
JOB_EXCLUDES = ("/.venv", "/runs", "/mlflow.db", "/.git", "/exported", "*.pt", "/data")

# the head's job agent starts a few seconds after its dashboard answers
_AGENT_WAIT_S = 60.0


def ray_address(address: str | None) -> str:
    """The dashboard address (--address, else $RAY_API_SERVER_ADDRESS or $RAY_ADDRESS), checked
    to accept a TCP connection within 5 s (the job client would retry for minutes)."""

    key, addr = "--address", address
    for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        if not addr and os.environ.get(var):
            key, addr = f"${var}", os.environ[var]
    if not addr:
        raise ValueError(
            "--address: expected the Ray dashboard address (http://HEAD:8265), got none"
        )
    if addr != "auto":
        check_address(addr, key, "a Ray dashboard", default_port=8265)

    client_token_auth()
    return addr


def job_client(address: str | None) -> Any:
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:  # pragma: no cover - ray[default] is in the test extras
        raise ValueError(
            "submit: expected ray[default] (pip install 'calibtune[cluster]')"
        ) from None
    return JobSubmissionClient(ray_address(address))


def project_root(study_path: Path) -> Path:
    """The directory with pyproject.toml above the study (else the working directory)."""
    for d in [study_path.resolve().parent, *study_path.resolve().parents]:
        if (d / "pyproject.toml").exists() and (d / "calibtune").is_dir():
            return d
    return Path.cwd().resolve()


def follow(client: Any, job_id: str) -> int:
    from ray.job_submission import JobStatus

    while True:
        status = client.get_job_status(job_id)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            print(client.get_job_logs(job_id), end="")
            print(f"job {job_id}: {status}")
            return 0 if status == JobStatus.SUCCEEDED else 1
        time.sleep(2)


def submit_job(client: Any, **job: Any) -> str:
    """``client.submit_job(**job)``, retried while the head answers that its job agent is not
    up yet (a freshly started cluster), for at most `_AGENT_WAIT_S`."""
    deadline = time.monotonic() + _AGENT_WAIT_S
    while True:
        try:
            return str(client.submit_job(**job))
        except RuntimeError as exc:
            if "No available agent" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(2)
