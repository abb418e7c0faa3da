"""MLflow tracking: one parent run per study, one nested child run per trial.

Logging goes through ``MlflowClient`` with explicit run ids (no global active run), from the trial's
rank-0 process. Runs are found again by tags, so a restored study keeps writing to the same
parent and child runs: the parent's id is stored next to the study's Ray Tune state, and a child
run is looked up by its Tune trial id (stable across ``Tuner.restore``) before one is created.

MLflow metric names may not contain ``@``; calibtune's ``test/ece@ts`` is logged as
``test/ece.ts`` (`mlflow_metric_name`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import re
import shutil
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibtune import __version__
from calibtune._io import cache_home
from calibtune.metrics import keys as K
from calibtune.study._lineage import log_data_inputs

# Lazy: MLflow, Optuna, Ray, torch and `calibtune.trial` are imported by the functions that use
# them, so that the CLI's --help imports this module without them (bench/bench_cli.py).

TAG_STUDY = "calibtune.study"
TAG_KIND = "calibtune.kind"  # "study" | "trial" | "seed"
TAG_TRIAL = "calibtune.trial_id"
TAG_STATUS = "calibtune.status"
TAG_LOSS = "calibtune.loss"
TAG_HASH = "calibtune.file_hash"
TAG_T_GRID_ENDS = "calibtune.t_grid_ends"  # JSON {method: [first T, last T]} of grid fits
TAG_ERROR = "calibtune.error"  # a failed trial's reason, one line
TAG_SELECTED_EPOCH = "calibtune.selected_epoch"  # the epoch the final evaluation used
TAG_FIGURES = "calibtune.figures_pending"  # study name: its driver renders this run's figures
TAG_ARTIFACTS = "calibtune.artifacts_dir"  # where the trial wrote its artifacts (its machine)
TAG_REUSED = "calibtune.reused_from"  # the Tune trial whose result a same-config trial reused
PARENT = "mlflow.parentRunId"


def default_tracking_uri(cwd: str | Path | None = None) -> str:
    """The embedded default: a SQLite store ``mlflow.db`` in the working directory (absolute)."""
    return f"sqlite:///{Path(cwd or os.getcwd()).resolve() / 'mlflow.db'}"


def resolve_tracking_uri(uri: str | None, cwd: str | Path | None = None) -> str:
    """Absolute URI: relative sqlite/file paths are resolved against ``cwd`` (Ray workers run in
    their own temp directories)."""
    if uri is None:
        return default_tracking_uri(cwd)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{(Path(cwd or os.getcwd()) / uri[len('sqlite:///') :]).resolve()}"
    if "://" not in uri and uri.endswith(".db"):
        return f"sqlite:///{(Path(cwd or os.getcwd()) / uri).resolve()}"
    return uri


def mlflow_metric_name(name: str) -> str:
    """calibtune metric name -> a name MLflow accepts (`calibtune.metrics.keys.to_mlflow`)."""
    return K.to_mlflow(name)


def git_sha(cwd: str | Path | None = None) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    import mlflow
    import optuna
    import ray
    import torch

    return {
        "calibtune": __version__,
        "torch": torch.__version__,
        "ray": ray.__version__,
        "optuna": optuna.__version__,
        "mlflow": mlflow.__version__,
        "python": platform.python_version(),
    }


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


def artifact_location(uri: str, experiment: str) -> str | None:
    """For a SQLite store, artifacts live beside the database (``<db dir>/mlruns/<experiment>``)
    rather than in whatever directory the creating process ran in; servers manage their own."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in experiment)
        return (db.parent / "mlruns" / safe).as_uri()
    return None


#: MLflow's UI opens an experiment on its training-runs table (not the GenAI trace pages) when
#: ``mlflow.experimentKind`` says so; ``mlflow.note.content`` is the experiment's description.
EXPERIMENT_TAGS = {
    "mlflow.experimentKind": "custom_model_development",
    "mlflow.note.content": (
        "calibtune study: one parent run per study (its summary: best trial, comparison and "
        "report tables, study figures) with one nested run per trial."
    ),
}


def experiment_id(uri: str, name: str) -> str:
    """The experiment ``name`` (restored if deleted, created if missing), tagged with
    `EXPERIMENT_TAGS` whether calibtune created it or reuses it."""
    client = _client(uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        with contextlib.suppress(Exception):  # may be created concurrently by another process
            client.create_experiment(
                name, artifact_location=artifact_location(uri, name), tags=EXPERIMENT_TAGS
            )
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise RuntimeError(f"MLflow {uri}: could not create the experiment {name!r}")
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    for k, v in EXPERIMENT_TAGS.items():
        if exp.tags.get(k) != v:
            client.set_experiment_tag(exp.experiment_id, k, v)
    return exp.experiment_id


PROBE_ARTIFACT = "calibtune_probe.txt"


def check_artifact_store(uri: str, experiment: str, key: str) -> None:
    """A tracking server's artifact store takes writes: a throwaway run of ``experiment`` logs a
    tiny artifact (through the server, as the trials will) and is deleted; a failure is one
    ``ValueError`` line, before the first trial (else every trial would train, then fail to
    save its artifacts). Stores other than a server (``sqlite:``, ``file:``) write artifacts
    beside themselves and are checked with the store (`calibtune.study._preflight`). One
    attempt, no retries: a store that refuses does so at once."""
    if not uri.startswith(("http://", "https://")):
        return
    client = _client(uri)
    run_id = client.create_run(
        experiment_id(uri, experiment), run_name="calibtune-artifact-probe"
    ).info.run_id
    before = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"  # read per request by MLflow's client
    try:
        client.log_text(run_id, "calibtune: this store takes artifacts\n", PROBE_ARTIFACT)
        _delete_artifacts(uri, client.get_run(run_id).info.artifact_uri)
    except Exception as exc:  # any failure of the store, as MLflow words it
        said = " ".join(str(exc).split())
        status = re.search(r"too many (\d+) error responses", said)
        got = (
            f"HTTP {status[1]} for a {len(PROBE_ARTIFACT)}-byte artifact" if status else said[:300]
        )
        raise ValueError(
            f"{key}: expected an MLflow server whose artifact store takes writes, got {got} "
            "(see the server's log: its --artifacts-destination and credentials)"
        ) from None
    finally:
        if before is None:
            os.environ.pop("MLFLOW_HTTP_REQUEST_MAX_RETRIES", None)
        else:
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = before
        client.delete_run(run_id)


def _delete_artifacts(uri: str, artifact_uri: str) -> None:
    """Delete a run's artifacts through its artifact repository (the server's proxy)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    with _use_tracking_uri(uri):  # mlflow-artifacts: URIs resolve against the tracking URI
        get_artifact_repository(artifact_uri).delete_artifacts()


def _finite_metrics(metrics: Mapping[str, Any], step: int) -> list[Any]:
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    out = []
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not math.isfinite(float(v)):
            continue
        out.append(Metric(mlflow_metric_name(k), float(v), ts, step))
    return out


def log_metrics(uri: str, run_id: str, metrics: Mapping[str, Any], step: int = 0) -> None:
    """Log all finite numeric values in one batch per 1000 (MLflow's batch limit)."""
    client = _client(uri)
    items = _finite_metrics(metrics, step)
    for i in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[i : i + 1000], synchronous=True)


def log_missing(uri: str, run_id: str, metrics: Mapping[str, Any], step: int = 0) -> None:
    """`log_metrics` of only the keys the run does not hold yet: logging the same final values
    again (a trial restarted after it had logged them) adds nothing."""
    have = set(_client(uri).get_run(run_id).data.metrics)
    log_metrics(uri, run_id, {k: v for k, v in metrics.items() if K.to_mlflow(k) not in have}, step)


def set_tag(uri: str, run_id: str, key: str, value: str) -> None:
    _client(uri).set_tag(run_id, key, value)


def run_metrics(uri: str, run_id: str) -> dict[str, float]:
    """A run's latest value of each metric, under MLflow's names."""
    return dict(_client(uri).get_run(run_id).data.metrics)


def _flat_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flat_params(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


def find_runs(uri: str, exp_id: str, filter_string: str) -> list[Any]:
    return list(_client(uri).search_runs([exp_id], filter_string=filter_string, max_results=10000))


@dataclass(frozen=True)
class RunValues:
    """What the study's readers take from a run: ids, start, its values by key (a metric's
    latest value, NaN kept) and its dataset inputs (name, digest and input tags only)."""

    run_id: str
    run_name: str
    start_time: int
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]
    inputs: Any  # mlflow.entities.RunInputs


def find_run_values(uri: str, exp_id: str, tags: Mapping[str, str]) -> list[RunValues]:
    """The active runs of ``exp_id`` whose tags equal ``tags``, as `find_runs` orders them for
    ``tags.`k` = 'v' and ...`` (newest start first, then run id). On a SQL store a constant
    number of plain queries, whatever the number of runs: MLflow's search builds an ORM object
    per logged value and reads each dataset's schema and profile (≈ 10 s for 1,000 runs of 200
    metrics on a 2-core box, bench/README.md)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = getattr(_client(uri)._tracking_client, "store", None)
    if not isinstance(store, SqlAlchemyStore):
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        return [_values(r) for r in find_runs(uri, exp_id, query)]
    with store.ManagedSessionMaker() as session:
        return _sql_run_values(session, int(exp_id), tags)


def _values(run: Any) -> RunValues:
    i, d = run.info, run.data
    name, start = i.run_name or "", i.start_time
    return RunValues(i.run_id, name, start, d.tags, d.params, d.metrics, run.inputs)


def _sql_run_values(session: Any, exp_id: int, tags: Mapping[str, str]) -> list[RunValues]:
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels import models as M

    stmt = sa.select(M.SqlRun.run_uuid, M.SqlRun.name, M.SqlRun.start_time).where(
        M.SqlRun.experiment_id == exp_id, M.SqlRun.lifecycle_stage == "active"
    )
    for k, v in tags.items():
        tagged = sa.select(M.SqlTag.run_uuid).where(M.SqlTag.key == k, M.SqlTag.value == v)
        stmt = stmt.where(M.SqlRun.run_uuid.in_(tagged))
    runs = session.execute(stmt.order_by(M.SqlRun.start_time.desc(), M.SqlRun.run_uuid)).all()
    ids = [r[0] for r in runs]
    values: dict[str, tuple[dict, dict, dict, dict]] = {i: ({}, {}, {}, {}) for i in ids}
    for chunk in (ids[i : i + 500] for i in range(0, len(ids), 500)):  # SQLite's variables
        m = M.SqlLatestMetric
        q = sa.select(m.run_uuid, m.key, m.value, m.is_nan).where(m.run_uuid.in_(chunk))
        for run, key, value, nan in session.execute(q):
            values[run][0][key] = float("nan") if nan else value
        for n, table in ((1, M.SqlParam), (2, M.SqlTag)):
            q = sa.select(table.run_uuid, table.key, table.value).where(table.run_uuid.in_(chunk))
            for run, key, value in session.execute(q):
                values[run][n][key] = value
        for run, *dataset in session.execute(_inputs_query(M, chunk)):
            values[run][3].setdefault(dataset[0], (dataset[1:5], []))[1].extend(dataset[5:])
    out = []
    for run_id, name, start in runs:
        metrics, params, run_tags, inputs = values[run_id]
        out.append(RunValues(run_id, name or "", start, run_tags, params, metrics, _inputs(inputs)))
    return out


def _inputs_query(M: Any, chunk: list[str]) -> Any:
    """(run, dataset id, name, digest, source type, source, tag name, tag value) of the runs'
    dataset inputs, one row per input tag (none: a row with a NULL tag); a dataset given twice
    is one input with both inputs' tags, as MLflow's search gives it."""
    import sqlalchemy as sa

    i, d, t = M.SqlInput, M.SqlDataset, M.SqlInputTag
    cols = (i.destination_id, d.dataset_uuid, d.name, d.digest, d.dataset_source_type)
    return (
        sa.select(*cols, d.dataset_source, t.name, t.value)
        .select_from(i)
        .join(d, i.source_id == d.dataset_uuid)
        .outerjoin(t, t.input_uuid == i.input_uuid)
        .where(i.destination_type == "RUN", i.source_type == "DATASET", i.destination_id.in_(chunk))
    )


def _inputs(found: Mapping[str, tuple[Sequence[Any], list[Any]]]) -> Any:
    from mlflow.entities import Dataset, DatasetInput, InputTag, RunInputs

    datasets = []
    for (name, digest, source_type, source), tags in found.values():
        pairs = [(k, v) for k, v in zip(tags[::2], tags[1::2], strict=True) if k is not None]
        datasets.append(
            DatasetInput(Dataset(name, digest, source_type, source), [InputTag(*p) for p in pairs])
        )
    return RunInputs(dataset_inputs=datasets)


@dataclass(frozen=True)
class StudyRun:
    """Handle to a study's parent run."""

    uri: str
    experiment_id: str
    run_id: str


def open_study_run(
    uri: str,
    experiment: str,
    study_name: str,
    tags: Mapping[str, str],
    artifacts: Iterable[Path] = (),
    existing_run_id: str | None = None,
) -> StudyRun:
    """Reopen the study's parent run ``existing_run_id`` (if this store still has it), else
    create it (logging the study files under ``study/``)."""
    from mlflow.entities import RunStatus

    client = _client(uri)
    exp_id = experiment_id(uri, experiment)
    if existing_run_id:
        try:
            run = client.get_run(existing_run_id)
            if run.info.lifecycle_stage != "deleted":
                client.update_run(run.info.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
                return StudyRun(uri, run.info.experiment_id, run.info.run_id)
        except Exception:  # the recorded run is gone from this store: start a new one
            pass
    run = client.create_run(
        exp_id,
        run_name=study_name,
        tags={TAG_STUDY: study_name, TAG_KIND: "study", **tags},
    )
    for path in artifacts:
        if path.is_file():
            client.log_artifact(run.info.run_id, str(path), artifact_path="study")
    return StudyRun(uri, exp_id, run.info.run_id)


def finish_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    _client(uri).set_terminated(run_id, status=status)


@dataclass
class ChildRun:
    """A nested run under ``parent_id``, found by ``key`` (Tune trial id, or trial/seed) so that
    reopening after a restore never duplicates it."""

    uri: str
    experiment_id: str
    parent_id: str
    key: str
    name: str
    kind: str = "trial"
    run_id: str | None = None

    def open(self, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        from mlflow.entities import RunStatus

        client = _client(self.uri)
        found = find_runs(
            self.uri,
            self.experiment_id,
            f"tags.`{PARENT}` = '{self.parent_id}' and tags.`{TAG_TRIAL}` = '{self.key}'",
        )
        if found:
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            if TAG_ERROR in found[0].data.tags:  # an earlier attempt's reason (a full disk)
                client.delete_tag(self.run_id, TAG_ERROR)
            for k, v in tags.items():  # e.g. the node of this attempt (a retry, a restore)
                if found[0].data.tags.get(k) != v:
                    client.set_tag(self.run_id, k, v)
        else:
            run = client.create_run(
                self.experiment_id,
                run_name=self.name,
                tags={PARENT: self.parent_id, TAG_TRIAL: self.key, TAG_KIND: self.kind, **tags},
            )
            self.run_id = run.info.run_id
            flat = _flat_params(params)
            from mlflow.entities import Param

            items = [Param(k, v[:6000]) for k, v in flat.items()]
            for i in range(0, len(items), 100):
                client.log_batch(self.run_id, params=items[i : i + 100], synchronous=True)
        client.set_tag(self.run_id, TAG_STATUS, "running")
        return self.run_id

    def close(self, status: str) -> None:
        """``finished``, ``stopped`` (early-stopped by the scheduler) or ``failed``."""
        assert self.run_id is not None
        close_run(self.uri, self.run_id, status)

    def fail(self, reason: str, detail: str = "") -> None:
        """Mark the run failed with a short ``reason`` tag and the full ``detail`` as
        ``error.txt`` (failed trials are results too). A full disk (ENOSPC in either) is not
        the trial's failure: the run stays unfinished and `resume` continues it, also when Tune
        requeues the trial and the study stops before telling its callbacks
        (`reopen_interrupted` for the trials they are told of)."""
        from calibtune.study._diskfull import disk_full_text

        assert self.run_id is not None
        if disk_full_text(reason) or disk_full_text(detail):
            return
        record_failure(self.uri, self.run_id, reason, detail)


def close_run(uri: str, run_id: str, status: str) -> None:
    client = _client(uri)
    client.set_tag(run_id, TAG_STATUS, status)
    client.set_terminated(run_id, status="FAILED" if status == "failed" else "FINISHED")


def record_failure(uri: str, run_id: str, reason: str, detail: str = "") -> None:
    client = _client(uri)
    client.set_tag(run_id, TAG_ERROR, reason[:500])
    if detail:
        client.log_text(run_id, detail, "error.txt")
    close_run(uri, run_id, "failed")


def reopen_interrupted(uri: str, run_id: str) -> None:
    """Undo `record_failure` for a trial that an outside cause (a full disk) interrupted: its
    run is unfinished again (``running``, no reason) and `resume` continues it."""
    from mlflow.entities import RunStatus
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    with contextlib.suppress(MlflowException):  # no reason recorded (the store was full too)
        client.delete_tag(run_id, TAG_ERROR)
    client.set_tag(run_id, TAG_STATUS, "running")
    client.update_run(run_id, status=RunStatus.to_string(RunStatus.KILLED))


class MlflowTrialCallback:
    """`calibtune.trial.TrialCallback` that logs a trial's epochs and results to one MLflow run,
    each exactly once whatever was interrupted when.

    Every epoch's batch carries the ``epoch`` metric at ``step=epoch`` (one batch, one
    transaction), so the steps of ``epoch`` are the epochs already logged. List values
    (AdaFocal's per-bin γ, edges, gap) are logged element by element only with ``log_bins``
    (``eval.log_adaptive_bins``); by default their `calibtune.metrics.keys.adaptive_summary`
    series stand for them (``history.jsonl`` keeps the lists). `on_start` logs the
    epochs a resumed trial restored from its checkpoint but never logged (killed between the
    checkpoint and the log); `on_epoch` skips epochs already logged (re-run after a restore from
    an older checkpoint); `on_trial_end` logs only final metrics not there yet. With
    ``figures_for`` (a study's name) the trial leaves its figures to that study's driver
    (`defers_figures`; `render_deferred_figures`); with ``retries_to`` (a study folder) the
    process it logs from records its retried requests there (`watch_retries`). ``inputs``: the
    trial's datasets with their digests (`calibtune.study._lineage.trial_inputs`), logged by
    `on_start` as the run's dataset inputs (once: MLflow keeps one input per dataset and digest).
    Picklable (it travels to the Ray Train worker); the client is created on use.

    ``background=True`` (what a study uses) sends each epoch's batch from a thread while the next
    epoch trains, one batch in flight at most: `flush` (called by the next `on_epoch` and by
    `on_trial_end`) waits for it and raises its error. Exactly-once still holds: a process
    killed with a batch in flight lost an epoch that is either in its checkpoint (logged by
    `on_start` on resume) or trained and logged again; the batch itself is one transaction.
    """

    def __init__(
        self,
        uri: str,
        run_id: str,
        log_bins: bool = False,
        background: bool = False,
        figures_for: str | None = None,
        retries_to: str | None = None,
        inputs: Sequence[Any] = (),
    ) -> None:
        self.uri = uri
        self.inputs = tuple(inputs)
        self.run_id = run_id
        self.log_bins = log_bins  # every bin of adaptive/{gammas,edges,gap}, not only summaries
        self.background = background
        self.figures_for = figures_for  # the study whose driver renders the figures
        self.retries_to = retries_to  # the study folder its retried requests are recorded in
        self._logged: set[int] | None = None
        self._pending: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def defers_figures(self) -> bool:
        """The trial skips its figures (`calibtune.trial._worker`): `on_trial_end` tags the run
        and the study's driver renders them (`render_deferred_figures`)."""
        return self.figures_for is not None

    def __getstate__(self) -> dict[str, Any]:
        # a thread does not pickle: the batch in flight is sent first, so that the copy's
        # `on_trial_end` (its flush) comes after it, as the original's would
        if self._pending is not None:
            self._pending.join()
        return {**self.__dict__, "_pending": None}

    def flush(self) -> None:
        """Wait for the epoch batch in flight (``background``); raise the error it met."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def _send(self, flat: dict[str, float], epoch: int) -> None:
        if self.retries_to:  # in the process that logs (a Train worker's too)
            watch_retries(self.retries_to)
        self.flush()
        if not self.background:
            log_metrics(self.uri, self.run_id, flat, step=epoch)
            return

        def send() -> None:
            try:
                log_metrics(self.uri, self.run_id, flat, step=epoch)
            except BaseException as exc:  # re-raised by the next flush, in the trial's thread
                self._error = exc

        self._pending = threading.Thread(target=send, name="calibtune-mlflow-epoch")
        self._pending.start()

    def _logged_epochs(self) -> set[int]:
        if self._logged is None:
            hist = _client(self.uri).get_metric_history(self.run_id, "epoch")
            self._logged = {int(m.step) for m in hist}
        return self._logged

    def on_start(self, history: Sequence[Mapping[str, Any]]) -> None:
        log_data_inputs(self.uri, self.run_id, getattr(self, "inputs", ()))
        for metrics in history:
            self.on_epoch(int(metrics["epoch"]), metrics)

    def on_epoch(self, epoch: int, metrics: Mapping[str, Any]) -> None:
        if epoch in self._logged_epochs():
            return
        flat: dict[str, float] = {}
        for k, v in metrics.items():
            if isinstance(v, (list, tuple)):
                if not self.log_bins and K.is_adaptive_list(k):
                    continue  # the per-bin table and figure are the trial's artifacts
                for i, x in enumerate(v):
                    flat[K.element_key(k, i)] = x
            else:
                flat[k] = v
        flat["epoch"] = epoch
        self._send(flat, epoch)
        self._logged_epochs().add(epoch)

    def on_trial_error(self, reason: str, text: str) -> None:
        """The trial failed: its traceback as the run's ``error.txt``, the one-line reason as
        the ``calibtune.error`` tag (epochs already sent are flushed first)."""
        with contextlib.suppress(Exception):
            self.flush()
        client = _client(self.uri)
        client.log_text(self.run_id, text, "error.txt")
        client.set_tag(self.run_id, TAG_ERROR, reason[:5000])

    def on_trial_end(self, metrics: Mapping[str, float], artifacts_dir: Path) -> None:
        self.flush()
        client = _client(self.uri)
        log_missing(self.uri, self.run_id, metrics, step=0)
        from calibtune.trial import TAG_WORKER_NODES, worker_nodes_tag

        if K.SELECTED_EPOCH in metrics:  # eval.select_epoch: best
            client.set_tag(self.run_id, TAG_SELECTED_EPOCH, str(int(metrics[K.SELECTED_EPOCH])))
        if artifacts_dir and (nodes := worker_nodes_tag(Path(artifacts_dir))) is not None:
            client.set_tag(self.run_id, TAG_WORKER_NODES, nodes)  # where the trial's ranks ran
        if artifacts_dir and Path(artifacts_dir).is_dir():
            for item in sorted(Path(artifacts_dir).iterdir()):
                if item.name == "logits.pt":  # large and re-derivable; kept on disk only
                    continue
                if item.is_dir():
                    client.log_artifacts(self.run_id, str(item), artifact_path=item.name)
                else:
                    client.log_artifact(self.run_id, str(item))
        if self.figures_for is not None and artifacts_dir:  # after the data files, all there
            from mlflow.entities import RunTag

            art = Path(artifacts_dir).resolve()
            tags = [RunTag(TAG_FIGURES, self.figures_for), RunTag(TAG_ARTIFACTS, str(art))]
            client.log_batch(self.run_id, tags=tags, synchronous=True)


#: the artifact files the trial figures are drawn from (`calibtune.plots.save_trial_figures`)
FIGURE_DATA = (
    "reliability.json",
    "gamma_history.json",
    "roc.json",
    "shift.json",
    "risk_coverage.json",
)


def render_deferred_figures(uri: str, exp_id: str, study_name: str) -> int:
    """Render and log the figures of every run of ``study_name`` whose trial deferred them
    (tagged `TAG_FIGURES` by `MlflowTrialCallback.on_trial_end`); returns how many runs.

    The figures go to the trial's artifacts folder when this machine has it (the files a
    trial that rendered them itself leaves), else they are drawn from the run's logged data
    files. The tag is removed only after the figures are logged: a driver killed in between
    leaves it for the next call (a resumed study's), which logs the same files again over
    them, so each run ends with one copy of each figure."""
    from calibtune.plots import save_trial_figures

    client = _client(uri)
    runs = find_runs(uri, exp_id, f"tags.`{TAG_FIGURES}` = '{study_name}'")
    for run in runs:
        run_id, art = run.info.run_id, Path(run.data.tags.get(TAG_ARTIFACTS) or "-")
        with tempfile.TemporaryDirectory(prefix="calibtune-figures-") as tmp:
            if not art.is_absolute() or not (art / "metrics.json").is_file():  # another machine
                art = Path(tmp)
                logged = {a.path for a in client.list_artifacts(run_id)}
                for name in FIGURE_DATA:
                    if name in logged:
                        client.download_artifacts(run_id, name, tmp)
            save_trial_figures(art)
            client.log_artifacts(run_id, str(art / "figures"), artifact_path="figures")
        client.delete_tag(run_id, TAG_FIGURES)
    return len(runs)


def child_statuses(uri: str, exp_id: str, parent_run_id: str) -> dict[str, str]:
    """Tune trial id -> calibtune status of each trial run under the parent (MLflow's view)."""
    runs = find_runs(
        uri, exp_id, f"tags.`{PARENT}` = '{parent_run_id}' and tags.`{TAG_KIND}` = 'trial'"
    )
    return {
        r.data.tags.get(TAG_TRIAL, r.info.run_id): r.data.tags.get(TAG_STATUS, "?") for r in runs
    }
