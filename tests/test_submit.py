"""`calibtune submit` before anything reaches a cluster (issue 28 item 4): what a job sends
(`job_spec`: the nodes' own python, a --runtime-env file passed through, the environment
forwarded by name, what travels) and what is refused in one line, exit 2, before the dashboard is
contacted (the address below is a closed port: a check that ran after the job client would
answer "connection refused" instead).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
import yaml

from calibtune.cli import main
from calibtune.study._jobs import (
    JOB_EXCLUDES,
    _package_files,
    forwarded_env,
    job_excludes,
)

ROOT = Path(__file__).resolve().parents[1]

STUDY = {
    "name": "s",
    "trial": {
        "data": {"name": "digits"},
        "model": {"name": "mlp"},
        "train": {"epochs": 1, "batch_size": 64},
    },
    "losses": ["cross_entropy"],
    "search": {"num_samples": 1, "max_concurrent": 1, "objectives": [{"metric": "val/ece"}]},
}


def _closed() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _project(tmp_path: Path, study: dict | None = None) -> Path:
    """A project as `submit` finds one: pyproject.toml, the calibtune package, a study."""
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "calibtune").mkdir()
    (tmp_path / "calibtune" / "__init__.py").write_text("")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study or STUDY))
    return tmp_path / "s.yaml"


def _submit(capsys, *argv: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    try:
        code = int(main(["submit", *argv]))
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err.splitlines()


def _shared(tmp: Path) -> tuple[str, ...]:
    """Absolute paths (a shared mount, as far as submit can tell) that pass `preflight_submit`."""
    return ("--storage", f"{tmp}/shared", "--tracking-uri", f"sqlite:///{tmp}/m.db")


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (("--tracking-uri", "http://m:5000"), "--storage: expected storage every node .* got none"),
        (
            ("--storage", "runs/studies", "--tracking-uri", "http://m:5000"),
            "--storage: .* got 'runs/studies', a path relative to this machine",
        ),
        (("--storage", "s3://b/p"), "--tracking-uri: expected an MLflow server .* got none"),
        (
            ("--storage", "s3://b/p", "--tracking-uri", "sqlite:///mlflow.db"),
            "--tracking-uri: .* got 'sqlite:///mlflow.db', a path relative",
        ),
    ],
)
def test_local_defaults_are_refused(tmp_path, capsys, monkeypatch, args, phrase) -> None:
    import re

    monkeypatch.chdir(tmp_path)
    path = _project(tmp_path)
    code, lines = _submit(capsys, str(path), *args, "--address", _closed())
    assert code == 2 and len(lines) == 1, lines
    assert re.search(phrase, lines[0]), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibtune", "pyproject.toml", "s.yaml"]


@pytest.mark.parametrize(
    ("data", "phrase"),
    [
        (
            {"name": "digits", "root": "data"},
            "trial.data.root: expected an absolute folder .* 'data'",
        ),
        (
            {"name": "cifar10"},
            "trial.data.root: expected an absolute folder that holds cifar10 .*"
            r"\(calibtune data fetch cifar10 --root DIR\)",
        ),
    ],
)
def test_a_relative_data_root_is_refused_before_upload(tmp_path, capsys, data, phrase) -> None:
    import re

    path = _project(tmp_path, {**STUDY, "trial": {**STUDY["trial"], "data": data}})
    code, lines = _submit(capsys, str(path), *_shared(tmp_path), "--address", _closed())
    assert code == 2 and len(lines) == 1, lines
    assert re.search(phrase, lines[0]), lines[0]


def test_an_oversized_working_dir_is_refused_before_upload(tmp_path, capsys, monkeypatch) -> None:
    path = _project(tmp_path)
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "big.bin").write_bytes(os.urandom(3 * 1024**2))  # incompressible
    monkeypatch.setenv("RAY_max_grpc_message_size", str(1024**2))  # Ray's own limit, lowered
    code, lines = _submit(capsys, str(path), *_shared(tmp_path), "--address", _closed())
    assert code == 2 and len(lines) == 1, lines
    assert "expected a working directory under Ray's upload limit of 1.0 MiB" in lines[0]
    assert "largest: weights 3.0 MiB" in lines[0]

    # the same file listed in the project's .gitignore does not travel: past the size check,
    # the next step is the (closed) dashboard
    (tmp_path / ".gitignore").write_text("# local files\n/weights/\n")
    code, lines = _submit(capsys, str(path), *_shared(tmp_path), "--address", _closed())
    assert code == 2 and "expected a Ray dashboard" in lines[0], lines


@pytest.mark.parametrize(
    ("env", "phrase"),
    [
        ({"working_dir": "."}, "expected keys among .* got working_dir .*sends the project"),
        ({"pipp": ["x"]}, "expected keys among pip, uv, .* got pipp"),
        ({"env_vars": {"A": 1}}, "env_vars: expected a mapping of names to strings"),
        ([1, 2], "expected a mapping of Ray runtime_env keys"),
    ],
)
def test_a_runtime_env_that_is_not_one_is_refused(tmp_path, capsys, env, phrase) -> None:
    import re

    path = _project(tmp_path)
    (tmp_path / "env.yaml").write_text(yaml.safe_dump(env))
    args = ("--runtime-env", str(tmp_path / "env.yaml"), "--address", _closed())
    code, lines = _submit(capsys, str(path), *_shared(tmp_path), *args)
    assert code == 2 and len(lines) == 1, lines
    assert re.search(phrase, lines[0]), lines[0]


def test_the_job_runs_the_nodes_python_with_the_runtime_env_and_forwarded_variables(
    tmp_path, monkeypatch
) -> None:
    from calibtune.study import load_study
    from calibtune.study._jobs import load_runtime_env, submission

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "t")
    monkeypatch.setenv("CALIBTUNE_STUDY_YAML", "stale")  # never forwarded: the job's own
    renv = {
        "pip": {"packages": ["calibtune"], "pip_install_options": ["-c", "constraints.txt"]},
        "env_vars": {"OMP_NUM_THREADS": "1"},
        "excludes": ["/notes"],
    }
    (tmp_path / "env.json").write_text(json.dumps(renv))
    study = load_study(_project(tmp_path))
    spec = submission(
        study,
        storage=f"{tmp_path}/shared",
        tracking_uri=f"sqlite:///{tmp_path}/m.db",
        runtime_env_file=str(tmp_path / "env.json"),
    )
    argv = spec["entrypoint"].split()
    assert argv[:3] == ["python", "-m", "calibtune"] and sys.executable not in argv
    assert argv[argv.index("--storage") + 1] == f"{tmp_path}/shared"
    env = spec["runtime_env"]
    assert env["pip"] == renv["pip"]  # passed through as given
    assert env["working_dir"] == str(tmp_path)
    assert "/notes" in env["excludes"] and "/tests" in env["excludes"]
    assert env["env_vars"]["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:9000"
    assert env["env_vars"]["MLFLOW_TRACKING_TOKEN"] == "t"
    assert env["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert yaml.safe_load(env["env_vars"]["CALIBTUNE_STUDY_YAML"])["name"] == "s"
    assert "HOME" not in env["env_vars"]
    assert load_runtime_env(tmp_path / "env.json") == renv


def test_a_study_outside_a_project_uploads_nothing(tmp_path) -> None:
    from calibtune.study import load_study
    from calibtune.study._jobs import submission

    (tmp_path / "s.yaml").write_text(yaml.safe_dump(STUDY))
    (tmp_path / "unrelated.bin").write_bytes(b"x" * 1000)
    study = load_study(tmp_path / "s.yaml")
    spec = submission(
        study, storage=f"{tmp_path}/shared", tracking_uri=f"sqlite:///{tmp_path}/m.db"
    )
    assert "working_dir" not in spec["runtime_env"] and "excludes" not in spec["runtime_env"]


def test_what_travels_from_this_project() -> None:
    """The package and what a run reads travel; tests, docs, benchmarks and .gitignore'd files
    do not (Ray's own walk with the job's excludes)."""
    files = {p.relative_to(ROOT).as_posix() for p in _package_files(ROOT, job_excludes(ROOT))}
    assert "calibtune/cli.py" in files and "calibtune/data/__init__.py" in files
    assert "pyproject.toml" in files
    assert not [f for f in files if f.split("/")[0] in ("tests", "docs", "bench", ".venv", ".git")]
    assert not [f for f in files if "__pycache__" in f or f.endswith(".egg-info")]
    assert set(JOB_EXCLUDES) <= set(job_excludes(ROOT))


def test_forwarded_variables_are_named_by_prefix() -> None:
    env = {"AWS_SECRET_ACCESS_KEY": "k", "RAY_TRAIN_X": "1", "PATH": "/bin", "RAY_ADDRESS": "a"}
    assert forwarded_env(env) == {"AWS_SECRET_ACCESS_KEY": "k", "RAY_TRAIN_X": "1"}
