"""Checks of the command line's paths, addresses and URIs, run before Ray starts or anything is
written.

Each check raises ``ValueError`` with one line naming the flag or study key, what was expected
and what was found, e.g. ``--storage: expected at least 100 MiB free on /data, found 0.9 MiB``.
The checks only read: they stat folders, open a TCP connection or send one HTTP GET, and never
create a file or folder; the probe of a database server for ``search.optuna_storage`` writes in
one transaction that it rolls back (`check_optuna_storage`).
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from calibtune.cluster._raycluster import check_trials_fit
from calibtune.record import found_study, resolve_tracking_uri, study_id_conflict
from calibtune.storage import Storage, open_storage
from calibtune.studyfile import STUDY_COPY, StudyDir, StudyDirError, default_storage

# Ray (`ray._private`) only for the checks of a cluster address: compare/report/export use this
# module's other checks without Ray (tests/test_cli_imports.py).

__all__ = [
    "check_address",
    "check_dir",
    "check_machine",
    "check_optuna_storage",
    "check_out_file",
    "check_storage",
    "check_tracking_uri",
    "preflight_resume",
    "preflight_run",
    "preflight_submit",
]

MIN_FREE_ENV = "CALIBTUNE_MIN_FREE_MB"
DEFAULT_MIN_FREE_MB = 100.0
CONNECT_TIMEOUT_S = 5.0  # a TCP connect to a Ray head or database
HTTP_TIMEOUT_S = 10.0  # all HTTP requests to an MLflow server together
NAME_MAX = 255  # bytes per path component on Linux/macOS filesystems
# The tracking-store schemes of MLflow 3 (its TrackingStoreRegistry; '' is a local folder).
MLFLOW_SCHEMES = frozenset(
    {"", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql"}
    | {"databricks", "databricks-uc", "uc"}
)
DB_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
URI_EXPECTED = "sqlite:///PATH, http(s)://HOST:PORT or a database URL"


def _short(value: Any, limit: int = 80) -> str:
    """``repr`` of a value, cut to ``limit`` characters (errors quote an excerpt, never a file)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def min_free_mb() -> float:
    """The free space a study's folders need: ``$CALIBTUNE_MIN_FREE_MB`` (default 100 MiB)."""
    raw = os.environ.get(MIN_FREE_ENV)
    if raw is None or raw == "":
        return DEFAULT_MIN_FREE_MB
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also rejects nan
        raise ValueError(f"{MIN_FREE_ENV}: expected a number of MiB >= 0, got {_short(raw)}")
    return value


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if os.path.lexists(p):
            return p
    return Path(path.anchor or "/")  # pragma: no cover - the root always exists


def check_dir(path: str | Path, key: str, min_free: float | None = None) -> Path:
    """A folder that exists or can be created, writable, on a real filesystem with at least
    ``min_free`` MiB free (default `min_free_mb`); returns it absolute.

    Checked on the nearest existing ancestor (nothing is created): a directory, ``os.access``
    write+search, not a read-only mount, ``shutil.disk_usage`` total > 0 (``/proc``, ``/sys``
    report 0) and free >= ``min_free``."""
    p = Path(os.path.abspath(Path(path).expanduser()))
    long = [part for part in p.parts if len(os.fsencode(part)) > NAME_MAX]
    if long:
        raise ValueError(
            f"{key}: expected path components of at most {NAME_MAX} bytes, "
            f"got one of {len(os.fsencode(long[0]))} bytes in {_short(str(p))}"
        )
    if p.exists() and not p.is_dir():
        raise ValueError(f"{key}: expected a directory, got a file: {p}")
    anc = _nearest_existing(p)
    if not anc.is_dir():
        raise ValueError(f"{key}: expected a directory path, got {p} ({anc} is a file)")
    if os.statvfs(anc).f_flag & os.ST_RDONLY:
        raise ValueError(f"{key}: expected a writable directory, got {p} ({anc} is read-only)")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise ValueError(
            f"{key}: expected a writable directory, got {p} ({anc}: permission denied)"
        )
    usage = shutil.disk_usage(anc)
    if usage.total == 0:
        raise ValueError(
            f"{key}: expected a directory on a disk, got {p} ({anc} is a virtual filesystem)"
        )
    need = min_free_mb() if min_free is None else min_free
    if usage.free < need * 2**20:
        free = usage.free / 2**20
        raise ValueError(
            f"{key}: expected at least {need:g} MiB free on {anc}, found {free:.1f} MiB"
        )
    return p


def check_storage(path: str | Path | Storage, key: str) -> Storage:
    """The study storage (`calibtune.storage.open_storage`): a local folder `check_dir` accepts
    (with the minimum free space), or a store that answers and holds the bucket; a URI that
    no file system opens is refused (never a local folder named ``s3:``)."""
    where = open_storage(path, key)
    if where.is_local:
        check_dir(where.local_path(), key)
    else:
        where.check_reachable(key)
    return where


def check_out_file(path: str | Path, key: str) -> Path:
    """A file that may be written: not a directory, its folder creatable and writable."""
    p = Path(os.path.abspath(Path(path).expanduser()))
    if p.is_dir():
        raise ValueError(f"{key}: expected a file path, got a directory: {p}")
    check_dir(p.parent, key, min_free=0)
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{key}: expected a writable file, got {p} (permission denied)")
    return p


# ------------------------------------------------------------------------- network


def _connect(host: str, port: int, timeout: float) -> str | None:
    """None when a TCP connection to host:port opens within ``timeout`` s, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except socket.gaierror:
        return f"unknown host {host!r}"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()


def _host_port(address: str, default_port: int | None) -> tuple[str, int] | None:
    """``[scheme://]host[:port][/...]`` -> (host, port); None when it is not of that form."""
    parsed = urllib.parse.urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parsed.port or default_port
    except ValueError:  # a port that is not a number or out of range
        return None
    if not parsed.hostname or port is None:
        return None
    return parsed.hostname, port


def _ray_auto_address() -> tuple[str, str]:
    """What ``ray.init(address='auto')`` connects to, and where that came from, in Ray's order
    (`ray._private.services.get_ray_address_from_environment`, without its log lines):
    RAY_ADDRESS, else the cluster the last ``ray start`` recorded in
    ``<ray temp>/ray_current_cluster``, else a running GCS process found by ``ps``."""
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env, "RAY_ADDRESS"
    from ray._private import services, utils

    recorded = utils.get_ray_address_file(None)
    found = utils.read_ray_address(None)
    if found:
        return found, recorded
    running = sorted(services.find_gcs_addresses())
    if running:
        return running[0], "a running Ray process"
    raise ValueError(
        "--address: expected a running Ray cluster for 'auto' (RAY_ADDRESS, or the cluster "
        f"`ray start` recorded in {recorded}), found none"
    )


def check_address(
    address: str | None,
    key: str = "--address",
    what: str = "a running Ray cluster",
    default_port: int | None = None,
    timeout: float = CONNECT_TIMEOUT_S,
) -> None:
    """Fail in one line unless a TCP connection to the Ray address opens within ``timeout`` s
    (``ray.init`` itself waits minutes for an absent head). None/'local' start a local Ray."""
    if not address or address == "local":
        return
    shown = address
    if address == "auto":
        resolved, source = _ray_auto_address()
        shown = f"auto (= {resolved} from {source})"
    else:
        resolved = address
    if resolved.startswith("ray://") and default_port is None:
        default_port = 10001  # the Ray client server's default port
    hp = _host_port(resolved, default_port)
    if hp is None:
        raise ValueError(f"{key}: expected HOST:PORT of {what}, got {_short(address)}")
    why = _connect(*hp, timeout)
    if why is not None:
        raise ValueError(f"{key}: expected {what} at {shown}, got {why}")


def _http_status(url: str, timeout: float) -> int | str:
    """The HTTP status of a GET (an error status counts as an answer), else why none came."""
    ctx = None
    if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
        ctx = ssl._create_unverified_context()  # what MLflow's client does with this setting
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, TimeoutError):
            return "timed out"
        return str(getattr(reason, "strerror", None) or reason).lower()
    except (TimeoutError, OSError, ValueError) as exc:
        return str(exc).lower() or type(exc).__name__


def _check_http(uri: str, key: str, timeout: float = HTTP_TIMEOUT_S) -> None:
    """An MLflow server answers ``/health`` (or its REST API, e.g. behind auth) in ``timeout``."""
    base = uri.rstrip("/")
    deadline = time.monotonic() + timeout
    status = _http_status(f"{base}/health", timeout)
    if status == 200:
        return
    if isinstance(status, str) and "timed out" in status:
        raise ValueError(
            f"{key}: expected a reachable MLflow server, got no answer from {uri} within "
            f"{timeout:g} s"
        )
    if isinstance(status, str):  # refused, unknown host...: said at once, not after a wait
        raise ValueError(f"{key}: expected a reachable MLflow server at {uri}, got {status}")
    left = max(deadline - time.monotonic(), 0.5)
    api = _http_status(f"{base}/api/2.0/mlflow/experiments/search?max_results=1", left)
    if api in (200, 401, 403):  # MLflow, perhaps with authentication
        return
    raise ValueError(
        f"{key}: expected an MLflow server at {uri}, got HTTP {status} from /health and "
        f"{api} from its REST API"
    )


def _check_sqlite(uri: str, key: str, must_exist: bool) -> None:
    """A writer needs the database's folder writable (MLflow creates the file and its folders);
    a reader (``must_exist``) only needs the file, readable."""
    if not uri.startswith("sqlite:///"):
        raise ValueError(f"{key}: expected sqlite:///PATH, got {_short(uri)}")
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    if path in ("", ":memory:"):
        raise ValueError(f"{key}: expected an SQLite database file, got {_short(uri)} (in memory)")
    db = Path(path)
    if db.is_dir():
        raise ValueError(f"{key}: expected an SQLite database file, got a directory: {db}")
    if must_exist and not db.is_file():
        raise ValueError(f"{key}: expected an existing MLflow store, got {uri} (no such file)")
    if not must_exist:
        check_dir(db.parent, key)
    if db.is_file():
        mode = os.R_OK if must_exist else os.R_OK | os.W_OK
        if not os.access(db, mode):
            raise ValueError(
                f"{key}: expected a usable SQLite database, got {db} (permission denied)"
            )
        with open(db, "rb") as f:
            head = f.read(16)
        if head and head != b"SQLite format 3\x00":
            raise ValueError(f"{key}: expected an SQLite database, got {db} (not an SQLite file)")


def _plugin_scheme(scheme: str) -> bool:
    """Whether an installed MLflow plugin registers ``scheme`` as a tracking store (the entry
    points MLflow's TrackingStoreRegistry loads; read without importing MLflow)."""
    return any(ep.name == scheme for ep in entry_points(group="mlflow.tracking_store"))


def check_tracking_uri(uri: str, key: str, must_exist: bool = False) -> None:
    """A tracking URI MLflow accepts, checked before use: an SQLite file whose folder is writable
    (and which exists, for readers: ``must_exist``), an MLflow server that answers within 10 s,
    a database host that accepts a TCP connection, or a writable local folder."""
    if uri in ("databricks", "databricks-uc", "uc"):
        return
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    base = scheme.split("+", 1)[0]  # postgresql+psycopg2 -> postgresql
    if base not in MLFLOW_SCHEMES:
        if _plugin_scheme(scheme):
            return
        raise ValueError(f"{key}: expected {URI_EXPECTED}, got {_short(uri)}")
    if base == "sqlite":
        _check_sqlite(uri, key, must_exist)
    elif base in ("http", "https"):
        _check_http(uri, key)
    elif base in DB_PORTS:
        hp = _host_port(uri, DB_PORTS[base])
        if hp is None:
            raise ValueError(f"{key}: expected {base}://[USER@]HOST[:PORT]/DB, got {_short(uri)}")
        why = _connect(*hp, CONNECT_TIMEOUT_S)
        if why is not None:
            raise ValueError(f"{key}: expected a reachable database server at {uri}, got {why}")
    elif base in ("", "file"):
        folder = urllib.parse.urlsplit(uri).path if base == "file" else uri
        if must_exist and not Path(folder).is_dir():
            raise ValueError(
                f"{key}: expected an existing MLflow store, got {uri} (no such folder)"
            )
        check_dir(folder, key, min_free=0 if must_exist else None)


# ------------------------------------------------------------------------- Optuna storage

#: the Python package to install for a SQLAlchemy driver module that is missing
DRIVER_PACKAGES = {
    "MySQLdb": "mysqlclient",
    "pymysql": "PyMySQL",
    "psycopg2": "psycopg2-binary",
    "psycopg": "psycopg[binary]",
    "asyncpg": "asyncpg",
    "pyodbc": "pyodbc",
    "pymssql": "pymssql",
    "oracledb": "oracledb",
}


def check_optuna_storage(url: str, key: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """``search.optuna_storage`` usable before Ray starts (one line naming what was expected and
    what was found otherwise): SQLite as `_check_sqlite` (its folder writable; nothing
    created), else a URL SQLAlchemy parses, its driver importable, the server accepting a
    TCP connection and a login within ``timeout`` s, and its schema writable (`_probe_write`).
    The URL is shown with its password masked."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError(f"{key}: expected a SQLAlchemy URL, got {_short(url)}") from None
    shown = parsed.render_as_string(hide_password=True)
    base = parsed.get_backend_name()
    if base == "sqlite":
        _check_sqlite(url, key, must_exist=False)
        return
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise ValueError(
            f"{key}: expected a database SQLAlchemy knows, got {parsed.drivername!r} in {shown}"
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        module = exc.name or parsed.drivername
        package = DRIVER_PACKAGES.get(module.split(".")[0], module)
        other = _installed_driver(base, module)
        also = f", or write {base}+{other}:// for the installed {other}" if other else ""
        raise ValueError(
            f"{key}: expected the {parsed.drivername} driver (Python module {module!r}) for "
            f"{shown}, found none installed (pip install {package}{also})"
        ) from None
    port = parsed.port or DB_PORTS.get(base)
    if parsed.host and port:
        why = _connect(parsed.host, port, timeout)
        if why is not None:
            raise ValueError(f"{key}: expected a reachable database server at {shown}, got {why}")
    problem = _probe_write(parsed, timeout)
    if problem is not None:
        raise ValueError(f"{key}: expected a writable database at {shown}, got {problem}")


def _installed_driver(backend: str, missing: str) -> str | None:
    """Another driver of ``backend`` that is installed (SQLAlchemy 2.1 maps a bare
    ``postgresql://`` to psycopg 3, where psycopg2 may be the one at hand)."""
    from importlib.util import find_spec

    for module in {"postgresql": ("psycopg2", "psycopg"), "mysql": ("pymysql", "MySQLdb")}.get(
        backend, ()
    ):
        if module != missing and find_spec(module) is not None:
            return module.lower()
    return None


def _probe_write(parsed: Any, timeout: float) -> str | None:
    """Log in and write in one transaction that is rolled back: a row in Optuna's ``studies``
    table where it exists, else a table created and dropped (MySQL commits DDL at once: the
    drop undoes it). None when it works, else the database's first line of why not."""
    import uuid

    from sqlalchemy import create_engine, inspect, text
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    seconds = max(1, int(timeout))
    args = {"connect_timeout": seconds} if parsed.get_backend_name() in DB_PORTS else {}
    engine = create_engine(parsed, poolclass=NullPool, connect_args=args)
    probe = f"calibtune_probe_{uuid.uuid4().hex[:12]}"
    try:
        with engine.connect() as conn, conn.begin() as tx:
            if inspect(conn).has_table("studies"):
                conn.execute(text("INSERT INTO studies (study_name) VALUES (:n)"), {"n": probe})
            else:
                conn.execute(text(f"CREATE TABLE {probe} (x INTEGER)"))
                conn.execute(text(f"DROP TABLE {probe}"))
            tx.rollback()
    except SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None) or exc
        lines = [ln.strip() for ln in str(orig).strip().splitlines() if ln.strip()]
        return f"{type(orig).__name__}: {lines[0] if lines else ''}"[:300]
    finally:
        engine.dispose()
    return None


def _check_optuna_study(study: Any, where: Storage, key: str) -> None:
    """A named Optuna storage usable (`check_optuna_storage`) and, if it holds the study's
    Optuna study already, that of this study folder (`calibtune.record._optuna.
    study_id_conflict`: a folder deleted and run again, or the study run under another
    storage, would append to another folder's study and seed the sampler with its trials)."""
    url = resolve_tracking_uri(study.search.optuna_storage)
    check_optuna_storage(url, key)
    sd = StudyDir.at(study.name, where)
    state = sd.read_state() if sd.state_file.is_file() else None
    conflict = study_id_conflict(study, url, state, found_study(url, study.name))
    if conflict:
        raise ValueError(f"{key}{conflict.removeprefix('search.optuna_storage')}")


# ------------------------------------------------------------------------- resources


def check_machine(study: Any, address: str | None) -> None:
    """For a local Ray (no ``address``): every trial of the study fits this machine's CPUs and
    GPUs (`calibtune.trial.local_machine`), known before Ray starts. A cluster's resources are
    checked once connected (`calibtune.cluster._raycluster.check_cluster`)."""
    if address and address != "local":
        return
    # deferred: torch; compare/report/export use this module's other checks without it
    from calibtune.trial import local_machine

    have, where = local_machine()
    check_trials_fit(study, have, where, ", or pass --address of a cluster")


# ------------------------------------------------------------------------- per command


def _study_key(study: Any, key: str) -> str:
    """How to name a study-file value in an error: ``FILE: key`` (``key`` for a submitted one)."""
    return f"{study.path}: {key}" if study.path else key


def preflight_run(
    study: Any, *, address: str | None, tracking_uri: str | None, storage: str | None
) -> None:
    """Every check of `calibtune run` that needs neither Ray nor a write: the local machine's
    resources, the storage folder, the tracking store, the Ray address (in that order: the slow
    network checks last)."""
    check_machine(study, address)
    _check_stores(study, tracking_uri=tracking_uri, storage=storage)
    check_address(address)


def _check_stores(
    study: Any, *, tracking_uri: str | None, storage: str | None, probe_optuna: bool = True
) -> None:
    if storage:
        where = check_storage(storage, "--storage")
    elif study.storage:
        where = check_storage(study.storage, _study_key(study, "storage"))
    else:
        where = check_storage(default_storage(), "storage (default ./runs/studies)")
    if study.search.optuna_storage and probe_optuna:
        _check_optuna_study(study, where, _study_key(study, "search.optuna_storage"))
    if tracking_uri:
        key = "--tracking-uri"
    elif study.tracking.uri:
        key = _study_key(study, "tracking.uri")
    else:
        key = "tracking.uri (default ./mlflow.db)"
    check_tracking_uri(resolve_tracking_uri(tracking_uri or study.tracking.uri), key)


def preflight_submit(study: Any, *, tracking_uri: str | None, storage: str | None) -> None:
    """`calibtune submit`: the storage and tracking store the job will use (paths shared with
    the cluster are visible here too); the dashboard address is checked with the job client,
    the cluster's resources and the Optuna storage (perhaps a service only the cluster
    reaches) by the job once it runs there (`preflight_run`)."""
    _check_stores(study, tracking_uri=tracking_uri, storage=storage, probe_optuna=False)


def preflight_resume(study: str | Path, *, address: str | None, storage: str | None) -> None:
    """`calibtune resume`: the study folder (writable, free space), its state file and the
    tracking store recorded there, Ray Tune's state (complete, really a Tuner's), the Ray address.
    A folder that holds no study is left to `resume_study`, which says so."""
    try:
        sd = StudyDir.find(study, storage)
    except StudyDirError:
        check_address(address)
        return
    check_storage(sd.path, "--storage" if storage else "storage")
    study = sd.read_study()
    check_machine(study, address)
    if study.search.optuna_storage:
        _check_optuna_study(study, sd.root, f"{sd.path / STUDY_COPY}: search.optuna_storage")
    state = sd.read_state()
    check_tracking_uri(state.tracking_uri, f"{sd.state_file}: tracking_uri")
    check_address(address)
    sd.check_restorable()
