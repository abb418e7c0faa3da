"""The study directory: where a study lives, its one state file, its lock, and restore checks.

Layout of ``<storage>/<name>/``::

    calibtune_study.json   the state (tracking URI, experiment, parent run, study file path)
    study.yaml             the validated study text (what `resume` and the tables re-read)
    optuna.db              the Optuna study (record of every ended trial; optuna-dashboard)
    .calibtune.lock        held (``flock``) by the one driver running the study; names it
    trials/<trial>-seedN/  each trial's checkpoints and artifacts (the trial engine's folders)
    tuner.pkl, experiment_state-*.json, ...   Ray Tune's own state (restored by `resume`)

The folder is a `calibtune.storage.Storage` (a local path or a bucket, e.g.
``s3://calib/studies``), and every read and write of it goes through that owner. Every write of
calibtune's files is atomic (temp file, fsync, rename on a disk; one complete upload in a
bucket), so a crash or a full disk leaves the previous version, never a truncated one. The lock
is an advisory ``flock`` on an open file on a disk (the kernel drops it when the driver dies, so
a lock left by a killed driver is stale without any clean-up) and a lock object with a lease in
a bucket (`calibtune.storage.hold_lock`). ``optuna.db`` is SQLite, which needs a POSIX disk:
a study in a bucket keeps it in the driver's cache (`StudyDir.optuna_db`) and its ``optuna.db``
is a copy (`calibtune.record._optuna.push_optuna_copy`), unless it names an RDB server
(``search.optuna_storage``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickletools
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from calibtune._io import cache_home
from calibtune._names import check_name
from calibtune._yaml import load_text
from calibtune.storage import (
    Storage,
    StorageError,
    StorageLockedError,
    hold_lock,
    lease_note,
    open_storage,
)
from calibtune.studyfile._config import head_from_text, study_from_text
from calibtune.studyfile._diskfull import request_stop
from calibtune.studyfile._spaces import load_yaml

__all__ = [
    "STATE_FILE",
    "StudyDir",
    "StudyDirError",
    "StudyLockedError",
    "StudyState",
    "default_storage",
    "new_study_id",
]

STATE_FILE = "calibtune_study.json"
STUDY_COPY = "study.yaml"
LOCK_FILE = ".calibtune.lock"
TUNER_FILE = "tuner.pkl"


class StudyDirError(ValueError):
    """A study folder that cannot be used as asked (one line: what was expected, what found)."""


class StudyLockedError(StudyDirError):
    """Another live driver holds the study's lock."""


def default_storage(cwd: str | Path | None = None) -> Path:
    """The embedded default storage folder: ``<cwd>/runs/studies``."""
    return Path(cwd or os.getcwd()).resolve() / "runs" / "studies"


def new_study_id() -> str:
    """A new study folder's id (random, 32 hex digits): what tells its Optuna study in a shared
    storage from another folder's of the same name (`calibtune.record._optuna.bind_study`)."""
    import uuid

    return uuid.uuid4().hex


@dataclass(frozen=True)
class StudyState:
    """What a study records about itself (`calibtune_study.json`); ``study_id``: the folder's
    id (`new_study_id`; None in a folder written before ids existed)."""

    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    study_path: str | None = None
    study_id: str | None = None

    @classmethod
    def from_json(cls, text: str, where: Storage) -> StudyState:
        try:
            d = json.loads(text)
            return cls(
                tracking_uri=str(d["tracking_uri"]),
                experiment_id=str(d["experiment_id"]),
                parent_run_id=str(d["parent_run_id"]),
                study_path=d.get("study_path"),
                study_id=None if d.get("study_id") is None else str(d["study_id"]),
            )
        except (ValueError, KeyError, TypeError):
            raise StudyDirError(
                f"{where}: expected calibtune's study state (JSON with tracking_uri, "
                f"experiment_id, parent_run_id), got {_excerpt(text)}"
            ) from None


def _excerpt(text: str, n: int = 40) -> str:
    if not text.strip():
        return "an empty file"
    s = " ".join(text.split())
    return repr(s if len(s) <= n else s[:n] + "…")


def _open(where: str | os.PathLike[str] | Storage, key: str = "storage") -> Storage:
    try:
        return open_storage(where, key)
    except StorageError as exc:
        raise StudyDirError(str(exc)) from None


@dataclass(frozen=True)
class StudyDir:
    """One study's folder ``root / name`` (``root`` a `Storage`; ``name`` a valid study name)."""

    root: Storage
    name: str

    @classmethod
    def at(cls, name: str, storage: str | Path | Storage | None = None) -> StudyDir:
        """The folder of study ``name`` under ``storage`` (default `default_storage`)."""
        root = _open(storage or default_storage())
        try:
            check_name(name, "study name")
        except ValueError as exc:
            raise StudyDirError(str(exc)) from None
        return cls(root, name)

    @classmethod
    def find(
        cls, ref: str | Path | Storage, storage: str | Path | Storage | None = None
    ) -> StudyDir:
        """A study by its folder (holding the state file; a path or a URI) or its name under
        ``storage``."""
        if isinstance(ref, Storage):
            ref = ref.uri
        text = os.fspath(ref)
        p = Path(text).expanduser()
        if "://" in text or p.exists():
            folder = _open(text)
            if (folder / STATE_FILE).is_file():
                return cls(folder.parent, folder.name)
        sd = None
        if "/" not in text:  # a study name, unless it is no valid one and a path is
            try:
                sd = cls.at(text, storage)
            except StudyDirError:
                if not p.exists():
                    raise
            if sd is not None and sd.state_file.is_file():
                return sd
        raise StudyDirError(_no_study(text, p, sd))

    @property
    def path(self) -> Storage:
        return self.root / self.name

    @property
    def state_file(self) -> Storage:
        return self.path / STATE_FILE

    @property
    def trials_dir(self) -> Storage:
        return self.path / "trials"

    @property
    def optuna_db(self) -> Path:
        """The study's embedded Optuna storage (SQLite, which needs a POSIX disk with working
        locks) unless the study names another: ``optuna.db`` in the study folder on a disk, in
        the driver's cache folder of the study (`local_scratch`) for a study in a bucket, whose
        ``optuna.db`` is then a copy (`calibtune.record._optuna.push_optuna_copy`)."""
        return self.local_scratch() / "optuna.db"

    def local_scratch(self) -> Path:
        """A local folder for this driver's own notes about the study (e.g. retried requests):
        the study folder on a disk, a cache folder for a study in a bucket."""
        if self.path.is_local:
            return self.path.local_path()
        return cache_home() / "studies" / self.path.scheme / self.path.path

    def has_tune_state(self) -> bool:
        """Whether Ray Tune has a run of this study to restore: its Tuner saved, and not
        `never_started` (a crash between ``Tuner(...)``, which writes ``tuner.pkl``, and
        Tune's first save leaves nothing to resume: `run` starts such a study again)."""
        return (self.path / TUNER_FILE).exists() and not self.never_started()

    def never_started(self) -> bool:
        """Whether no trial of the study ever started: no Ray Tune experiment state (Tune saves
        one before it starts the first trial: `calibtune.study._scheduling.DurableStarts`), no
        record of a trial start, no trial folder."""
        starts = self.path / "trial_starts"  # `_scheduling.STARTS`: <round>/<trial id>.json
        return not (
            self.path.glob("experiment_state-*.json")
            or any((starts / r).listdir() for r in starts.listdir())
            or self.trials_dir.listdir()
        )

    def read_state(self) -> StudyState:
        return StudyState.from_json(_read(self.state_file), self.state_file)

    def write_state(self, state: StudyState) -> None:
        """Record ``state``; without a ``study_id`` the recorded one stays (a folder keeps its
        id for good)."""
        if state.study_id is None and self.state_file.is_file():
            with contextlib.suppress(StudyDirError):
                state = replace(state, study_id=self.read_state().study_id)
        self.state_file.write_text(json.dumps(asdict(state), indent=2))

    def read_study(self) -> Any:
        """The study as it was run (`StudyConfig`), re-validated from its saved copy."""
        copy = self.path / STUDY_COPY
        return study_from_text(_read(copy), str(copy))

    def read_head(self) -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
        """The study's name, objectives (`Objective`) and constraints (`Constraint`) from its
        saved copy, the rest of it not re-validated (`read_study` does that)."""
        copy = self.path / STUDY_COPY
        return head_from_text(_read(copy), str(copy))

    def write_study(self, study: Any) -> None:
        """Save the study self-contained (search spaces inlined): resuming needs no other file."""
        (self.path / STUDY_COPY).write_text(self_contained(study))

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the study's lock for the block; `StudyLockedError` if a live driver holds it.
        The folders this call created (the study's, and its storage's if new) are removed again
        on the way out while nothing else was written to them (a study refused before it
        started leaves nothing behind, not even an empty ``runs/studies``)."""
        made: list[Path] = []
        if self.path.is_local:
            here = self.path.local_path()
            made = [p for p in (here, *here.parents) if not p.exists()]
        try:
            with hold_lock(self.path / LOCK_FILE, on_lost=self._lock_lost):
                yield
        except StorageLockedError as exc:
            raise StudyLockedError(self._held_by(exc.holder)) from None
        finally:
            if made and (self.path / LOCK_FILE).exists() and self.path.listdir() == [LOCK_FILE]:
                (self.path / LOCK_FILE).delete()
                for folder in made:  # deepest first; one another process uses stays
                    with contextlib.suppress(OSError):
                        folder.rmdir()

    def _lock_lost(self, reason: str) -> None:
        """The lease of the study's lock in a bucket was lost: stop the study the graceful way
        a full disk stops it (state saved, one line, exit 75), before anyone else can take it."""
        request_stop(
            self.path,
            f"study {self.name}: {reason}; the study stopped with its state saved: once no other "
            f"driver runs it, `calibtune resume {self.path}` continues it",
        )

    def _held_by(self, h: dict[str, Any] | None) -> str:
        try:
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(h["since"])))  # type: ignore[index]
            who = f"pid {h['pid']} on {h['host']} since {since}"  # type: ignore[index]
        except (KeyError, TypeError, ValueError):
            who = "another process"
        return (
            f"study {self.name}: expected no other driver on {self.path}, found {who} running it"
            f"{lease_note(h)}; wait for it to end (or stop it), then run or resume again"
        )

    def check_restorable(self) -> None:
        """Refuse, in one line, a folder Ray Tune could not restore completely (a truncated or
        missing state file after a crash or a full disk) before Ray unpickles anything. A study
        that `never_started` passes: `resume` starts it (nothing was lost)."""
        if self.never_started() and (self.path / STUDY_COPY).is_file():
            return
        tuner = self.path / TUNER_FILE
        if not tuner.is_file() or not _is_tuner_pickle(tuner):
            raise StudyDirError(
                f"{tuner}: expected Ray Tune's saved Tuner, found "
                f"{'another file' if tuner.is_file() else 'none'}; this study cannot be resumed "
                "(its finished trials stay in MLflow): run it under a new name"
            )
        states = self.path.glob("experiment_state-*.json")
        if not states:
            raise StudyDirError(
                f"{self.path}: expected Ray Tune's experiment_state-*.json, found none; this study "
                "cannot be resumed (its finished trials stay in MLflow): run it under a new name"
            )
        for f in states:
            try:
                json.loads(_read(f))
            except ValueError:
                raise StudyDirError(
                    f"{f}: expected Ray Tune's experiment state (JSON), found a truncated or "
                    "corrupt file (was the disk full?); this study cannot be resumed completely "
                    "(its finished trials stay in MLflow): free space and run it under a new name"
                ) from None


def _no_study(ref: str, p: Path, sd: StudyDir | None) -> str:
    """Why ``ref`` names no study that has run: what it is instead, and what would."""
    expected = f"{ref}: expected a study folder (holding {STATE_FILE}) or a study name"
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        return f"{expected}, got a file; `calibtune run {ref}` continues the study it describes"
    if p.is_file():
        return f"{expected}, got a file"
    if p.is_dir():
        return f"{expected}, got a folder without {STATE_FILE}"
    if sd is not None:
        return (
            f"{expected}, found no study {ref!r} under {sd.root}; run it first with "
            "`calibtune run STUDY.yaml`, or pass --storage"
        )
    return f"{expected}, found nothing at that path"


def _is_tuner_pickle(path: Storage) -> bool:
    """Whether ``path`` is a pickle of Ray Tune's Tuner state, judged by reading its opcodes
    (`pickletools.genops` executes nothing) for the names that state always holds."""
    names: set[str] = set()
    try:
        with path.open_input() as f:
            for _op, arg, _pos in pickletools.genops(f):
                if isinstance(arg, str):
                    names.add(arg)
    except Exception:  # not a pickle, or a truncated one
        return False
    return {"_tuner_kwargs", "ray.tune.tune_config"} <= names


def self_contained(study: Any) -> str:
    """The study's YAML with its search-space files inlined (``name`` + ``params``)."""
    raw = load_text(study.text, "study")
    for i, item in enumerate(raw.get("losses") or []):
        if isinstance(item, dict) and isinstance(item.get("space"), str):
            space = load_yaml(study.losses[i].loss.path)
            item.pop("space")
            item["name"] = space["loss"]
            item["params"] = space.get("params") or {}
    return yaml.safe_dump(raw, sort_keys=False)


def _read(path: Storage) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise StudyDirError(f"{path}: expected a file, found none") from None
    except (UnicodeDecodeError, OSError) as e:
        raise StudyDirError(f"{path}: expected a readable UTF-8 file, got {e}") from None
