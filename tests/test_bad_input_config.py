"""Bad study files and trial configs through the real CLI (`calibtune.cli.main`, in-process):
each answers exit 2 with exactly one stderr line saying what was expected, no traceback, nothing
written in the working directory, and Ray never started.

The config layer's share of issue 9's "every input error before anything starts" and "input
size and expansion": duplicate keys, aliases, sizes, encodings, names that would become paths,
numbers that cannot be meant, and objectives no trial reports.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from calibtune.cli import main

# a Ray left up by the `ray_session` unit on this worker would hide one these refusals started
pytestmark = pytest.mark.usefixtures("ray_down")

STUDY: dict[str, Any] = {
    "name": "bad",
    "trial": {
        "data": {"name": "digits"},
        "model": {"name": "mlp"},
        "train": {"epochs": 1},
        "eval": {"figures": False},
    },
    "losses": [
        "cross_entropy",
        {"name": "focal", "params": {"gamma": {"type": "float", "low": 0.5, "high": 5.0}}},
    ],
    "search": {"num_samples": 2, "objectives": [{"metric": "val/ece@ts", "mode": "min"}]},
}
TRIAL: dict[str, Any] = {
    "name": "t",
    "data": {"name": "digits"},
    "model": {"name": "mlp"},
    "loss": {"name": "cross_entropy"},
    "train": {"epochs": 1},
    "eval": {"figures": False},
}

BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def _set(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(base)
    node: Any = d
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    if isinstance(node, list):
        node[int(keys[-1])] = value
    else:
        node[keys[-1]] = value
    return d


def _yaml(d: dict[str, Any]) -> str:
    return yaml.safe_dump(d, sort_keys=False, allow_unicode=True)


@dataclass(frozen=True)
class Case:
    id: str
    command: str  # "run" (a study file) or "train" (a trial config)
    write: Callable[[Path], None]  # writes the inputs into the working directory
    match: str  # a phrase the one stderr line must contain
    args: tuple[str, ...] = ()


def study(text: str | bytes | dict[str, Any]) -> Callable[[Path], None]:
    return _file("study.yaml", text)


def trial(text: str | bytes | dict[str, Any]) -> Callable[[Path], None]:
    return _file("trial.yaml", text)


def _file(name: str, text: str | bytes | dict[str, Any], *extra: tuple[str, Any]):
    def write(tmp: Path) -> None:
        for sub, content in ((name, text), *extra):
            p = tmp / sub
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, dict):
                content = _yaml(content)
            if isinstance(content, bytes):
                p.write_bytes(content)
            else:
                p.write_text(content, encoding="utf-8")

    return write


def study_with_space(space: str | bytes | dict[str, Any]) -> Callable[[Path], None]:
    s = _set(STUDY, "losses.1", {"name": "focal", "space": "spaces/focal.yaml"})
    return _file("study.yaml", s, ("spaces/focal.yaml", space))


def space_pointing_at(target: str) -> Callable[[Path], None]:
    return study(_set(STUDY, "losses.1", {"name": "focal", "space": target}))


GAMMA = "losses.1.params.gamma"
BIG = "description: " + "x" * (2 << 20) + "\n"

CASES = [
    # ---- YAML itself: size, encoding, aliases, duplicate keys, syntax
    Case("alias bomb in name", "run", study(BOMB + "name: *i\n"), "without aliases"),
    Case(
        "alias bomb in choices",
        "run",
        study(
            _yaml(STUDY)
            + BOMB.replace("a: &a", "x0: &a")
            .replace("\nb:", "\nx1:")
            .replace("\nc:", "\nx2:")
            .replace("\nd:", "\nx3:")
        ),
        "without aliases",
    ),
    Case("2 MB study", "run", study(_yaml(STUDY) + BIG), "expected a study file under 1 MiB"),
    Case("2 MB trial", "train", trial(_yaml(TRIAL) + BIG), "config file under 1 MiB, got 2.0 MiB"),
    Case(
        "2 MB space file",
        "run",
        study_with_space("loss: focal\n" + BIG),
        "expected a search-space file under 1 MiB",
    ),
    Case("duplicate name", "run", study(_yaml(STUDY) + "name: other\n"), "name: duplicate key"),
    Case(
        "duplicate nested key",
        "run",
        study(_yaml(STUDY).replace("epochs: 1", "epochs: 1\n    epochs: 3")),
        "trial.train.epochs: duplicate key (lines",
    ),
    Case(
        "duplicate key in trial",
        "train",
        trial(_yaml(TRIAL) + "seed: 1\nseed: 2\n"),
        "seed: duplicate key",
    ),
    Case(
        "duplicate key in space file",
        "run",
        study_with_space("loss: focal\nparams:\n  gamma: 1.0\n  gamma: 2.0\n"),
        "params.gamma: duplicate key (lines 3 and 4)",
    ),
    Case("alias in trial", "train", trial("base: &b {epochs: 1}\ntrain: *b\n"), "without aliases"),
    Case("alias in space file", "run", study_with_space(BOMB), "without aliases"),
    Case(
        "UTF-16 study",
        "run",
        study(_yaml(STUDY).encode("utf-16")),
        "expected a UTF-8 YAML text file, got binary data",
    ),
    Case(
        "binary study",
        "run",
        study(bytes(range(256)) * 4),
        "expected a UTF-8 YAML text file, got binary data",
    ),
    Case("latin-1 trial", "train", trial(b"name: caf\xe9\n"), "got binary data (byte"),
    Case("UTF-16 trial", "train", trial(_yaml(TRIAL).encode("utf-16")), "got binary data"),
    Case(
        "unclosed bracket",
        "run",
        study("name: [unclosed\n"),
        "study.yaml: line 2, column 1: not valid YAML (",
    ),
    Case(
        "deeply nested brackets",  # libyaml would crash the process; the Python parser takes it
        "run",
        study("name: " + "[" * 200_000 + "]" * 200_000 + "\n"),
        "study.yaml: expected YAML nested a few levels deep, got deeper",
    ),
    Case("study is a directory", "run", lambda t: (t / "study.yaml").mkdir(), "got a directory"),
    # ---- search-space files that are not search-space files (and never echoed)
    Case("space is /etc/passwd", "run", space_pointing_at("/etc/passwd"), "not a search-space"),
    Case("space is a directory", "run", space_pointing_at("/etc"), "got a directory"),
    Case(
        "space is a YAML list",
        "run",
        study_with_space("- a\n- b\n"),
        "not a search-space file (expected a mapping",
    ),
    Case(
        "space is prose",
        "run",
        study_with_space("root: x: 0: 0\n  : bad\n"),
        "not a search-space file (line",
    ),
    # ---- names that become folder names, run names, labels
    Case("name with newline", "run", study(_set(STUDY, "name", "bad\n")), r"got 'bad\n'"),
    Case("300-char name", "run", study(_set(STUDY, "name", "a" * 300)), "≤ 100 chars), got 'aaa"),
    Case("name ..", "run", study(_set(STUDY, "name", "..")), "name: expected a name"),
    Case(
        "label with slash",
        "run",
        study(_set(STUDY, "losses.0", {"name": "cross_entropy", "label": "a/b"})),
        "losses[0].label: expected a name of letters",
    ),
    Case(
        "label escaping",
        "run",
        study(_set(STUDY, "losses.0", {"name": "cross_entropy", "label": "../../x"})),
        "losses[0].label: expected a name",
    ),
    Case(
        "trial name ../../x",
        "train",
        trial(_set(TRIAL, "name", "../../x")),
        "name: expected a name of letters",
    ),
    Case(
        "--name escaping",
        "train",
        trial(TRIAL),
        "name: expected a name of letters",
        ("--name", "../../escaped_trial"),
    ),
    Case(
        "experiment with control char",
        "run",
        study(_set(STUDY, "tracking", {"experiment": "a\x07b"})),
        "tracking.experiment: expected an experiment name",
    ),
    Case(
        "experiment ..",
        "run",
        study(_set(STUDY, "tracking", {"experiment": "calibtune/.."})),
        "tracking.experiment: expected an experiment name",
    ),
    Case(
        "experiment too long",
        "run",
        study(_set(STUDY, "tracking", {"experiment": "e" * 300})),
        "tracking.experiment: expected",
    ),
    # ---- numbers that cannot be meant
    Case(
        "lr .inf",
        "run",
        study(_yaml(STUDY).replace("  eval:", "  optimizer: {lr: .inf}\n  eval:")),
        "trial.optimizer.lr: expected a number in (0, inf), got inf",
    ),
    Case(
        "lr .nan in trial",
        "train",
        trial(_yaml(TRIAL) + "optimizer: {lr: .nan}\n"),
        "optimizer.lr: expected a number in (0, inf), got nan",
    ),
    Case(
        "weight decay -.inf",
        "train",
        trial(_yaml(TRIAL) + "optimizer: {weight_decay: -.inf}\n"),
        "optimizer.weight_decay: expected a number in [0, inf), got -inf",
    ),
    Case(
        "epochs 1e30",
        "run",
        study(_yaml(STUDY).replace("epochs: 1", "epochs: 1.0e+30")),
        "trial.train.epochs: expected an integer in [1, 100000], got 1e+30",
    ),
    Case(
        "epochs 2.0 in trial",
        "train",
        trial(_yaml(TRIAL).replace("epochs: 1", "epochs: 2.0")),
        "train.epochs: expected an integer in [1, 100000], got 2.0",
    ),
    Case(
        "epochs beyond the cap",
        "train",
        trial(_set(TRIAL, "train.epochs", 10**6)),
        "got 1000000",
    ),
    Case(
        "float step not dividing",
        "run",
        study(_set(STUDY, GAMMA, {"type": "float", "low": 0.5, "high": 5.0, "step": 2.0})),
        "gamma.step: expected a step that divides high - low (4.5), got 2",
    ),
    Case(
        "int step not dividing",
        "run",
        study(
            _set(STUDY, "space", {"eval.n_bins": {"type": "int", "low": 5, "high": 30, "step": 10}})
        ),
        "space.eval.n_bins.step: expected a step that divides high - low (25), got 10",
    ),
    Case(
        "infinite space bound",
        "run",
        study(_yaml(STUDY).replace("high: 5.0", "high: .inf")),
        "gamma.high: expected a finite number, got inf",
    ),
    Case(
        "batch larger than the dataset (study)",
        "run",
        study(_set(STUDY, "trial.train.batch_size", 100000)),
        "train.batch_size: expected at most the",
    ),
    Case(
        "batch larger than the dataset (train)",
        "train",
        trial(_set(TRIAL, "train.batch_size", 100000)),
        "train.batch_size: expected at most the",
    ),
    # ---- how an arm trains: reduction and split seed (issue 22, items 1 and 2)
    Case(
        "loss.reduction none",
        "train",
        trial(_set(TRIAL, "loss.reduction", "none")),
        "trial.yaml: loss.reduction: expected one of 'mean', 'sum', got 'none'",
    ),
    Case(
        "arm reduction not a choice",
        "run",
        study(_set(STUDY, "losses.0", {"name": "cross_entropy", "reduction": "Sum"})),
        "study.yaml: losses[0].reduction: expected one of 'mean', 'sum', got 'Sum'",
    ),
    Case(
        "negative split seed",
        "train",
        trial(_set(TRIAL, "data.split_seed", -1)),
        "trial.yaml: data.split_seed: expected an integer >= 0, got -1",
    ),
    Case(
        "split seed not an integer (study)",
        "run",
        study(_set(STUDY, "trial.data.split_seed", "one")),
        "data.split_seed: expected an integer >= 0, got 'one'",
    ),
    # ---- objectives no trial reports
    Case(
        "objective does not exist",
        "run",
        study(_set(STUDY, "search.objectives", ["val/does_not_exist"])),
        "search.objectives[0].metric: expected a metric the trials report (e.g. val/ece, "
        "val/ece@ts",
    ),
    Case(
        "objective with unknown method",
        "run",
        study(_set(STUDY, "search.objectives", ["val/ece@magic"])),
        "got 'val/ece@magic'",
    ),
    Case(
        "objective on test data",
        "run",
        study(_set(STUDY, "search.objectives", ["test/ece@ts"])),
        "expected a validation metric",
    ),
    Case(
        "objective not a key",
        "run",
        study(_set(STUDY, "search.objectives", ["val/ece.ts"])),
        "expected a metric the trials report",
    ),
    # ---- long values are quoted as short excerpts
    Case(
        "long list quoted short",
        "run",
        study(_set(STUDY, "description", list(range(20000)))),
        "description: expected a string, got [0, 1, 2",
    ),
    Case(
        "--set with an alias",
        "train",
        trial(TRIAL),
        "--set train: [1]: expected YAML without aliases",
        ("--set", "train=[&x 1, *x]"),
    ),
    Case(
        "--set not YAML",
        "train",
        trial(TRIAL),
        "--set train.epochs: line ",
        ("--set", "train.epochs=[1,"),
    ),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_stops_with_one_line_and_writes_nothing(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import ray

    monkeypatch.chdir(tmp_path)
    case.write(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    target = "study.yaml" if case.command == "run" else "trial.yaml"
    code = main([case.command, target, *case.args])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err[:2000]
    assert case.match in lines[0], lines[0]
    assert "Traceback" not in err
    assert len(lines[0]) < 500  # values are quoted as excerpts, never whole
    assert "root:" not in lines[0]  # never the content of a file that is not ours
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not ray.is_initialized()


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 35 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.timeout(60)
def test_alias_bomb_is_refused_fast(tmp_path: Path) -> None:
    import time

    from calibtune.study import StudyError, load_study

    path = tmp_path / "s.yaml"
    path.write_text(BOMB + "name: *i\n")
    t0 = time.perf_counter()
    with pytest.raises(StudyError, match=r"s.yaml: b\[0\]: expected YAML without aliases"):
        load_study(path)
    assert time.perf_counter() - t0 < 1.0


def test_size_is_checked_before_reading(tmp_path: Path) -> None:
    from calibtune._yaml import load_file

    path = tmp_path / "sparse.yaml"
    with path.open("wb") as f:  # 50 MiB sparse: reading it would take a while, stat does not
        f.truncate(50 << 20)
    with pytest.raises(
        ValueError, match=r"sparse.yaml: expected a study file under 1 MiB, got 50.0"
    ):
        load_file(path, "study file")


def test_safe_join_refuses_paths_outside_the_root(tmp_path: Path) -> None:
    from calibtune._names import safe_join

    assert safe_join(tmp_path, "a", "b") == tmp_path.resolve() / "a" / "b"
    for bad in ("../x", "/etc", ".", "a/../../x"):
        with pytest.raises(ValueError, match=r"name: expected a path inside"):
            safe_join(tmp_path, bad)


def test_trial_engine_refuses_an_escaping_name_even_past_the_config(tmp_path: Path) -> None:
    from calibtune.trial import config_from_dict, run

    cfg = config_from_dict({**TRIAL, "storage_path": str(tmp_path / "runs")})
    with pytest.raises(ValueError, match=r"^name: expected a name of letters"):
        run(cfg, name="../../escaped")
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "escaped").exists()


def test_excerpt_cuts_long_values() -> None:
    from calibtune._yaml import excerpt

    assert excerpt("x" * 1000) == "'" + "x" * 58 + "…"
    assert excerpt([1, 2]) == "[1, 2]"
    assert excerpt("a\nb") == "'a\\nb'"
