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
from calibtune.cluster._jobs import (
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
            "trial.data.root: expected an absolute folder that holds cifar10, svhn, cifar10c .*"
            r"\(calibtune data fetch cifar10 svhn cifar10c --root DIR\)",
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
    from calibtune.cluster._jobs import load_runtime_env, submission
    from calibtune.study import load_study

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
    assert "MLFLOW_TRACKING_TOKEN" not in env["env_vars"]  # a credential: only with --env
    assert env["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert yaml.safe_load(env["env_vars"]["CALIBTUNE_STUDY_YAML"])["name"] == "s"
    assert "HOME" not in env["env_vars"]
    assert load_runtime_env(tmp_path / "env.json") == renv


def test_a_study_outside_a_project_uploads_nothing(tmp_path) -> None:
    from calibtune.cluster._jobs import submission
    from calibtune.study import load_study

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
    assert forwarded_env(env) == {"RAY_TRAIN_X": "1"}  # a credential only by --env (issue 41)


# ------------------------------------------------------------------------------- --fetch (issue 30)

CIFAR = {**STUDY, "trial": {**STUDY["trial"], "data": {"name": "cifar10", "root": "data"}}}


def _steps(entrypoint: str) -> list[list[str]]:
    """The commands of a job's entrypoint: ``sh -c 'A && B'`` -> [A, B]; a bare command -> [it]."""
    import shlex

    words = shlex.split(entrypoint)
    if words[:2] != ["sh", "-c"]:
        return [words]
    assert len(words) == 3, words  # one shell word after -c: nothing outside it runs
    return [shlex.split(part) for part in words[2].split(" && ")]


@pytest.mark.parametrize(
    ("data", "sets"),
    [
        ({"name": "cifar10", "root": "data"}, ["cifar10", "svhn", "cifar10c"]),  # the defaults
        ({"name": "cifar10", "ood": ["svhn"], "shift": []}, ["cifar10", "svhn"]),
        ({"name": "cifar100", "ood": [], "shift": []}, ["cifar100"]),
    ],
)
def test_fetch_runs_before_the_study_into_the_absolute_root(tmp_path, data, sets) -> None:
    """--data-root DIR --fetch: the job's first step fetches exactly the sets the study reads
    into DIR, a path on the cluster that does not exist here (and is not created), then runs
    the study with that root."""
    from calibtune.cluster._jobs import submission
    from calibtune.study import load_study

    root = f"{tmp_path}/cluster/data"
    study = load_study(_project(tmp_path, {**STUDY, "trial": {**STUDY["trial"], "data": data}}))
    spec = submission(
        study,
        storage=f"{tmp_path}/shared",
        tracking_uri=f"sqlite:///{tmp_path}/m.db",
        python="/opt/env/bin/python",
        data_root=root,
        fetch=True,
        mirror="http://mirror.lab:8080/calibtune",
        wait_for_resources=90,
    )
    fetch, run = _steps(spec["entrypoint"])
    assert fetch == [
        "/opt/env/bin/python", "-m", "calibtune", "data", "fetch", *sets,
        "--root", root, "--mirror", "http://mirror.lab:8080/calibtune",
    ]  # fmt: skip
    assert run[:4] == ["/opt/env/bin/python", "-m", "calibtune", "run"]
    assert run[-2:] == ["--wait-for-resources", "90"]
    submitted = yaml.safe_load(spec["runtime_env"]["env_vars"]["CALIBTUNE_STUDY_YAML"])
    assert submitted["trial"]["data"] == {**data, "root": root}
    assert not (tmp_path / "cluster").exists()

    # the fetch command is one the data CLI takes as it is
    from calibtune.cli import build_parser

    args = build_parser().parse_args(fetch[3:])
    assert (args.names, args.root) == (sets, root)

    # without --fetch: one step, the study alone, with the same root
    spec = submission(
        study, storage=f"{tmp_path}/shared", tracking_uri=f"sqlite:///{tmp_path}/m.db",
        data_root=root,
    )  # fmt: skip
    ((*run,),) = _steps(spec["entrypoint"])
    assert run[:4] == ["python", "-m", "calibtune", "run"] and "fetch" not in run


def test_the_fetch_step_is_one_shell_word_that_stops_the_study_when_it_fails(tmp_path) -> None:
    """Run the entrypoint as Ray's job manager does (a shell) with a stand-in ``python`` that
    records its arguments: the fetch runs first, the study after it, and not at all when the
    fetch fails (its exit code is the job's). As a KubeRay submitter pastes it into its own
    shell line (``ray job submit … -- ENTRYPOINT ;``), the whole entrypoint reaches
    ``ray job submit`` and nothing runs in the submitter."""
    import shlex
    import subprocess

    from calibtune.cluster._jobs import job_spec

    log = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n'
        'case "$*" in *"data fetch"*) exit "${FETCH_EXIT:-0}";; esac\n'
    )
    fake.chmod(0o755)
    fetch = ["data", "fetch", "cifar10", "--root", "/shared/data dir"]  # a space survives
    spec = job_spec(
        "name: s", "s", storage="s3://b/p", tracking_uri="http://m:5000", python=str(fake),
        fetch=fetch,
    )  # fmt: skip
    entry = spec["entrypoint"]
    done = subprocess.run(["sh", "-c", entry], env={"PATH": os.environ["PATH"]}, check=False)
    assert done.returncode == 0
    calls = log.read_text().splitlines()
    assert calls[0] == "-m calibtune data fetch cifar10 --root /shared/data dir"
    assert calls[1].startswith("-m calibtune run --study-env") and len(calls) == 2

    log.unlink()
    env = {"PATH": os.environ["PATH"], "FETCH_EXIT": "2"}
    done = subprocess.run(["sh", "-c", entry], env=env, check=False)
    assert done.returncode == 2 and len(log.read_text().splitlines()) == 1  # no study

    # KubeRay's submitter line, with a recorder standing in for `ray`
    log.unlink()
    ray = tmp_path / "ray"
    ray.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > {log}\n')
    ray.chmod(0o755)
    line = f"{ray} job submit --address http://h:8265 -- {entry} ; echo submitted"
    done = subprocess.run(["sh", "-c", line], env=env, check=False, capture_output=True, text=True)
    assert done.stdout == "submitted\n"
    argv = log.read_text().splitlines()
    assert shlex.join(argv[argv.index("--") + 1 :]) == entry  # Ray's CLI joins it back


@pytest.mark.parametrize(
    ("study", "args", "phrase"),
    [
        (  # no root: the default ./data is the job's working directory
            {**STUDY, "trial": {**STUDY["trial"], "data": {"name": "cifar10"}}},
            (),
            r"trial\.data\.root: .* got none .*--data-root DIR --fetch .*"
            r"\(calibtune data fetch cifar10 svhn cifar10c --root DIR\)",
        ),
        (  # the paper studies' relative root
            CIFAR,
            (),
            r"trial\.data\.root: .* got 'data' .*--data-root DIR --fetch .*"
            r"\(calibtune data fetch cifar10 svhn cifar10c --root DIR\)",
        ),
        (  # --fetch still needs an absolute root: a path on the cluster
            CIFAR,
            ("--fetch",),
            r"trial\.data\.root: expected an absolute folder .* got 'data' .*--data-root /ABS/DIR",
        ),
        (
            CIFAR,
            ("--data-root", "cluster/data", "--fetch"),
            r"error: --data-root: expected an absolute folder that holds cifar10, svhn, cifar10c "
            r".* got 'cluster/data'",
        ),
        (
            CIFAR,
            ("--data-root", "/shared/data", "--mirror", "http://m/"),
            r"error: --mirror: expected --fetch with it .* got 'http://m/' alone",
        ),
        (
            CIFAR,
            ("--data-root", "/shared/data", "--fetch", "--mirror", "ftp://m/"),
            r"error: --mirror: expected an http://, https:// or file:// URL, got 'ftp://m/'",
        ),
    ],
)
def test_data_roots_are_refused_naming_fetch(tmp_path, capsys, study, args, phrase) -> None:
    """One line, exit 2, before the dashboard (a closed port) is contacted, nothing written."""
    import re

    path = _project(tmp_path, study)
    code, lines = _submit(capsys, str(path), *_shared(tmp_path), *args, "--address", _closed())
    assert code == 2 and len(lines) == 1, lines
    assert re.search(phrase, lines[0]), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibtune", "pyproject.toml", "s.yaml"]


def test_an_absolute_root_to_fetch_passes_every_check_before_the_cluster(tmp_path, capsys) -> None:
    """--data-root on the cluster (absent here) with --fetch: the next step is the (closed)
    dashboard, so every check of submit's passed."""
    path = _project(tmp_path, CIFAR)
    args = ("--data-root", "/nonexistent/calibtune-data", "--fetch", "--address", _closed())
    code, lines = _submit(capsys, str(path), *_shared(tmp_path), *args)
    assert code == 2 and len(lines) == 1 and "expected a Ray dashboard" in lines[0], lines
