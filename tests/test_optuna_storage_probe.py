"""The Optuna storage is probed before Ray starts, a shared one's study belongs to its study
folder, and a study that crashed before any trial started runs again (issue 41, section 5).

`calibtune run` rows run ``calibtune.cli.main`` in-process, as tests/test_bad_input_cli.py does:
exit code 2, one stderr line naming what was expected and found, no Ray started. Before, each of
these studies trained to the end with no Optuna record at all (exit 0), or appended to another
folder's Optuna study, and a folder with ``tuner.pkl`` but no Tune state was refused for ever.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import optuna
import pytest
import yaml

from calibtune.cli import main
from calibtune.cluster._preflight import check_optuna_storage
from calibtune.record._optuna import STUDY_ID_ATTR, bind_study, found_study
from calibtune.study import load_study
from calibtune.studyfile._studydir import STUDY_COPY, StudyDir, StudyDirError, StudyState

# a Ray left up by the `ray_session` unit on this worker would hide one these refusals started
pytestmark = pytest.mark.usefixtures("ray_down")

PG_URL = os.environ.get("CALIBTUNE_TEST_PG_URL")
STUDY = {
    "name": "tiny",
    "trial": {
        "data": {"name": "digits", "ood": []},
        "model": {"name": "mlp"},
        "train": {"epochs": 1, "batch_size": 64},
        "eval": {"posthoc": ["ts"], "figures": False},
    },
    "losses": ["cross_entropy"],
    "search": {"num_samples": 1, "max_concurrent": 1, "objectives": ["val/ece"]},
}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _study_file(tmp: Path, optuna_storage: str) -> Path:
    raw = {
        **STUDY,
        "search": {**STUDY["search"], "optuna_storage": optuna_storage},
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}"},
        "storage": str(tmp / "studies"),
    }
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _refused(tmp: Path, capsys, argv: list[str]) -> str:
    import ray

    before = sorted(p.name for p in tmp.iterdir())
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in out + err, err
    assert not ray.is_initialized()
    assert sorted(p.name for p in tmp.iterdir()) == before  # nothing written
    return lines[0]


@pytest.mark.parametrize(
    ("url", "phrase"),
    [
        (
            "postgresql+psycopg2://postgres:s3cret@127.0.0.1:{closed}/x",
            r"search\.optuna_storage: expected a reachable database server at "
            r"postgresql\+psycopg2://postgres:\*\*\*@127\.0\.0\.1:\d+/x, got connection refused",
        ),
        (
            "mysql://127.0.0.1:1/x",
            r"search\.optuna_storage: expected the mysql driver \(Python module 'MySQLdb'\) for "
            r"mysql://127\.0\.0\.1:1/x, found none installed \(pip install mysqlclient\)",
        ),
        (
            "sqlite:////proc/calibtune/optuna.db",
            r"search\.optuna_storage: expected a directory on a disk, got /proc/calibtune "
            r"\(/proc is a virtual filesystem\)",
        ),
        (
            "sqlite:///{tmp}/afile/optuna.db",
            r"search\.optuna_storage: expected a directory, got a file: .*afile$",
        ),
        ("nosuchdb://h/x", r"search\.optuna_storage: expected a database SQLAlchemy knows"),
    ],
)
def test_a_bad_optuna_storage_is_refused_before_ray(
    tmp_path: Path, monkeypatch, capsys, url: str, phrase: str
) -> None:
    if url.startswith("mysql"):
        pytest.importorskip("sqlalchemy")
        try:
            import MySQLdb  # noqa: F401
        except ImportError:
            pass
        else:
            pytest.skip("mysqlclient is installed here")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file\n")
    url = url.format(closed=_closed_port(), tmp=tmp_path)
    _study_file(tmp_path, url)
    line = _refused(tmp_path, capsys, ["run", "s.yaml"])
    assert line.startswith("calibtune run: error: ") and "s3cret" not in line
    assert re.search(phrase, line), line


def test_a_writable_sqlite_storage_passes_without_being_created(tmp_path: Path) -> None:
    check_optuna_storage(f"sqlite:///{tmp_path / 'new' / 'optuna.db'}", "k")
    assert not (tmp_path / "new").exists()


def test_a_real_postgresql_passes_and_keeps_nothing() -> None:
    if not PG_URL:
        if os.environ.get("CI"):
            pytest.fail("CALIBTUNE_TEST_PG_URL: expected a PostgreSQL URL in CI, got none")
        pytest.skip("CALIBTUNE_TEST_PG_URL unset (`.ci/run` provides PostgreSQL)")
    from sqlalchemy import create_engine, inspect

    # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; the test extra ships psycopg2
    url = PG_URL.replace("postgresql://", "postgresql+psycopg2://", 1)
    if PG_URL.startswith("postgresql://"):
        with pytest.raises(ValueError, match=r"or write postgresql\+psycopg2:// for the inst"):
            check_optuna_storage(PG_URL.replace("postgresql://", "postgresql+psycopg://"), "k")
    check_optuna_storage(url, "search.optuna_storage")  # the schema written, then rolled back
    engine = create_engine(url)
    try:
        assert not [t for t in inspect(engine).get_table_names() if "calibtune_probe" in t]
    finally:
        engine.dispose()
    with pytest.raises(ValueError, match=r"expected a writable database at .*/no_such_db_x, got"):
        check_optuna_storage(url.rsplit("/", 1)[0] + "/no_such_db_x", "search.optuna_storage")


# ------------------------------------------------------------------------------ study id


def test_a_shared_optuna_study_belongs_to_one_study_folder(tmp_path: Path, monkeypatch, capsys):
    """A folder deleted and run again against the shared storage, or the same YAML under a
    second storage, is refused in one line with the fix; the owning folder goes on."""
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    study = load_study(_study_file(tmp_path, url))
    first = bind_study(study, url, None)  # what `run` does at the start of a new folder
    assert found_study(url, "tiny") == (first, 0)
    ot = optuna.load_study(study_name="tiny", storage=url)
    assert ot.user_attrs[STUDY_ID_ATTR] == first
    ot.add_trial(optuna.trial.create_trial(value=0.1))  # the first folder's trial
    state = StudyState("sqlite:///m.db", "1", "p", None, first)
    assert bind_study(study, url, state) == first  # the owner: accepted

    # the folder deleted, or another --storage: a new folder meets the old record
    line = _refused(tmp_path, capsys, ["run", "s.yaml"])
    assert re.search(
        rf"s\.yaml: search\.optuna_storage: expected the Optuna study 'tiny' in "
        rf"sqlite:///.*shared\.db to be a new study folder's, found another study folder's "
        rf"\(study id {first}, 1 trials.*optuna delete-study --study-name tiny --storage ",
        line,
    ), line
    with pytest.raises(StudyDirError, match="found another study folder's"):
        bind_study(study, url, None)  # under the lock too (a race with the preflight)
    other = StudyState("sqlite:///m.db", "1", "p", None, "f" * 32)
    with pytest.raises(StudyDirError, match=f"this study folder \\(study id {'f' * 32}\\)"):
        bind_study(study, url, other)
    assert len(optuna.load_study(study_name="tiny", storage=url).trials) == 1  # nothing added


def test_an_optuna_study_without_an_id_is_kept_by_its_folder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    study = load_study(_study_file(tmp_path, url))
    ot = optuna.create_study(study_name="tiny", storage=url)
    ot.add_trial(optuna.trial.create_trial(value=0.1))  # recorded before study ids
    legacy = StudyState("sqlite:///m.db", "1", "p")  # ... by a folder of before study ids
    sid = bind_study(study, url, legacy)
    assert found_study(url, "tiny") == (sid, 1)
    with pytest.raises(StudyDirError):  # a new folder may not take a study with trials
        bind_study(study, f"sqlite:///{tmp_path / 'shared.db'}", None)


def test_the_folder_keeps_its_study_id(tmp_path: Path) -> None:
    sd = StudyDir.at("tiny", tmp_path)
    sd.path.mkdir()
    sd.write_state(StudyState("u", "1", "p", None, "a" * 32))
    sd.write_state(StudyState("u", "1", "p2"))  # a writer that does not know the id
    assert sd.read_state().study_id == "a" * 32
    assert json.loads(sd.state_file.read_text())["study_id"] == "a" * 32


# ------------------------------------------------------------------------------ never started


def test_a_folder_whose_trials_never_started_is_not_resumed(tmp_path: Path) -> None:
    """``tuner.pkl`` written, then a crash before Tune's first save: `run` starts the study
    again (has no Tune state to restore), `resume` may too; once a trial started, not so."""
    study = load_study(_study_file(tmp_path, f"sqlite:///{tmp_path / 'o.db'}"))
    sd = StudyDir.at("tiny", tmp_path / "studies")
    sd.path.mkdir(parents=True)
    sd.write_state(StudyState("sqlite:///m.db", "1", "p"))
    sd.write_study(study)
    (sd.path / "tuner.pkl").write_bytes(b"\x80\x04}\x94.")  # not even Tune's: cut short
    assert sd.never_started() and not sd.has_tune_state()
    sd.check_restorable()  # `resume` starts it instead of refusing
    (sd.path / "trial_starts" / "2025").mkdir(parents=True)
    assert sd.never_started()
    (sd.path / "trial_starts" / "2025" / "abc.json").write_text("{}")  # a trial started
    assert not sd.never_started() and sd.has_tune_state()
    with pytest.raises(StudyDirError, match="expected Ray Tune's saved Tuner, found another"):
        sd.check_restorable()
    assert (sd.path / STUDY_COPY).is_file()
