"""A study in a bucket needs no database server (issue 41 item 6): its Optuna study is SQLite on
the driver's disk, with a consistent copy in the study folder put there at each of Tune's state
saves and at the end, and brought back by the next session on any machine. The units (the
backup, the copy in a bucket and back) against an S3-compatible server (moto on 127.0.0.1), then
one study run as users run it, its driver SIGKILLed, resumed with the driver's cache wiped.
Today's code refused such a study (``search.optuna_storage: expected an RDB URL``)."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

import optuna
import pytest
import yaml
from _s3 import bucket_study, start_s3

from calibtune.record._optuna import (
    OPTUNA_FILE,
    backup_sqlite,
    load_sqlite_copy,
    persist_ended,
    pull_optuna_copy,
    push_optuna_copy,
)
from calibtune.studyfile._config import study_from_text
from calibtune.studyfile._studydir import StudyDir, StudyDirError

DONE = {"calibtune/done": 1, "val/ece": 0.1}


@pytest.fixture(scope="module")
def s3():
    server = start_s3()
    server.bucket("calib")
    yield server
    server.stop()


@pytest.fixture
def env(s3, monkeypatch, tmp_path: Path) -> dict[str, str]:
    """The standard AWS variables for the server and a driver cache of this test's own."""
    out = {**s3.env(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for k, v in out.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return out


def _raw(tmp: Path, name: str, samples: int = 2) -> dict:
    return bucket_study(name, tmp, epochs=1, samples=samples, optuna_in_tmp=False)


def _copy_in_bucket(s3, tmp: Path, name: str) -> list:
    """The Optuna study in the study folder's copy (read as any SQLite file), [] if none."""
    key = f"studies/{name}/{OPTUNA_FILE}"
    if key not in s3.keys("calib", f"studies/{name}/"):
        return []
    local = tmp / f"fetched-{time.monotonic_ns()}.db"
    local.write_bytes(s3.client().get_object(Bucket="calib", Key=key)["Body"].read())
    return optuna.load_study(study_name=name, storage=f"sqlite:///{local}").get_trials()


def _ended(*ids: str) -> list:
    return [(i, {"loss": "cross_entropy"}, DONE, False) for i in ids]


def _bucket_study(tmp: Path, name: str, bucket: str = "calib") -> tuple:
    """A study in ``s3://BUCKET/studies`` and its folder, with the driver's cache folder made
    (what the session's start, `pull_optuna_copy`, makes)."""
    study = study_from_text(yaml.safe_dump(_raw(tmp, name)), "unit")
    sd = StudyDir.at(name, f"s3://{bucket}/studies")
    sd.optuna_db.parent.mkdir(parents=True, exist_ok=True)
    return study, sd


# ------------------------------------------------------------------------------ units


def test_the_backup_is_the_database_as_of_its_last_commit(tmp_path: Path) -> None:
    """A copy taken while another connection is inside a write transaction holds every commit
    before it and nothing of the open one (a file copy could hold a half-written page)."""
    src, dst = tmp_path / "a.db", tmp_path / "b.db"
    writer = sqlite3.connect(src, isolation_level=None)
    writer.execute("create table t (x)")
    writer.execute("insert into t values (1)")
    writer.execute("begin immediate")  # the write lock held, as the driver's summary thread does
    writer.execute("insert into t values (2)")
    backup_sqlite(src, dst)
    writer.execute("commit")
    writer.close()
    assert sqlite3.connect(dst).execute("select x from t").fetchall() == [(1,)]
    with pytest.raises(FileNotFoundError):  # never an empty database made up for a missing one
        backup_sqlite(tmp_path / "none.db", tmp_path / "c.db")
    assert not (tmp_path / "none.db").exists()


def test_the_url_names_the_unpickling_drivers_file(s3, env, tmp_path, monkeypatch) -> None:
    """Tune pickles the callbacks that record trials with the study's Optuna URL; a `resume` on
    a machine whose cache folder is elsewhere unpickles them: the URL then names that machine's
    file (the first driver's path may not exist there: every refresh failed with "unable to
    open database file")."""
    import cloudpickle

    from calibtune.record._optuna import optuna_storage_url

    study = study_from_text(yaml.safe_dump(_raw(tmp_path, "moved")), "unit")
    url = optuna_storage_url(study, StudyDir.at("moved", "s3://calib/studies"))
    tail = "calibtune/studies/s3/calib/studies/moved/optuna.db"
    assert url == f"sqlite:///{tmp_path}/cache/{tail}"
    pickled = cloudpickle.dumps(lambda: url)  # a closure, as Tune pickles a callback's
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))
    assert cloudpickle.loads(pickled)() == f"sqlite:///{tmp_path}/elsewhere/{tail}"


def test_a_bucket_study_keeps_its_optuna_study_across_drivers(s3, env, tmp_path: Path) -> None:
    """The copy goes to the bucket, a second push of an unchanged file uploads nothing, and a
    driver with an empty cache continues the same Optuna study: the new round's sampler history
    (`optuna_history`, what ``--more`` seeds it with) holds the earlier trials, and a new trial
    is numbered after them."""
    from calibtune.record._optuna import optuna_storage_url
    from calibtune.study._extend import optuna_history

    name = "unitcopy"
    study = study_from_text(yaml.safe_dump(_raw(tmp_path, name)), "unit")
    sd = StudyDir.at(name, "s3://calib/studies")
    url = optuna_storage_url(study, sd)
    assert url == f"sqlite:///{tmp_path / 'cache' / 'calibtune' / 'studies' / 's3' / 'calib'}" + (
        f"/studies/{name}/optuna.db"
    )  # the driver's disk, never a path named after the bucket
    pull_optuna_copy(study, sd)  # a new study: nothing in the bucket, nothing here
    assert not sd.optuna_db.exists()
    persist_ended(study, url, _ended("a", "b"))
    assert push_optuna_copy(study, sd) is None
    first = _copy_in_bucket(s3, tmp_path, name)
    assert [(t.number, t.user_attrs["tune_trial_id"]) for t in first] == [(0, "a"), (1, "b")]

    key = f"studies/{name}/{OPTUNA_FILE}"
    s3.client().delete_object(Bucket="calib", Key=key)
    assert push_optuna_copy(study, sd) is None  # nothing committed since: nothing sent
    assert key not in s3.keys("calib", f"studies/{name}/")
    persist_ended(study, url, _ended("c"))
    push_optuna_copy(study, sd)
    assert len(_copy_in_bucket(s3, tmp_path, name)) == 3

    shutil.rmtree(tmp_path / "cache")  # another machine: an empty driver cache
    pull_optuna_copy(study, sd)
    history = optuna_history(study, optuna_storage_url(study, sd))
    assert [t.user_attrs["tune_trial_id"] for t in history] == ["a", "b", "c"]
    persist_ended(study, url, _ended("d"))
    push_optuna_copy(study, sd)
    after = _copy_in_bucket(s3, tmp_path, name)
    assert [(t.number, t.user_attrs["tune_trial_id"]) for t in after] == [
        (0, "a"),
        (1, "b"),
        (2, "c"),
        (3, "d"),
    ]
    assert after[0].datetime_complete == first[0].datetime_complete  # the same record


def test_the_bucket_copy_replaces_what_the_driver_disk_kept(s3, env, tmp_path: Path) -> None:
    """A session starts from the study folder's copy: a file left on this disk by an earlier
    study of that name (deleted and run again) is removed when the folder holds none, and a
    journal beside it never reaches the copy brought back."""
    name = "stale"
    study, sd = _bucket_study(tmp_path, name)
    local = sd.optuna_db
    persist_ended(study, f"sqlite:///{local}", _ended("old"))
    Path(f"{local}-journal").write_bytes(b"not ours")
    pull_optuna_copy(study, sd)
    assert not local.exists() and not Path(f"{local}-journal").exists()

    persist_ended(study, f"sqlite:///{local}", _ended("new"))
    push_optuna_copy(study, sd)
    Path(f"{local}-journal").write_bytes(b"a journal of the file replaced")
    pull_optuna_copy(study, sd)
    assert not Path(f"{local}-journal").exists()
    got = optuna.load_study(study_name=name, storage=f"sqlite:///{local}").get_trials()
    assert [t.user_attrs["tune_trial_id"] for t in got] == ["new"]


def test_a_copy_that_is_no_sqlite_database_is_refused_in_one_line(s3, env, tmp_path) -> None:
    name = "damaged"
    study, sd = _bucket_study(tmp_path, name)
    persist_ended(study, f"sqlite:///{sd.optuna_db}", _ended("kept"))
    before = sd.optuna_db.read_bytes()
    for body in (b"SQLite format 3\x00" + b"\x00" * 200, b"<html>gateway</html>"):
        (sd.path / OPTUNA_FILE).write_bytes(body)
        with pytest.raises(StudyDirError) as info:
            load_sqlite_copy(sd.path / OPTUNA_FILE, sd.optuna_db)
        line = str(info.value)
        assert "\n" not in line and f"s3://calib/studies/{name}/optuna.db" in line
        assert "expected the SQLite copy" in line
        assert sd.optuna_db.read_bytes() == before  # the driver's file untouched
    assert sorted(p.name for p in sd.optuna_db.parent.iterdir()) == ["optuna.db"]  # no .part


def test_a_failed_upload_is_a_warning_and_is_sent_again(s3, env, tmp_path: Path) -> None:
    """A copy the store refuses (here: no such bucket) never stops the study; the next save
    sends it."""
    name = "nobucket"
    study, sd = _bucket_study(tmp_path, name, "gone")
    persist_ended(study, f"sqlite:///{sd.optuna_db}", _ended("a"))
    warning = push_optuna_copy(study, sd)
    assert warning is not None and "\n" not in warning
    assert warning.startswith("[calibtune] warning: the Optuna study's copy in s3://gone/")
    s3.bucket("gone")
    assert push_optuna_copy(study, sd) is None
    assert f"studies/{name}/{OPTUNA_FILE}" in s3.keys("gone", "studies/")


def test_a_study_on_a_disk_or_naming_a_server_gets_no_copy(s3, env, tmp_path: Path) -> None:
    """The copy is for a bucket study's SQLite alone: on a disk ``optuna.db`` is in the study
    folder already; a named ``search.optuna_storage`` is the study's record."""
    from calibtune.record._optuna import optuna_copy_callbacks, optuna_storage_url

    on_disk = study_from_text(yaml.safe_dump(_raw(tmp_path, "disk")), "unit")
    sd = StudyDir.at("disk", tmp_path / "studies")
    assert optuna_storage_url(on_disk, sd) == f"sqlite:///{tmp_path / 'studies/disk/optuna.db'}"
    raw = _raw(tmp_path, "named")
    raw["search"]["optuna_storage"] = f"sqlite:///{tmp_path / 'named.db'}"
    named = study_from_text(yaml.safe_dump(raw), "unit")
    sd.optuna_db.parent.mkdir(parents=True)
    for study, where in ((on_disk, sd), (named, StudyDir.at("named", "s3://calib/studies"))):
        persist_ended(study, optuna_storage_url(study, where), _ended("a"))
        assert push_optuna_copy(study, where) is None
        assert optuna_copy_callbacks(study, where) == []
    assert s3.keys("calib", "studies/named/") == []


# ------------------------------------------------------------------------------ a study


# `long`: a bucket study killed and resumed stays in `make test` as
# test_storage_s3_study.py::test_study_in_a_bucket_is_killed_and_resumed_exactly_once (and the
# units above keep the Optuna copy's steps)
@pytest.mark.long
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_bucket_study_without_a_database_server_survives_its_driver(s3, tmp_path) -> None:
    """`calibtune run` on ``s3://`` with no ``search.optuna_storage`` (refused by today's code):
    the copy in the bucket holds the ended trials by a Tune state save, the driver is SIGKILLed
    with the third trial starting, and `resume` from a wiped driver cache continues the same
    Optuna study: the first two records as they were, the third numbered after them."""
    from test_faults import _assert_nothing_lost, _kill_group, _start, _wait

    name = "nodbserver"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(_raw(tmp_path, name, samples=3), sort_keys=False))
    env = {**s3.env(), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = _start(
        tmp_path,
        ["run", str(path), "--quiet"],
        "run.log",
        CALIBTUNE_FAILPOINT="trial_start",
        CALIBTUNE_FAILPOINT_SKIP="2",
        TUNE_GLOBAL_CHECKPOINT_S="2",  # Tune's periodic save, which carries the copy along
        **env,
    )
    _wait((tmp_path / "trial_start.hit").exists, proc, "the third trial's start")
    copied: list = []

    def two_in_the_copy() -> bool:
        copied[:] = _copy_in_bucket(s3, tmp_path, name)
        return len(copied) == 2

    _wait(two_in_the_copy, proc, "the copy with two trials", timeout=240)
    local = tmp_path / "cache" / "calibtune" / "studies" / "s3" / "calib" / "studies" / name
    assert (local / "optuna.db").is_file()  # the driver's SQLite, on its disk
    _kill_group(proc)
    shutil.rmtree(tmp_path / "cache")  # a resume on another machine, whose cache is elsewhere
    env["XDG_CACHE_HOME"] = str(tmp_path / "other")

    res = _start(tmp_path, ["resume", f"s3://calib/studies/{name}", "--quiet"], "resume.log", **env)
    assert res.wait(timeout=600) == 0, (tmp_path / "resume.log").read_text()[-3000:]
    log = (tmp_path / "resume.log").read_text()
    assert "not updated" not in log, log[-3000:]  # the summary refreshed as each trial ended
    _assert_nothing_lost(f"sqlite:///{tmp_path / 'mlflow.db'}", name, 3, 1)
    after = _copy_in_bucket(s3, tmp_path, name)
    assert [t.number for t in after] == [0, 1, 2]
    assert [t.state.name for t in after] == ["COMPLETE"] * 3
    ids = [t.user_attrs["tune_trial_id"] for t in after]
    assert len(set(ids)) == 3
    before = [(t.user_attrs["tune_trial_id"], t.datetime_complete) for t in copied]
    assert [(t.user_attrs["tune_trial_id"], t.datetime_complete) for t in after[:2]] == before
    other = tmp_path / "other" / "calibtune" / "studies" / "s3" / "calib" / "studies" / name
    assert (other / "optuna.db").is_file() and not (tmp_path / "cache").exists()
    assert not any("s3:" in str(p) for p in tmp_path.rglob("*"))
