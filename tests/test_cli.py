"""`calibtune train`: help text, one-line errors with exit code 2, an end-to-end tiny trial."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from calibtune.cli import build_parser, main
from calibtune.commands import format_metrics_table


def _write(tmp_path: Path, body: dict) -> Path:
    p = tmp_path / "trial.yaml"
    p.write_text(yaml.safe_dump(body))
    return p


def test_help_documents_every_train_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--num-workers", "--use-gpu", "--no-use-gpu", "--set", "--storage-path", "--name"):
        assert opt in out
    # every option the parser knows is in the help
    train = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    for action in train._actions:
        for s in action.option_strings:
            assert s in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "missing.yaml"], r"missing\.yaml: no such file"),
        (["train", "{cfg}", "--set", "train.epochs=ten"], r"train\.epochs: expected an integer"),
        (["train", "{cfg}", "--set", "nope=1"], r"nope: unknown key"),
        (["train", "{cfg}", "--set", "novalue"], r"--set: expected key\.path=value"),
        (["train", "{cfg}", "--num-workers", "-1"], r"--num-workers: expected an integer >= 0"),
        pytest.param(
            ["train", "{cfg}", "--use-gpu"],
            r"scaling\.use_gpu: expected a visible GPU",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible"),
        ),
        (
            ["train", "{cfg}", "--set", "data.name=cifar10", "--set", "data.root=/nonexistent"],
            r"cifar10.*/nonexistent",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    cfg = _write(tmp_path, {"train": {"epochs": 1}, "storage_path": str(tmp_path / "runs")})
    argv = [a.replace("{cfg}", str(cfg)) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("calibtune train: error: ")
    import re

    assert re.search(message, err), err


def test_train_runs_a_trial_and_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write(
        tmp_path,
        {
            "name": "cli",
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "loss": {"name": "cross_entropy"},
            "train": {"epochs": 2, "batch_size": 64},
            "eval": {"posthoc": ["ts"]},
        },
    )
    code = main(
        ["train", str(cfg), "--storage-path", str(tmp_path / "runs"), "--set", "train.epochs=1"]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "uncalibrated" in out and "ts" in out and "posthoc/ts/T" in out
    assert "1 epochs; artifacts in" in out
    assert (tmp_path / "runs" / "cli" / "artifacts" / "metrics.json").is_file()


def test_diverging_trial_exits_1_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write(
        tmp_path,
        {
            "data": {"ood": []},
            "optimizer": {"lr": 1.0e4, "momentum": 0.0},
            "train": {"epochs": 1},
            "eval": {"posthoc": []},
        },
    )
    assert main(["train", str(cfg), "--storage-path", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "trial failed: non-finite loss at epoch 1, step" in err


def test_format_metrics_table_rows_and_percent() -> None:
    m = {"test/ece": 0.1, "test/error": 0.2, "test/ece@ts": 0.05, "posthoc/ts/T": 1.5}
    text = format_metrics_table(m)
    lines = text.splitlines()
    assert lines[1].split() == ["method", "error", "ece"]
    assert lines[2].split() == ["uncalibrated", "20.000", "10.000"]
    assert lines[3].split() == ["ts", "-", "5.000"]
    assert "posthoc/ts/T  1.5000" in text


def test_python_dash_m_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "calibtune", "--help"], capture_output=True, text=True, check=True
    )
    assert "train" in out.stdout


_EXIT_SCRIPT = """
import atexit, sys, threading, time
from calibtune._lazy import exit_without_teardown

class Finalised:  # a module global: its __del__ runs only in the interpreter's teardown
    def __del__(self):
        print("teardown", flush=True)

keep = Finalised()
atexit.register(lambda: print("atexit handler"))
if sys.argv[1] == "thread":  # a non-daemon thread still running: Python waits for it
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done"))).start()
sys.stdout.write("buffered, no newline ")
exit_without_teardown(3)
"""


@pytest.mark.parametrize("case", ["plain", "thread"])
def test_exit_without_teardown_runs_atexit_flushes_and_skips_the_teardown(case: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, case], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 3, out.stderr
    assert out.stdout.startswith("buffered, no newline "), out.stdout
    assert "atexit handler" in out.stdout
    if case == "plain":
        assert "teardown" not in out.stdout  # os._exit: nothing after the atexit handlers
    else:  # fell back to sys.exit: the thread finished, then the normal teardown ran
        assert out.stdout.index("thread done") < out.stdout.index("atexit handler")
        assert "teardown" in out.stdout


def test_the_calibtune_executable_and_dash_m_exit_through_command() -> None:
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "calibtune"]
    assert script.value == "calibtune.cli:command"
    main_py = Path(__file__).parents[1] / "calibtune" / "__main__.py"
    assert "command()" in main_py.read_text()


def test_submit_leaves_the_datasets_out_but_ships_the_whole_package():
    # the job's working directory is the project as Ray packs it: `data/` (the datasets) and
    # run outputs stay behind, every file of calibtune/ travels (calibtune/data included)
    from ray._private.runtime_env.packaging import _get_excludes

    from calibtune.cluster._jobs import JOB_EXCLUDES

    root = Path(__file__).resolve().parents[1]
    excluded = _get_excludes(root, list(JOB_EXCLUDES))
    assert not [p for p in (root / "calibtune").rglob("*.py") if excluded(p)]
    for name in ("data", "runs", ".venv", "mlflow.db", "exported", "x.pt", "runs/a/b.pt"):
        assert excluded(root / name), name
