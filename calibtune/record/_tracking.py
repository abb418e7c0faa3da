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
import math
import os
import platform
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibtune import __version__
from calibtune.metrics import keys as K
from calibtune.record._lineage import log_data_inputs
from calibtune.record._mlflow_store import (
    _WATCHED as _WATCHED,
)
from calibtune.record._mlflow_store import (
    CUT_OFF as CUT_OFF,
)
from calibtune.record._mlflow_store import (
    FULL as FULL,
)
from calibtune.record._mlflow_store import (
    RESENDABLE as RESENDABLE,
)
from calibtune.record._mlflow_store import (
    RETRIES_FILE as RETRIES_FILE,
)
from calibtune.record._mlflow_store import (
    StoreFullError as StoreFullError,
)
from calibtune.record._mlflow_store import (
    _chain_says as _chain_says,
)
from calibtune.record._mlflow_store import (
    _client as _client,
)
from calibtune.record._mlflow_store import (
    _from_template as _from_template,
)
from calibtune.record._mlflow_store import (
    _keep_template as _keep_template,
)
from calibtune.record._mlflow_store import (
    _note_retry as _note_retry,
)
from calibtune.record._mlflow_store import (
    _Resending as _Resending,
)
from calibtune.record._mlflow_store import (
    _RetryRecord as _RetryRecord,
)
from calibtune.record._mlflow_store import (
    _schema_template as _schema_template,
)
from calibtune.record._mlflow_store import (
    _stamp as _stamp,
)
from calibtune.record._mlflow_store import (
    retries_note as retries_note,
)
from calibtune.record._mlflow_store import (
    store_created_meanwhile as store_created_meanwhile,
)
from calibtune.record._mlflow_store import (
    store_full_errors as store_full_errors,
)
from calibtune.record._mlflow_store import (
    watch_retries as watch_retries,
)
from calibtune.record._run_values import (
    RunValues as RunValues,
)
from calibtune.record._run_values import (
    _inputs as _inputs,
)
from calibtune.record._run_values import (
    _inputs_query as _inputs_query,
)
from calibtune.record._run_values import (
    _sql_run_values as _sql_run_values,
)
from calibtune.record._run_values import (
    _values as _values,
)
from calibtune.record._run_values import (
    find_run_values as find_run_values,
)
from calibtune.record._run_values import (
    find_runs as find_runs,
)
from calibtune.storage import disk_full_text

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
    beside themselves and are checked with the store (`calibtune.cluster._preflight`). One
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
    trial's datasets with their digests (`calibtune.record._lineage.trial_inputs`), logged by
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
        # torch: a study's trial process coordinates seeds without the trial engine (parallel seeds)
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
    # matplotlib: the trial processes importing this module defer figures (test_deferred_figures)
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
