"""Ray Jobs for studies: what a submission sends, its checks, the job client and following.

`calibtune submit` runs ``python -m calibtune run`` on the cluster as a Ray Job: the node's own
``python`` (a ``runtime_env`` with ``pip``/``uv`` or an ``image_uri`` puts its interpreter first
on the job's ``PATH``; the submitting machine's interpreter path means nothing there), the study
(search spaces inlined) in an environment variable, the project's source as working directory.
`job_spec` is the one description of a job: `calibtune submit` sends it and the recipes under
``deploy/`` are generated from it (`calibtune.cluster._deploy`).

The environment a job gets from the submitting shell is an allow-list (`FORWARDED_NAMES`,
`FORWARDED_PREFIXES`: endpoints, regions, MLflow client settings, Ray Train's and calibtune's
own), never a credential: Ray returns a job's ``runtime_env`` to anyone with job-API access, so
a secret travels only when the user names it (``--env NAME``); nodes otherwise get credentials
their own way (a Kubernetes Secret, IRSA, workload identity, an instance role, the environment
``ray start`` ran in). A submission carries a ``submission_id`` made once per `submit_job`, so a
retried request cannot start a second driver.

Checked here, before the cluster is contacted (one line each, exit 2): storage and tracking URIs
that would land on the submitting machine's disk, ``--env`` names not set here, relative data
roots (``--data-root DIR`` replaces the study's; with ``--fetch`` the job fetches the sets the
study reads there before the first trial), a ``--runtime-env`` file that is not a Ray
``runtime_env``, and a working directory over Ray's upload limit.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import shlex
import tempfile
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from calibtune import data as D
from calibtune._raysettings import QUIET_ENV
from calibtune._yaml import load_text
from calibtune.cluster._preflight import check_address, preflight_submit
from calibtune.cluster._raycluster import client_token_auth
from calibtune.record import resolve_tracking_uri
from calibtune.storage import check_location
from calibtune.studyfile import self_contained

# Ray's job client is imported where a cluster is reached: building a submission (and the deploy
# recipes, `calibtune.cluster._deploy`) needs no Ray.

__all__ = [
    "FORWARDED_NAMES",
    "FORWARDED_PREFIXES",
    "JOB_EXCLUDES",
    "check_data_roots",
    "check_job_uris",
    "check_upload_size",
    "fetch_command",
    "follow",
    "forwarded_env",
    "job_client",
    "job_excludes",
    "job_output",
    "job_spec",
    "load_runtime_env",
    "new_submission_id",
    "project_root",
    "ray_address",
    "submission",
    "submit_job",
    "with_data_root",
]

# Left out of the job's working directory besides the project's .gitignore (gitignore patterns,
# as Ray reads them): what a run on the cluster never reads (tests, docs, benchmarks, the
# submitting machine's results). Anchored with "/": a bare "data" also matches the package
# calibtune/data, which the job then cannot import.
JOB_EXCLUDES = (
    "/.venv",
    "/runs",
    "/mlflow.db",
    "/mlruns",
    "/.git",
    "/exported",
    "*.pt",
    "/data",
    "/tests",
    "/docs",
    "/bench",
    "/results",
    "/deploy",
)

#: the variables a job gets from the submitting shell when set there (a job inherits none):
#: where the stores are and how to talk to them, never who the job is. Not among them, on
#: purpose: credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
#: MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN) and this machine's own files and identity
#: (AWS_PROFILE, AWS_CA_BUNDLE, AWS_CONFIG_FILE, AWS_SHARED_CREDENTIALS_FILE, AWS_ROLE_ARN,
#: AWS_WEB_IDENTITY_TOKEN_FILE), which would override the nodes' own roles; `--env NAME` sends
#: one by name
FORWARDED_NAMES = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_REQUEST_CHECKSUM_CALCULATION",  # botocore >= 1.36 against S3-compatible servers
    "AWS_RESPONSE_CHECKSUM_VALIDATION",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_S3_ENDPOINT_URL",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR",
)
#: prefixes forwarded whole: Ray Train's settings and calibtune's own (none is a credential)
FORWARDED_PREFIXES = ("RAY_TRAIN_", "CALIBTUNE_")

STUDY_ENV = "CALIBTUNE_STUDY_YAML"

#: ``runtime_env`` keys a ``--runtime-env`` file may set (Ray's own names); ``working_dir`` is
#: calibtune's (the project), its ``excludes`` are added to calibtune's
RUNTIME_ENV_KEYS = (
    "pip",
    "uv",
    "conda",
    "image_uri",
    "env_vars",
    "py_modules",
    "py_executable",
    "excludes",
    "config",
)

# the head's job agent starts a few seconds after its dashboard answers; a request the head or
# a proxy in front of it dropped is sent again (same submission_id) within the same bound
_AGENT_WAIT_S = 60.0
_RETRY_S = 2.0
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Ray's limit on an uploaded package (ray._private.runtime_env.packaging: the gRPC message size,
# overridable with the same variable Ray reads)
_RAY_LIMIT_ENV = "RAY_max_grpc_message_size"
_RAY_LIMIT = 512 * 1024**2


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


def project_root(study_path: Path) -> Path | None:
    """The directory with pyproject.toml and the calibtune package above the study; None for a
    study outside a project (then nothing is uploaded: the nodes' calibtune runs it)."""
    for d in [study_path.resolve().parent, *study_path.resolve().parents]:
        if (d / "pyproject.toml").exists() and (d / "calibtune").is_dir():
            return d
    return None


# ------------------------------------------------------------------------------- checks


def _is_remote(value: str) -> bool:
    """A URI with a scheme other than a local file (``s3://``, ``gs://``, ``http://``, …)."""
    scheme = value.split("://", 1)[0] if "://" in value else ""
    return bool(scheme) and scheme not in ("file", "sqlite")


def check_job_uris(storage: str | None, tracking_uri: str | None) -> tuple[str, str]:
    """The storage and tracking URI a job runs with: given, and not resolving to the submitting
    machine's disk (its ``./runs/studies`` default, a relative path, the default
    ``sqlite:///<cwd>/mlflow.db``); an absolute path is taken as shared storage the nodes mount.

    >>> check_job_uris("s3://calib/studies", "http://mlflow:5000")
    ('s3://calib/studies', 'http://mlflow:5000')
    >>> check_job_uris(None, "http://mlflow:5000")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: --storage: expected storage every node of the cluster sees ... got none ...
    """
    if not storage:
        raise ValueError(
            _where("--storage", "none (the default ./runs/studies is this machine's disk)")
        )
    check_location(storage, "--storage")
    if not _is_remote(storage) and not Path(storage).expanduser().is_absolute():
        raise ValueError(
            _where("--storage", f"{storage!r}, a path relative to this machine's working directory")
        )
    if not tracking_uri:
        raise ValueError(
            "--tracking-uri: expected an MLflow server every node reaches (http://HOST:5000), "
            "got none (the default sqlite:///<cwd>/mlflow.db is this machine's disk)"
        )
    if not _is_remote(tracking_uri) and not _local_path(tracking_uri).startswith("/"):
        raise ValueError(
            "--tracking-uri: expected an MLflow server every node reaches (http://HOST:5000), "
            f"got {tracking_uri!r}, a path relative to this machine's working directory"
        )
    return storage, tracking_uri


def _local_path(uri: str) -> str:
    """The path of a local store URI (``sqlite:///rel.db`` is relative, ``sqlite:////abs.db``
    and ``file:///abs`` absolute)."""
    for prefix in ("sqlite:///", "file://"):
        if uri.startswith(prefix):
            return uri[len(prefix) :]
    return uri


def _where(key: str, got: str) -> str:
    return (
        f"{key}: expected storage every node of the cluster sees (s3://BUCKET/PREFIX, or an "
        f"absolute path on a shared mount), got {got}"
    )


def with_data_root(study: Any, root: str) -> Any:
    """The study with ``trial.data.root`` set to ``root`` (``--data-root``), in its text too:
    the submitted copy (`self_contained`) is made from the text."""
    raw = load_text(study.text, "study")
    raw["trial"]["data"] = {**(raw["trial"].get("data") or {}), "root": root}
    trial = {**study.trial, "data": {**(study.trial.get("data") or {}), "root": root}}
    text = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
    return dataclasses.replace(study, text=text, trial=trial)


def _sets_read(data: Mapping[str, Any]) -> list[str]:
    """The `calibtune data fetch` names a trial with this ``trial.data`` reads."""

    return D.sets_read_by(data.get("name", "digits"), data.get("ood"), data.get("shift"))


def check_data_roots(study: Any, *, fetch: bool = False, key: str | None = None) -> None:
    """A study whose dataset (or OOD/shift sets) read files must name them by an absolute
    ``trial.data.root``: a relative one (or the default ``./data``) resolves on each node
    against the job's working directory, where the submitting machine's files are not. The
    root is a path on the cluster: it need not exist here, with ``fetch`` nor without (the job's
    `calibtune run` checks the files there before the first trial). ``key``: where the root
    came from (default: the study's ``trial.data.root``).

    >>> from types import SimpleNamespace as S
    >>> check_data_roots(S(trial={"data": {"name": "cifar10", "root": "/shared/data"}}, path=None))
    >>> check_data_roots(S(trial={"data": {"name": "cifar10", "root": "data"}}, path=None))
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: trial.data.root: expected an absolute folder ... --data-root DIR --fetch ...
    """
    data = (study.trial or {}).get("data") or {}
    root = data.get("root")
    sets = _sets_read(data)
    if key is None:
        key = f"{study.path}: trial.data.root" if study.path else "trial.data.root"
    if root is not None and Path(str(root)).expanduser().is_absolute():
        return
    if root is None and not sets:
        return  # nothing read from files (digits, …): the default root is never opened
    held = ", ".join(sets) if sets else "the data"
    got = (
        "none (the default ./data is relative to the job's working directory)"
        if root is None
        else f"{root!r} (relative to the job's working directory on the cluster)"
    )
    fix = (
        f"; pass --data-root DIR --fetch to fetch them into DIR on the cluster before the first "
        f"trial, or fetch them there yourself (calibtune data fetch {' '.join(sets)} --root DIR) "
        "and pass --data-root DIR"
        if sets
        else "; pass --data-root DIR, an absolute folder every node sees"
    )
    if fetch:
        fix = "; with --fetch it is still a path on the cluster's nodes: pass --data-root /ABS/DIR"
    raise ValueError(
        f"{key}: expected an absolute folder that holds {held} on every node, got {got}{fix}"
    )


def fetch_command(study: Any, mirror: str | None = None) -> list[str]:
    """The `calibtune data fetch` command line (`calibtune.data.fetch_argv`) that gets every set
    ``study`` reads into its (absolute) data root; empty when it reads no files.

    >>> from types import SimpleNamespace as S
    >>> data = {"name": "cifar10", "root": "/shared/data", "ood": ["svhn"], "shift": []}
    >>> fetch_command(S(trial={"data": data}))
    ['calibtune', 'data', 'fetch', 'cifar10', 'svhn', '--root', '/shared/data']
    """

    data = (study.trial or {}).get("data") or {}
    if mirror is not None and not mirror.startswith(("http://", "https://", "file://")):
        raise ValueError(f"--mirror: expected an http://, https:// or file:// URL, got {mirror!r}")
    return D.fetch_argv(
        data.get("name", "digits"),
        str(data.get("root")),
        data.get("ood"),
        data.get("shift"),
        mirror,
    )


def load_runtime_env(path: str | Path) -> dict[str, Any]:
    """A ``--runtime-env`` file (YAML or JSON): a mapping of Ray ``runtime_env`` keys
    (`RUNTIME_ENV_KEYS`), ``env_vars`` strings to strings."""
    key = f"--runtime-env {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(
            f"{key}: expected a readable YAML or JSON file, got {exc.strerror}"
        ) from None
    env = load_text(text, key)
    if not isinstance(env, dict) or not env:
        raise ValueError(f"{key}: expected a mapping of Ray runtime_env keys, got {env!r}")
    unknown = sorted(set(env) - set(RUNTIME_ENV_KEYS))
    if unknown:
        raise ValueError(
            f"{key}: expected keys among {', '.join(RUNTIME_ENV_KEYS)}, got {', '.join(unknown)}"
            + (" (calibtune sends the project as working_dir)" if "working_dir" in unknown else "")
        )
    variables = env.get("env_vars", {})
    if not isinstance(variables, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in variables.items()
    ):
        raise ValueError(
            f"{key}: env_vars: expected a mapping of names to strings, got {variables!r}"
        )
    if STUDY_ENV in variables:
        raise ValueError(f"{key}: env_vars: expected no {STUDY_ENV} (submit sets it), got one")
    if not isinstance(env.get("excludes", []), list):
        raise ValueError(f"{key}: excludes: expected a list of patterns, got {env['excludes']!r}")
    return env


def forwarded_env(
    environ: Mapping[str, str], names: tuple[str, ...] | list[str] = ()
) -> dict[str, str]:
    """The variables of ``environ`` a job gets: those of `FORWARDED_NAMES` and
    `FORWARDED_PREFIXES` that are set, and each of ``names`` (``--env NAME``, e.g. a secret the
    nodes have no other way to get), which must be set; `STUDY_ENV` never (the job's own).

    >>> forwarded_env({"AWS_ENDPOINT_URL_S3": "http://s3:9000", "AWS_SECRET_ACCESS_KEY": "k"})
    {'AWS_ENDPOINT_URL_S3': 'http://s3:9000'}
    >>> forwarded_env({"AWS_SECRET_ACCESS_KEY": "k"}, ["AWS_SECRET_ACCESS_KEY"])
    {'AWS_SECRET_ACCESS_KEY': 'k'}
    """
    for name in names:
        if not _ENV_NAME.fullmatch(name) or name == STUDY_ENV:
            raise ValueError(
                f"--env: expected the name of a variable set here (letters, digits, _; its "
                f"value is read from this shell), got {name!r}"
                + (" (submit sets it)" if name == STUDY_ENV else "")
            )
        if name not in environ:
            raise ValueError(f"--env {name}: expected a variable set in this shell, found none")
    return {
        k: v
        for k, v in sorted(environ.items())
        if k != STUDY_ENV
        and (k in FORWARDED_NAMES or k.startswith(FORWARDED_PREFIXES) or k in names)
    }


def job_excludes(root: Path, extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Ray ``excludes`` for the project at ``root``: `JOB_EXCLUDES`, the project's .gitignore
    (honoured explicitly: Ray skips it when ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE`` is set) and
    ``extra`` (a ``--runtime-env`` file's own)."""
    ignore = root / ".gitignore"
    lines = ignore.read_text(encoding="utf-8").splitlines() if ignore.is_file() else []
    patterns = [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]
    return list(dict.fromkeys([*JOB_EXCLUDES, *patterns, *extra]))


def _ray_limit() -> int:
    return int(os.environ.get(_RAY_LIMIT_ENV, _RAY_LIMIT))


def _package_files(root: Path, excludes: list[str]) -> list[Path]:
    """The files Ray would upload from ``root``: its own walk with these excludes (nested
    .gitignore and .rayignore files included)."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    files: list[Path] = []
    _dir_travel(
        root,
        [_get_excludes(root, excludes)],
        lambda p: files.append(p) if p.is_file() else None,
        include_gitignore=True,
    )
    return files


def check_upload_size(root: Path, excludes: list[str]) -> int:
    """Refuse a working directory whose package exceeds Ray's upload limit (Ray would fail after
    zipping it), naming its size and largest entries; return the files' total size in bytes.
    The files' sum bounds the zip from above; only past the limit is the package zipped to
    know its real size."""
    files = _package_files(root, excludes)
    sizes = {f: f.stat().st_size for f in files}
    total = sum(sizes.values())
    limit = _ray_limit()
    if total < limit or _zipped_size(root, files) < limit:
        return total
    top: dict[str, int] = {}
    for f, size in sizes.items():
        first = f.relative_to(root).parts[0]
        top[first] = top.get(first, 0) + size
    largest = sorted(top.items(), key=lambda kv: -kv[1])[:3]
    named = ", ".join(f"{name} {_mib(size)}" for name, size in largest)
    raise ValueError(
        f"{root}: expected a working directory under Ray's upload limit of {_mib(limit)}, got "
        f"{_mib(total)} in {len(files)} files (largest: {named}); add them to .gitignore or a "
        ".rayignore, or install the project on the nodes (--runtime-env with pip/image_uri)"
    )


def _zipped_size(root: Path, files: list[Path]) -> int:
    with tempfile.TemporaryFile() as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for f in files:
                z.write(f, f.relative_to(root))
        return tmp.tell()


def _mib(n: int) -> str:
    return f"{n / 1024**2:.1f} MiB"


# ------------------------------------------------------------------------------- the job


def job_spec(
    study_yaml: str,
    study_name: str,
    *,
    storage: str,
    tracking_uri: str,
    python: str = "python",
    root: Path | None = None,
    runtime_env: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    verbose: bool = False,
    fetch: list[str] | tuple[str, ...] = (),
    wait_for_resources: float | None = None,
) -> dict[str, Any]:
    """What a submission sends: ``entrypoint``, ``runtime_env`` and ``metadata`` (the keywords
    of ``JobSubmissionClient.submit_job``; a KubeRay ``RayJob``'s ``entrypoint`` and
    ``runtimeEnvYAML``). ``root``: the project uploaded as working directory (None: nothing);
    ``env``: variables forwarded by name (`forwarded_env`), under the ``--runtime-env`` file's
    own ``env_vars``. ``fetch``: the arguments of a ``calibtune data fetch`` (`fetch_command`
    without its ``calibtune``) the job runs on the cluster before the study, as ``sh -c
    'python -m calibtune data fetch … && python -m calibtune run …'``: one shell word, because
    a KubeRay submitter pastes the entrypoint into its own shell line (a bare ``&&`` would run
    the study in the submitter's pod). The fetch holds the data root's lock: one download per
    shared root however many jobs or nodes run it; the study starts only once it succeeded.

    >>> spec = job_spec("name: s", "s", storage="s3://b/p", tracking_uri="http://m:5000")
    >>> spec["entrypoint"].split(" --storage ")[1]
    's3://b/p --tracking-uri http://m:5000'
    >>> spec["runtime_env"]["env_vars"]["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"]
    'false'
    """
    argv = [python, "-m", "calibtune", "run", "--study-env", STUDY_ENV, "--address", "auto"]
    argv += ["--storage", storage, "--tracking-uri", tracking_uri]
    argv += ["--verbose"] if verbose else []
    if wait_for_resources is not None:  # the job's `calibtune run` waits
        argv += ["--wait-for-resources", f"{wait_for_resources:g}"]
    entrypoint = shlex.join(argv)
    if fetch:
        fetch_line = shlex.join([python, "-m", "calibtune", *fetch])
        entrypoint = shlex.join(["sh", "-c", f"{fetch_line} && {entrypoint}"])
    extra = dict(runtime_env or {})
    renv: dict[str, Any] = {k: v for k, v in extra.items() if k not in ("env_vars", "excludes")}
    if root is not None:
        renv["working_dir"] = str(root)
        renv["excludes"] = job_excludes(root, extra.get("excludes", ()))
    renv["env_vars"] = {
        **({} if verbose else QUIET_ENV),
        **dict(env or {}),
        **extra.get("env_vars", {}),
        STUDY_ENV: study_yaml,
    }
    return {
        "entrypoint": entrypoint,
        "runtime_env": renv,
        "metadata": {"calibtune.study": study_name},
    }


# Ray's job manager writes its own lines at the head of a job's log: its log format
# (``2026-01-01 12:00:00,123\tINFO job_manager.py:581 -- Runtime env is setting up.``) and the
# entrypoint it runs
_RAY_JOB_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d [\d:,.]+\s+[A-Z]+ \S+\.py:\d+ -- |^Running entrypoint for job "
)


def job_output(logs: str, verbose: bool = False) -> str:
    r"""A job's log as the terminal shows it: without Ray's job-manager lines unless verbose.

    >>> ray_line = "2026-11-27 18:23:52,336\tINFO job_manager.py:581 -- Runtime env is set up."
    >>> job_output(ray_line + "\n[calibtune] x\n")
    '[calibtune] x\n'
    """
    if verbose:
        return logs
    return "".join(ln for ln in logs.splitlines(keepends=True) if not _RAY_JOB_LINE.match(ln))


def follow(client: Any, job_id: str, verbose: bool = False) -> int:
    """Wait for the job; print its logs (`job_output`) and its end. The exit code: 0 succeeded,
    the driver's own code where Ray knows it (2: the study was refused on the cluster), else 1."""
    from ray.job_submission import JobStatus

    while True:
        status = client.get_job_status(job_id)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            print(job_output(client.get_job_logs(job_id), verbose), end="")
            print(f"job {job_id}: {status}")
            if status == JobStatus.SUCCEEDED:
                return 0
            code = getattr(client.get_job_info(job_id), "driver_exit_code", None)
            return code if code == 2 else 1
        time.sleep(2)


def new_submission_id(study_name: str) -> str:
    """A job id no other submission has: the study's name and 64 random bits.

    >>> new_submission_id("quickstart").startswith("calibtune-quickstart-")
    True
    """
    return f"calibtune-{study_name}-{secrets.token_hex(8)}"


def _transient(exc: Exception) -> bool:
    """Whether a failed ``submit_job`` request may have reached the head or may work again: its
    job agent not up yet, a dropped connection or read timeout, a proxy's 502/503/504."""
    import requests

    if isinstance(exc, (requests.ConnectionError, requests.Timeout, ConnectionError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "No available agent" in text or re.search(r"status code 50[234]\b", text) is not None
    )


def submit_job(client: Any, **job: Any) -> str:
    """``client.submit_job(**job)`` with one ``submission_id`` (`new_submission_id`, unless
    given) for all its attempts: a request that failed in a way that may be passing (`_transient`:
    the job agent not up yet on a fresh cluster, a connection dropped, a proxy's timeout) is sent
    again for at most `_AGENT_WAIT_S`, and a retry the head answers "already exists" means an
    earlier attempt started the job: its id is returned, no second driver starts. A later
    `submit_job` of the same study makes a new id, a new job."""
    study = str((job.get("metadata") or {}).get("calibtune.study", "study"))
    job = {**job, "submission_id": job.get("submission_id") or new_submission_id(study)}
    sid = job["submission_id"]
    deadline = time.monotonic() + _AGENT_WAIT_S
    retried = False
    while True:
        try:
            return str(client.submit_job(**job))
        except Exception as exc:
            if retried and isinstance(exc, RuntimeError) and f"{sid} already exists" in str(exc):
                return sid  # the earlier attempt reached the head
            if not _transient(exc) or time.monotonic() > deadline:
                raise
        retried = True
        time.sleep(_RETRY_S)


def submission(
    study: Any,
    *,
    storage: str | None,
    tracking_uri: str | None,
    python: str = "python",
    runtime_env_file: str | None = None,
    verbose: bool = False,
    data_root: str | None = None,
    fetch: bool = False,
    mirror: str | None = None,
    wait_for_resources: float | None = None,
    env_names: tuple[str, ...] | list[str] = (),
) -> dict[str, Any]:
    """`calibtune submit`'s checks, in order, then its `job_spec`: the storage and tracking URI
    (given, not this machine's disk; then `preflight_submit`), the variables ``env_names``
    (``--env``: set here; sent with `forwarded_env`'s allow-list), the data roots (``data_root``
    replaces the study's; with ``fetch`` the job fetches the sets the study reads there first,
    from ``mirror`` if given), the ``--runtime-env`` file, the upload's size. Nothing is
    contacted or written but the stores' checks (`preflight_submit`)."""
    store, uri = check_job_uris(storage or study.storage, tracking_uri or study.tracking.uri)
    env = forwarded_env(os.environ, env_names)
    if mirror is not None and not fetch:
        raise ValueError(
            f"--mirror: expected --fetch with it (where the job fetches from), got {mirror!r} alone"
        )
    if data_root is not None:
        study = with_data_root(study, data_root)
    check_data_roots(study, fetch=fetch, key="--data-root" if data_root is not None else None)
    fetch_argv = fetch_command(study, mirror) if fetch else []
    renv = load_runtime_env(runtime_env_file) if runtime_env_file else None
    preflight_submit(study, tracking_uri=uri, storage=store)
    store = store if _is_remote(store) else str(Path(store).expanduser())
    root = project_root(Path(study.path)) if study.path else None
    spec = job_spec(
        self_contained(study),
        study.name,
        storage=store,
        tracking_uri=resolve_tracking_uri(uri),
        python=python,
        root=root,
        runtime_env=renv,
        env=env,
        verbose=verbose,
        fetch=fetch_argv[1:],  # after "calibtune": the job runs `python -m calibtune data fetch`
        wait_for_resources=wait_for_resources,
    )
    if root is not None:
        check_upload_size(root, spec["runtime_env"]["excludes"])
    return spec
