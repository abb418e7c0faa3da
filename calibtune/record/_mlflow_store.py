"""The MLflow client calibtune writes through, and the store beneath it: calls resent when a
server cut its answer off, a new SQLite store made while Ray starts (from a cached empty schema),
a full store named as such, and the retried requests noted for the study's summary."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from calibtune._io import cache_home


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return _Resending(MlflowClient(tracking_uri=uri))


#: the client's calls that may be sent twice: MLflow keeps one copy of an identical metric
#: (key, value, timestamp, step), a tag or param sent again is the same, an artifact replaces
#: itself (`create_run` is not one: `ChildRun` finds its run by key instead)
RESENDABLE = frozenset(
    {
        "log_batch", "log_metric", "log_param", "set_tag", "delete_tag", "set_terminated",
        "update_run", "log_artifact", "log_artifacts", "get_run", "get_metric_history",
        "search_runs", "get_experiment_by_name", "get_experiment",
    }
)  # fmt: skip
#: an answer the server cut off (it died mid-response): urllib3 retries requests that got no
#: answer, not these (`requests`' ChunkedEncodingError, a connection reset after the request)
CUT_OFF = ("Connection broken", "Connection aborted", "RemoteDisconnected", "IncompleteRead")


class _Resending:
    """An ``MlflowClient`` whose `RESENDABLE` calls are sent again (up to 3 times, 1 s apart)
    when the server's answer was cut off (`CUT_OFF`, not after urllib3's own retries ran out):
    a server killed mid-answer is then a retried request like any other (`retries_note`)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        client = self.__dict__.get("_client")  # none while unpickled
        if client is None:
            raise AttributeError(name)
        attr = getattr(client, name)
        if name not in RESENDABLE:
            return attr

        def resent(*args: Any, **kwargs: Any) -> Any:
            for _ in range(3):
                try:
                    return attr(*args, **kwargs)
                except Exception as exc:
                    text = str(exc)
                    if "Max retries exceeded" in text or not any(c in text for c in CUT_OFF):
                        raise
                    _note_retry()
                    time.sleep(1.0)
            return attr(*args, **kwargs)

        return resent


@contextlib.contextmanager
def store_created_meanwhile(uri: str) -> Any:
    """Run the block (the driver's Ray start: ≈ 5 s, mostly waiting for Ray's processes) while a
    thread creates the SQLite store ``uri`` if it does not exist yet (MLflow's schema migrations
    on a new database take ≈ 2 s). The tables are made in a file of their own beside it, moved
    into place only when the block succeeds (never over a database that appeared meanwhile): a
    study that fails to start leaves nothing, and no MLflow engine in this process ever pointed
    at a file that was then removed. Other stores (an existing file, a server) are left to the
    first client, as is any failure here (the client then reports it).

    The tables come from a copy of an empty store this machine made before with the same
    schema (`_schema_template`), so only the first new store per MLflow schema pays for the
    migrations.

    MLflow's modules are imported here, before the thread starts: the thread then only runs
    MLflow's migration scripts, which nothing in the block imports (concurrent imports of one
    package from two threads could meet a circular import half-done). The block must not open
    a new MLflow store itself: MLflow's migrations run through alembic's process-wide `op`
    proxy, so two at once in one process collide.
    """
    db = Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None
    if db is None or db.exists():
        yield
        return
    import sqlalchemy
    from mlflow.store.db.utils import _get_latest_schema_revision, _initialize_tables

    new = db.with_name(f".{db.name}.{os.getpid()}.new")
    revision = _get_latest_schema_revision()

    def create() -> None:
        try:
            if _from_template(new, revision):
                return
            engine = sqlalchemy.create_engine(f"sqlite:///{new}")
            try:
                _initialize_tables(engine)
            finally:
                engine.dispose()  # no connection left open on the file
            _keep_template(new, revision)
        except Exception:  # e.g. a full disk: a half-made store is never moved into place
            new.unlink(missing_ok=True)

    thread = threading.Thread(target=create, name="calibtune-store")
    thread.start()
    try:
        yield
    except BaseException:
        thread.join()
        new.unlink(missing_ok=True)
        raise
    thread.join()
    with contextlib.suppress(OSError):  # e.g. a database appeared meanwhile: that one stays
        os.link(new, db)
    new.unlink(missing_ok=True)


def _schema_template(revision: str) -> Path:
    """This machine's empty SQLite store with MLflow's tables at schema ``revision`` (alembic's
    head): a new store is a copy of it, not ≈ 1–2 s of MLflow's migrations again."""
    return cache_home() / "mlflow-schema" / f"{revision}.db"


def _from_template(new: Path, revision: str) -> bool:
    """Copy the template of ``revision`` to ``new``; False (and no ``new``) when there is none
    or the copy is not a store at that revision (then the migrations make it)."""
    template = _schema_template(revision)
    if not template.is_file():
        return False
    shutil.copyfile(template, new)
    try:
        with contextlib.closing(sqlite3.connect(new)) as con:
            (found,) = con.execute("select version_num from alembic_version").fetchone()
    except (sqlite3.Error, TypeError, ValueError):
        found = None
    if found != revision:
        new.unlink()
        return False
    return True


def _keep_template(made: Path, revision: str) -> None:
    """Keep a copy of the store just made by the migrations as `_schema_template` (complete or
    not at all; a cache that cannot be written is only a cache)."""
    template = _schema_template(revision)
    part = template.with_name(f".{template.name}.{os.getpid()}.part")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made, part)
        os.replace(part, template)
    except OSError:
        part.unlink(missing_ok=True)


class StoreFullError(ValueError):
    """The MLflow store's disk (or database) is full: one line naming the store."""


FULL = "database or disk is full"  # SQLite's SQLITE_FULL, as sqlite3 and SQLAlchemy say it


@contextlib.contextmanager
def store_full_errors(uri: str) -> Iterator[None]:
    """Turn an SQLite store's "database or disk is full" (raised with the SQL that failed, e.g.
    ``[SQL: CREATE TABLE alembic_version …]``, wherever MLflow met it) into one line that names
    the store's path and the space left beside it. A store file the block began is removed:
    MLflow would take a half-made one for an old schema next time."""
    db = Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None
    new = db is not None and not db.exists()
    try:
        yield
    except Exception as exc:
        if db is None or not _chain_says(exc, FULL):
            raise
        if new:
            for f in (db, db.with_name(db.name + "-journal")):
                f.unlink(missing_ok=True)
        folder = next((p for p in (db.parent, *db.parents) if p.is_dir()), Path("/"))
        free = shutil.disk_usage(folder).free / 2**20
        raise StoreFullError(
            f"MLflow store {db}: expected room to write, got {FULL!r} ({free:.1f} MiB free on "
            f"{folder}); free space there, then run again"
        ) from None


def _chain_says(exc: BaseException | None, text: str) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if text in str(exc):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


#: in the study folder: when each MLflow request of the study's processes was retried
RETRIES_FILE = ".mlflow_retries"
_WATCHED: set[str] = set()  # the files this process records retries in


class _RetryRecord(logging.Filter):
    """Appends the time of every request urllib3 retries (MLflow's HTTP client: the server did
    not answer) to ``path``; ``quiet`` drops urllib3's own warning (one per retry)."""

    def __init__(self, path: str, quiet: bool) -> None:
        super().__init__()
        self.path, self.quiet = path, quiet

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Retrying"):
            return True
        _stamp(self.path)
        return not self.quiet


def _stamp(path: str) -> None:
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
        f.write(f"{time.time():.3f}\n")  # one short append: whole lines from every process


def _note_retry() -> None:
    """Record a request calibtune itself sent again (`_Resending`) as urllib3's are."""
    for path in _WATCHED:
        _stamp(path)


def watch_retries(folder: str | Path, quiet: bool = True) -> None:
    """Record this process's retried MLflow requests in ``folder``/`RETRIES_FILE` (once per
    process and folder), for `retries_note`."""
    path = str(Path(folder) / RETRIES_FILE)
    if path not in _WATCHED:
        _WATCHED.add(path)
        logging.getLogger("urllib3.connectionpool").addFilter(_RetryRecord(path, quiet))


def retries_note(folder: str | Path, uri: str, failed: int) -> str | None:
    """One line when requests to the MLflow server ``uri`` were retried since the last call
    (the file is then cleared): when, and what it cost (``failed``: trials that failed)."""
    path = Path(folder) / RETRIES_FILE
    try:
        stamps = [float(x) for x in path.read_text(encoding="utf-8").split()]
    except (OSError, ValueError):
        return None
    path.unlink(missing_ok=True)
    if not stamps:
        return None
    first, last = (time.strftime("%H:%M:%S", time.localtime(t)) for t in (min(stamps), max(stamps)))
    cost = (
        "every request went through once it answered again: nothing was lost"
        if not failed
        else f"see the {failed} failed trials' reasons (`calibtune resume` reruns them)"
    )
    return (
        f"[calibtune] the MLflow server at {uri} did not answer for a while ({len(stamps)} "
        f"requests retried, {first} to {last}); {cost}"
    )


def mlflow_client(uri: str) -> Any:
    """The ``MlflowClient`` of ``uri`` that calibtune writes and reads through (`_Resending`:
    calls a dying server cut off are sent again where sending twice changes nothing)."""
    return _client(uri)
