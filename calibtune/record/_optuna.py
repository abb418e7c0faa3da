"""The Optuna side of a study: the define-by-run space, the conditional grid, the sampler.

The space is define-by-run: the loss label is sampled first, then that loss's hyperparameters
(named ``<label>/<param>``), then any searched trial-config keys (``trial/<key.path>``). For
TPE, random, grid and NSGA-II only the sampled loss's parameters are suggested, so those Optuna
trials never carry another loss's parameters. CMA-ES and GP model only the parameters that every
past trial shares (Optuna's "intersection search space"): in a conditional space that is the
loss label alone, and every loss parameter would be sampled at random. For them every loss's
parameters are suggested on every trial (`FLAT_SAMPLERS`): the space is fixed, their model
covers it, and the trial uses only its own loss's (`trial_dict`, `hyperparameters`: the MLflow
run carries only those). CMA-ES leaves categorical parameters (the loss label) to its
independent sampler, here TPE rather than Optuna's default random sampler.

The persisted Optuna study of a study in a bucket that names no ``search.optuna_storage`` is
SQLite on the driver's disk, with a consistent copy in the study folder put there each time Tune
saves its state and at the end, and brought back by the next session on any machine
(`push_optuna_copy`, `pull_optuna_copy`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from calibtune.record._tracking import resolve_tracking_uri
from calibtune.studyfile import (
    Constraint,
    StudyConfig,
    StudyDir,
    StudyDirError,
    baseline_values,
    new_study_id,
    violations,
)

__all__ = [
    "OPTUNA_FILE",
    "STUDY_ID_ATTR",
    "DefineByRun",
    "DriverSQLite",
    "backup_sqlite",
    "bind_study",
    "conditional_grid",
    "copied_sqlite",
    "define_by_run",
    "found_study",
    "load_sqlite_copy",
    "make_sampler",
    "optuna_copy_callbacks",
    "optuna_storage_url",
    "pull_optuna_copy",
    "push_optuna_copy",
    "save_sqlite_copy",
    "sqlite_url",
    "study_id_conflict",
]


#: samplers whose model covers only the parameters every trial has: suggest every loss's
FLAT_SAMPLERS = ("cmaes", "gp")


def _suggest(trial: Any, name: str, dist: BaseDistribution) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    raise TypeError(f"unsupported distribution {dist!r}")  # pragma: no cover


class DefineByRun:
    """The Optuna define-by-run space: loss first, then its parameters (every loss's for the
    `FLAT_SAMPLERS`), then the searched trial keys.

    A picklable callable (OptunaSearch pickles itself into the study's Tune state for restore).
    """

    def __init__(self, study: StudyConfig) -> None:
        self.flat = study.search.sampler in FLAT_SAMPLERS
        self.labels = [c.label for c in study.losses]
        self.loss_dists = {c.label: sorted(c.loss.space.dists.items()) for c in study.losses}
        self.trial_dists = sorted(study.space.dists.items())

    def __call__(self, trial: Any) -> dict[str, Any] | None:
        label = trial.suggest_categorical("loss", self.labels)
        # a space pickled before `flat` existed is conditional
        for suggested in self.labels if getattr(self, "flat", False) else [label]:
            for name, dist in self.loss_dists[suggested]:
                _suggest(trial, f"{suggested}/{name}", dist)
        for key, dist in self.trial_dists:
            _suggest(trial, f"trial/{key}", dist)
        return None


def define_by_run(study: StudyConfig) -> DefineByRun:
    return DefineByRun(study)


def conditional_grid(study: StudyConfig) -> list[dict[str, Any]]:
    """Every point of a conditional grid: for each loss, the product of its categorical choices
    (and of the searched trial keys). Optuna's GridSampler would cross every loss with every other
    loss's parameters; these points are enqueued instead, each evaluated once."""
    extra = sorted(study.space.dists.items())
    points = []
    for c in study.losses:
        own = sorted(c.loss.space.dists.items())
        names = [f"{c.label}/{n}" for n, _ in own] + [f"trial/{k}" for k, _ in extra]
        choices = [list(d.choices) for _, d in own + extra]  # type: ignore[attr-defined]
        for combo in itertools.product(*choices):
            points.append({"loss": c.label, **dict(zip(names, combo, strict=True))})
    return points


def make_sampler(study: StudyConfig) -> Any:
    """The study's Optuna sampler. Optuna's ExperimentalWarning for the options chosen here
    (TPE's ``group``) is silenced: users cannot act on it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _sampler(study)


def _sampler(study: StudyConfig) -> Any:
    s = study.search
    seed = s.sampler_seed
    if s.sampler == "tpe":
        # multivariate + group model the conditional (per-loss) sub-spaces jointly
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
    if s.sampler in ("random", "grid"):  # grid: the points themselves are enqueued
        return optuna.samplers.RandomSampler(seed=seed)
    if s.sampler == "cmaes":  # the loss label is categorical: CMA-ES hands it to TPE
        independent = optuna.samplers.TPESampler(seed=seed)
        return optuna.samplers.CmaEsSampler(
            seed=seed, warn_independent_sampling=False, independent_sampler=independent
        )
    if s.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if s.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    raise AssertionError(s.sampler)


# ----------------------------------------------------------------------------- constraints

#: user attribute of an Optuna trial of a constrained study: its values of the constrained
#: metrics (what later trials' relative bounds are computed from)
METRICS_ATTR = "calibtune.constraint_metrics"


def constraint_values(
    constraints: tuple[Constraint, ...], label: Any, result: dict[str, Any], trials: list[Any]
) -> tuple[dict[str, float], dict[str, float]]:
    """An ended trial of loss ``label`` with last report ``result``: its constrained metrics
    (for `METRICS_ATTR`) and its constraint values by name (``str(constraint)``), relative
    bounds from the baseline trials among ``trials`` (COMPLETE Optuna trials holding
    `METRICS_ATTR`) and the ended trial itself. Optuna 5 keeps constraint values as the trial's
    ``constraints:<name>`` system attributes (`optuna.trial.Trial.set_constraint`); TPE,
    NSGA-II and GP read them from there (their ``constraints_func`` is deprecated)."""
    metrics = {c.metric: result.get(c.metric) for c in constraints}
    metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    done = [(t.params.get("loss"), t.user_attrs[METRICS_ATTR]) for t in trials
            if METRICS_ATTR in t.user_attrs and t.state.name == "COMPLETE"]  # fmt: skip
    base = baseline_values(constraints, [*done, (label, metrics)])
    values = violations(constraints, metrics, base)
    return metrics, {str(c): v for c, v in zip(constraints, values, strict=True)}


# ----------------------------------------------------------------------------- persisted study

#: user attribute naming the Tune trial an Optuna trial records (one Optuna trial per Tune trial)
TUNE_TRIAL_ATTR = "tune_trial_id"


def distributions(study: StudyConfig) -> dict[str, BaseDistribution]:
    """Every Optuna parameter of the define-by-run space and its distribution (the loss label
    first, then ``<label>/<param>`` for every loss, then ``trial/<key>``)."""
    out: dict[str, BaseDistribution] = {
        "loss": CategoricalDistribution([c.label for c in study.losses])
    }
    for c in study.losses:
        out.update({f"{c.label}/{n}": d for n, d in c.loss.space.dists.items()})
    out.update({f"trial/{k}": d for k, d in study.space.dists.items()})
    return out


def flat_params(config: dict[str, Any]) -> dict[str, Any]:
    """A Tune trial's config (OptunaSearch unflattens ``a/b`` names) back to Optuna's names."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update({f"{k}/{kk}": vv for kk, vv in flat_params(v).items()})
        else:
            out[k] = v
    return out


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's INFO lines ("Using an existing study ...") off while the driver records trials."""
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(level)


def open_optuna_study(study: StudyConfig, storage: str | optuna.storages.BaseStorage) -> Any:
    """The study's Optuna study in ``storage`` (created on first use, directions from the
    objectives)."""
    directions = ["minimize" if o.mode == "min" else "maximize" for o in study.search.objectives]
    with quiet_optuna():
        ot_study = optuna.create_study(
            study_name=study.name, storage=storage, directions=directions, load_if_exists=True
        )
    names = [o.metric for o in study.search.objectives]
    if ot_study.metric_names != names:  # the dashboards' axis titles
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            ot_study.set_metric_names(names)
    return ot_study


def record_trial(
    ot_study: Any,
    study: StudyConfig,
    tune_trial_id: str,
    config: dict[str, Any],
    state: str,
    values: list[float] | None = None,
    result: dict[str, Any] | None = None,
    curve: Mapping[int, float] | None = None,
) -> bool:
    """Add one ended Tune trial to the persisted Optuna study unless it is there already (by
    `TUNE_TRIAL_ATTR`); returns whether it was added. ``state``: ``COMPLETE`` (with ``values``,
    one per objective), ``FAIL`` or ``PRUNED`` (stopped early by ASHA). A COMPLETE trial of a
    constrained study also gets its constraint values (``result``: its last report) where
    `Trial.set_constraint` puts them (``constraints:<name>``), which optuna-dashboard reads.
    ``curve``: the first objective per epoch, the trial's intermediate values
    (`calibtune.record._curves`)."""
    if tune_trial_id in recorded_ids(ot_study):
        return False
    dists = distributions(study)
    params = {k: v for k, v in flat_params(config).items() if k in dists}
    user_attrs: dict[str, Any] = {TUNE_TRIAL_ATTR: tune_trial_id}
    system_attrs: dict[str, Any] = {}
    cons = study.search.constraints
    if cons and state == "COMPLETE" and result is not None:
        done = ot_study.get_trials(deepcopy=False)  # (constrained studies: bounds from all)
        metrics, named = constraint_values(cons, params.get("loss"), result, done)
        user_attrs[METRICS_ATTR] = metrics
        system_attrs = {f"constraints:{k}": v for k, v in named.items()}
    trial = optuna.trial.create_trial(
        params=params,
        distributions={k: dists[k] for k in params},
        values=values if state == "COMPLETE" else None,
        state=optuna.trial.TrialState[state],
        intermediate_values=dict(curve or {}),
        user_attrs=user_attrs,
        system_attrs=system_attrs,
    )
    ot_study.add_trial(trial)
    recorded_ids(ot_study).add(tune_trial_id)
    return True


def recorded_ids(ot_study: Any) -> set[str]:
    """The Tune trial ids (`TUNE_TRIAL_ATTR`) of ``ot_study``'s trials: read from its storage
    once per storage object, then kept up to date by `record_trial` (the driver, which holds
    the study's lock, is the study's only writer), so that recording a trial does not read back
    every trial of the study. The set lives on the storage object: a storage opened anew (a
    study folder replaced: `calibtune.readers._summary.rdb_storage`) reads its own."""
    storage = getattr(ot_study._storage, "_backend", ot_study._storage)  # Optuna's cache wrapper
    cache = storage.__dict__.setdefault("_calibtune_recorded", {})
    if ot_study._study_id not in cache:
        trials = ot_study.get_trials(deepcopy=False)
        cache[ot_study._study_id] = {t.user_attrs.get(TUNE_TRIAL_ATTR) for t in trials} - {None}
    return cache[ot_study._study_id]


def register_running(searcher: Any, tune_trial_id: str, config: dict[str, Any]) -> None:
    """Add a running trial with ``config``'s parameters to the in-memory study of Ray's
    `OptunaSearch` ``searcher`` under ``tune_trial_id``, as its ``suggest`` would have: a trial
    that started after the searcher's state was last saved, added back on resume
    (`calibtune.study._scheduling.replay`), so that its results and its end are told to the
    sampler like any other's."""
    space = searcher._space  # `DefineByRun`
    dists: dict[str, BaseDistribution] = {"loss": CategoricalDistribution(space.labels)}
    for label, items in space.loss_dists.items():
        dists.update({f"{label}/{n}": d for n, d in items})
    dists.update({f"trial/{k}": d for k, d in space.trial_dists})
    params = {k: v for k, v in flat_params(config).items() if k in dists}
    study = searcher._ot_study
    template = optuna.trial.create_trial(
        params=params,
        distributions={k: dists[k] for k in params},
        state=optuna.trial.TrialState.RUNNING,
    )
    number = study._storage.create_new_trial(study._study_id, template_trial=template)
    searcher._ot_trials[tune_trial_id] = optuna.trial.Trial(study, number)


def ended_state(
    study: StudyConfig, result: dict[str, Any] | None, error: bool
) -> tuple[str, list[float] | None]:
    """Optuna's state of an ended Tune trial: FAIL if it failed (or its objective is missing or
    not finite), PRUNED if ASHA stopped it (its last report lacks ``calibtune/done``), else
    COMPLETE with its objective values."""
    result = result or {}
    if error:
        return "FAIL", None
    if not result.get("calibtune/done"):
        return "PRUNED", None
    values = [result.get(o.metric) for o in study.search.objectives]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
        return "FAIL", None
    return "COMPLETE", [float(v) for v in values]  # type: ignore[arg-type]


def persist_ended(
    study: StudyConfig,
    storage: str | optuna.storages.BaseStorage,
    ended: list[tuple[str, dict[str, Any], dict[str, Any] | None, bool]],
    curves: Mapping[str, Mapping[int, float]] | None = None,
) -> int:
    """Record ended Tune trials ``(trial id, config, last result, failed)`` in the study's
    Optuna storage, each once (``curves``: their learning curves by trial id); returns how many
    were new."""
    ot_study = open_optuna_study(study, storage)
    added = 0
    for trial_id, config, result, error in ended:
        state, values = ended_state(study, result, error)
        curve = (curves or {}).get(trial_id)
        added += record_trial(ot_study, study, trial_id, config, state, values, result, curve)
    return added


# ----------------------------------------------------------------------------- study identity

#: user attribute of the Optuna study: the id of the study folder that owns it (its
#: ``calibtune_study.json``, `calibtune.studyfile._studydir.StudyState.study_id`)
STUDY_ID_ATTR = "calibtune.study_id"


def found_study(url: str, name: str) -> tuple[str | None, int] | None:
    """The Optuna study ``name`` in the RDB storage ``url``, read without writing anything
    (no table is created; an SQLite file that does not exist is not opened): its
    `STUDY_ID_ATTR` (None if unset) and its number of trials; None when there is no such study."""
    from sqlalchemy.exc import SQLAlchemyError

    if url.startswith("sqlite:///") and not os.path.isfile(url[len("sqlite:///") :].split("?")[0]):
        return None
    try:
        with quiet_optuna():
            storage = optuna.storages.RDBStorage(
                url, skip_compatibility_check=True, skip_table_creation=True
            )
    except (SQLAlchemyError, optuna.exceptions.OptunaError):
        return None  # no Optuna tables yet
    try:
        try:
            sid = storage.get_study_id_from_name(name)
        except (KeyError, SQLAlchemyError):
            return None
        attr = storage.get_study_user_attrs(sid).get(STUDY_ID_ATTR)
        return (None if attr is None else str(attr)), len(storage.get_all_trials(sid, False))
    finally:
        storage.engine.dispose()


def study_id_conflict(
    study: StudyConfig, url: str, state: Any, found: tuple[str | None, int] | None
) -> str | None:
    """Why the Optuna study ``found`` (`found_study`) in ``url`` is not the one of the study
    folder whose state is ``state`` (None: a new folder), in one line with the fix; None when
    it is: no such study yet, one with this folder's id, or one without an id that a folder of
    before study ids owns (kept) or that holds no trial (a new folder takes it)."""
    if found is None:
        return None
    attr, n = found
    mine = getattr(state, "study_id", None)
    if attr is None and (state is not None or n == 0):
        return None
    if attr is not None and attr == mine:
        return None
    what = "a new study folder" if state is None else f"this study folder (study id {mine})"
    whose = "another study folder's" if attr else "one without a study id"
    shown = _shown_url(url)
    return (
        f"search.optuna_storage: expected the Optuna study {study.name!r} in {shown} to be "
        f"{what}'s, found {whose} ({f'study id {attr}, ' if attr else ''}{n} trials: a folder "
        "deleted and run again, or this study under another storage); give the study another "
        f"name, or delete the old record: optuna delete-study --study-name {study.name} "
        f"--storage {shown}"
    )


def bind_study(study: StudyConfig, url: str | None, state: Any) -> str:
    """The study folder's id (``state``'s, else a new one) after checking the Optuna study in
    ``url`` (a named ``search.optuna_storage``) belongs to it (`study_id_conflict`: raises
    `calibtune.studyfile._studydir.StudyDirError`) and recording the id there (`STUDY_ID_ATTR`,
    the Optuna study created if new). Without ``url`` (the folder's own ``optuna.db``) nothing
    else can share it: the id only."""
    study_id = getattr(state, "study_id", None) or new_study_id()
    if not url:
        return study_id
    conflict = study_id_conflict(study, url, state, found_study(url, study.name))
    if conflict:
        raise StudyDirError(conflict)
    ot_study = open_optuna_study(study, url)
    if ot_study.user_attrs.get(STUDY_ID_ATTR) != study_id:
        ot_study.set_user_attr(STUDY_ID_ATTR, study_id)
    return study_id


def _shown_url(url: str) -> str:
    """``url`` with its password masked (errors name the storage, never its secret)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1] if "@" in url else url


# ----------------------------------------------------------------------------- a bucket's copy

#: the Optuna SQLite file: in the study folder on a disk; for a study in a bucket, on the
#: driver's disk (`calibtune.studyfile._studydir.StudyDir.optuna_db`) with its copy of that name in
#: the study folder
OPTUNA_FILE = "optuna.db"

_PUSHED: dict[str, tuple[int, ...]] = {}  # local SQLite file -> its signature when last copied

SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


def copied_sqlite(study: StudyConfig, sd: Any) -> bool:
    """Whether the study's Optuna study is SQLite on the driver's disk with a copy in the study's
    storage (`push_optuna_copy`, `pull_optuna_copy`): a study in a bucket (``sd``, a
    `calibtune.studyfile._studydir.StudyDir`) that names no ``search.optuna_storage``."""
    return not study.search.optuna_storage and not sd.path.is_local


class DriverSQLite(str):
    """The SQLAlchemy URL (a ``str``) of a bucket study's Optuna SQLite on the driver's disk,
    ``sqlite:///<cache>/…/optuna.db`` (`calibtune.studyfile._studydir.StudyDir.optuna_db`). Tune
    pickles it with the callbacks that record trials there; unpickled, it names that file on
    the unpickling driver's disk, so that a `resume` on a machine whose cache folder is
    elsewhere (another user, another ``$XDG_CACHE_HOME``) writes where `pull_optuna_copy` put
    the copy, not under a path of the first driver's machine."""

    sd: Any

    def __new__(cls, sd: Any) -> DriverSQLite:
        url = super().__new__(cls, f"sqlite:///{sd.optuna_db}")
        url.sd = sd
        return url

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return DriverSQLite, (self.sd,)


def sqlite_url(study: StudyConfig, sd: Any) -> str:
    """The URL of the study's own Optuna SQLite (`StudyDir.optuna_db`): a `DriverSQLite` for a
    study in a bucket (`copied_sqlite`), else ``<study folder>/optuna.db``'s."""
    return DriverSQLite(sd) if copied_sqlite(study, sd) else f"sqlite:///{sd.optuna_db}"


def backup_sqlite(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """A consistent copy of the SQLite database ``src`` in the new file ``dst``, taken while
    others may write to ``src``: SQLite's online backup API (``sqlite3.Connection.backup``)
    copies every page under one read transaction, so the copy is ``src`` as of one commit (a
    plain file copy could catch a write half done). A hot journal left by a process that died
    mid-write is rolled back first, as any SQLite reader does.

    >>> import sqlite3, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> with sqlite3.connect(d / "a.db") as c:
    ...     _ = c.execute("create table t (x)"); _ = c.execute("insert into t values (1)")
    >>> backup_sqlite(d / "a.db", d / "b.db")
    >>> sqlite3.connect(d / "b.db").execute("select x from t").fetchall()
    [(1,)]
    """
    import sqlite3

    if not os.path.isfile(src):  # connecting would create an empty database
        raise FileNotFoundError(2, "No such file", os.fspath(src))
    # the driver's summary thread may hold the write lock: wait for its commit
    with (
        contextlib.closing(sqlite3.connect(src, timeout=60.0)) as s,
        contextlib.closing(sqlite3.connect(dst)) as d,
    ):
        s.backup(d)


def _signature(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """What changes whenever a transaction commits to the SQLite file ``path``: its size,
    mtime and header's file change counter (bytes 24-27, bumped at each commit in rollback
    mode, whatever the file system's mtime granularity), and the size and mtime of a WAL."""
    st = os.stat(path)
    with open(path, "rb") as f:
        counter = int.from_bytes(f.read(28)[24:28] or b"\0", "big")
    try:
        w = os.stat(f"{os.fspath(path)}-wal")
        tail: tuple[int, ...] = (w.st_size, w.st_mtime_ns)
    except FileNotFoundError:
        tail = ()
    return (st.st_size, st.st_mtime_ns, counter, *tail)


def save_sqlite_copy(local: str | os.PathLike[str], target: Any) -> None:
    """Put a consistent copy (`backup_sqlite`) of the SQLite file ``local`` at ``target`` (a
    `calibtune.storage.Storage` file), replacing it atomically: the copy is taken into a temp
    file beside ``local``, then written through the storage owner (one complete upload to a
    bucket), so a reader of ``target`` finds the previous copy or the new one, never a part."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(dir=os.path.dirname(local), prefix=".copy-") as tmp:
        snapshot = os.path.join(tmp, OPTUNA_FILE)
        backup_sqlite(local, snapshot)
        with open(snapshot, "rb") as src, target.open_output() as out:
            shutil.copyfileobj(src, out)


def load_sqlite_copy(source: Any, local: str | os.PathLike[str]) -> bool:
    """Replace the SQLite file ``local`` by the copy at ``source`` (a `calibtune.storage.Storage`
    file, `save_sqlite_copy`); returns whether there was one. Without one ``local`` is removed
    (what it held is not the study's: a study folder deleted and run again). The copy is checked
    (an SQLite database whose ``PRAGMA quick_check`` passes: `StudyDirError` otherwise, one
    line) before it replaces ``local`` atomically; a journal or WAL left beside ``local`` is
    removed first, as it belongs to the file replaced (SQLite would apply it to the copy)."""
    import shutil
    import sqlite3

    local = os.fspath(local)
    os.makedirs(os.path.dirname(local), exist_ok=True)
    for side in ("-journal", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(local + side)
    if not source.is_file():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(local)
        return False
    part = f"{local}.{os.getpid()}.part"
    try:
        with source.open_input() as src, open(part, "wb") as out:
            shutil.copyfileobj(src, out)
            out.flush()
            os.fsync(out.fileno())
        with open(part, "rb") as f:
            ok = f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
        if ok:
            try:
                with contextlib.closing(sqlite3.connect(part)) as c:
                    ok = c.execute("PRAGMA quick_check").fetchall() == [("ok",)]
            except sqlite3.DatabaseError:  # "file is not a database", "malformed"
                ok = False
        if not ok:
            raise StudyDirError(
                f"{source}: expected the SQLite copy of the study's Optuna study, found another "
                "or a damaged file; move it away and `resume` again (the Optuna record then "
                "starts afresh; MLflow keeps every trial)"
            )
        os.replace(part, local)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
    _PUSHED[local] = _signature(local)  # the copy is what `source` holds already
    return True


def push_optuna_copy(study: StudyConfig, sd: Any) -> str | None:
    """For a study whose Optuna SQLite is on the driver's disk (`copied_sqlite`): put its
    consistent copy in the study folder (`save_sqlite_copy`) unless nothing was committed since
    the last one. Called when Tune saves its experiment state (`optuna_copy_callbacks`) and at
    a session's end. Never raises: returns a one-line warning when the copy failed (the next
    save tries again), else None."""
    if not copied_sqlite(study, sd):
        return None
    local = os.fspath(sd.optuna_db)
    try:
        if not os.path.isfile(local):
            return None
        sig = _signature(local)
        if _PUSHED.get(local) == sig:
            return None
        save_sqlite_copy(local, sd.path / OPTUNA_FILE)
    except Exception as exc:
        return (
            f"[calibtune] warning: the Optuna study's copy in {sd.path / OPTUNA_FILE} not "
            f"updated ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); retried at "
            "Tune's next save"
        )
    _PUSHED[local] = sig
    return None


def pull_optuna_copy(study: StudyConfig, sd: Any) -> None:
    """At the start of a session (`run`, `resume`, ``--more``) of a study whose Optuna SQLite is
    on the driver's disk (`copied_sqlite`), with the study's lock held: that file becomes the
    copy in the study folder (`load_sqlite_copy`), on any machine. The copy, not a file this
    disk kept, since it goes with Tune's state saved at the same moment."""
    if copied_sqlite(study, sd):
        load_sqlite_copy(sd.path / OPTUNA_FILE, sd.optuna_db)


def optuna_copy_callbacks(study: StudyConfig, sd: Any) -> list[Any]:
    """The Tune callback that puts the Optuna study's copy in the study folder each time Tune
    saves its experiment state (with the searcher's: Tune asks every callback for its state
    then, ``Callback.get_state``) for a study whose SQLite is on the driver's disk
    (`copied_sqlite`); none otherwise. Built on call: importing this module does not import Ray.
    The callback holds the study folder, not a local path: Tune pickles its callbacks, and a
    `resume` on another machine finds the file where that machine keeps it."""
    if not copied_sqlite(study, sd):
        return []
    from ray.tune import Callback

    class OptunaCopy(Callback):
        def get_state(self) -> dict | None:  # type: ignore[override]
            warning = push_optuna_copy(study, sd)
            if warning:
                print(warning, flush=True)
            return None  # nothing of its own to save

    return [OptunaCopy()]


def optuna_storage_url(study: StudyConfig, sd: StudyDir) -> str:
    """The study's Optuna RDB storage: ``search.optuna_storage`` (relative SQLite paths against
    the working directory) or SQLite ``<study folder>/optuna.db`` (for a study in a bucket, in
    the driver's cache, its copy in the bucket: `calibtune.record._optuna.push_optuna_copy`)."""
    if study.search.optuna_storage:
        return resolve_tracking_uri(study.search.optuna_storage)
    return sqlite_url(study, sd)  # in a bucket: the driver's file wherever Tune unpickles it
