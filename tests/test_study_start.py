"""A study's start: the SQLite store is created while Ray starts (`store_created_meanwhile`),
and a study that fails before it starts (a cluster too small for one trial) leaves no store."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calibtune.record._tracking import _client, store_created_meanwhile


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as con:
        return {r[0] for r in con.execute("select name from sqlite_master where type='table'")}


def test_a_new_store_is_created_while_the_block_runs(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    with store_created_meanwhile(f"sqlite:///{db}"):
        pass
    assert {"experiments", "runs", "metrics", "alembic_version"} <= _tables(db)
    exp = _client(f"sqlite:///{db}").create_experiment("x")  # a usable, migrated store
    assert _client(f"sqlite:///{db}").get_experiment(exp).name == "x"


def test_a_failing_block_leaves_no_new_store_and_keeps_an_existing_one(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    with (
        pytest.raises(ValueError, match="cluster too small"),
        store_created_meanwhile(f"sqlite:///{db}"),
    ):
        raise ValueError("cluster too small")
    assert list(tmp_path.iterdir()) == []  # neither the store nor its tables' own file
    _client(f"sqlite:///{db}").create_experiment("kept")
    with pytest.raises(KeyboardInterrupt), store_created_meanwhile(f"sqlite:///{db}"):
        raise KeyboardInterrupt
    assert _client(f"sqlite:///{db}").get_experiment_by_name("kept") is not None
    assert list(tmp_path.iterdir()) == [db]


def test_a_store_that_appears_meanwhile_is_kept(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    code = f"from mlflow import MlflowClient; MlflowClient('sqlite:///{db}').create_experiment('theirs')"
    with store_created_meanwhile(f"sqlite:///{db}"):  # another process made it meanwhile
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert _client(f"sqlite:///{db}").get_experiment_by_name("theirs") is not None
    assert list(tmp_path.iterdir()) == [db]


def test_other_stores_are_left_to_the_first_client(tmp_path: Path) -> None:
    with store_created_meanwhile("http://127.0.0.1:9"):  # a server: nothing to create here
        pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_study_whose_trial_cannot_fit_the_cluster_leaves_no_store(tmp_path: Path) -> None:
    study = {
        "name": "too_big",
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "mlp"},
            "train": {"epochs": 1},
            "scaling": {"num_workers": 512, "resources_per_worker": {"CPU": 1}},
        },
        "losses": [{"name": "cross_entropy"}],
        "search": {"num_samples": 1, "objectives": [{"metric": "val/ece", "mode": "min"}]},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    out = subprocess.run(
        [sys.executable, "-m", "calibtune", "run", "s.yaml", "--quiet", "--storage", "runs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "needs 512 CPU" in out.stderr, out.stderr
    assert not (tmp_path / "mlflow.db").exists()
    assert not (tmp_path / "mlruns").exists()


def test_a_new_store_after_the_first_is_a_copy_of_its_empty_tables(tmp_path, monkeypatch) -> None:
    """Only the first new store per MLflow schema runs MLflow's migrations (≈ 1–2 s at every
    study's start before); the next is a copy of the empty store the first left in the cache,
    usable as it is. On the previous code every new store ran them again (here they fail)."""
    import mlflow.store.db.utils as mlflow_db

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with store_created_meanwhile(f"sqlite:///{tmp_path / 'first.db'}"):
        pass
    (template,) = (tmp_path / "cache" / "calibtune" / "mlflow-schema").iterdir()
    assert template.name == f"{mlflow_db._get_latest_schema_revision()}.db"

    def no_migrations(engine):
        raise AssertionError("migrations ran again")

    monkeypatch.setattr(mlflow_db, "_initialize_tables", no_migrations)
    db = tmp_path / "second.db"
    with store_created_meanwhile(f"sqlite:///{db}"):
        pass
    assert _tables(db) == _tables(tmp_path / "first.db")
    exp = _client(f"sqlite:///{db}").create_experiment("x")
    assert _client(f"sqlite:///{db}").get_experiment(exp).name == "x"
    assert _client(f"sqlite:///{tmp_path / 'first.db'}").get_experiment_by_name("x") is None


@pytest.mark.parametrize("content", [b"not a database", "other revision"])
def test_a_template_that_is_not_the_schema_is_made_again(tmp_path, monkeypatch, content) -> None:
    """A cached template that is not an SQLite store at MLflow's schema revision (a cut-off
    file, a template of another MLflow) is never copied into a study: the migrations make the
    store and a good template replaces it."""
    import mlflow.store.db.utils as mlflow_db

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    revision = mlflow_db._get_latest_schema_revision()
    template = tmp_path / "cache" / "calibtune" / "mlflow-schema" / f"{revision}.db"
    template.parent.mkdir(parents=True)
    if isinstance(content, bytes):
        template.write_bytes(content)
    else:
        with sqlite3.connect(template) as con:
            con.execute("create table alembic_version (version_num varchar(32))")
            con.execute("insert into alembic_version values ('0123456789ab')")
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    with store_created_meanwhile(f"sqlite:///{db}"):
        pass
    assert {"experiments", "runs", "metrics"} <= _tables(db)
    assert _client(f"sqlite:///{db}").create_experiment("x")
    assert list(db.parent.iterdir()) == [db]  # no copy of the bad template left beside it
    with sqlite3.connect(template) as con:
        assert con.execute("select version_num from alembic_version").fetchone() == (revision,)
