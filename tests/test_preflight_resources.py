"""Resource refusals before Ray starts (issue 24, item 2): a study or a trial that asks a local Ray
for more CPUs or GPUs than this machine has is refused in one line, exit code 2, before any Ray
process starts and before anything is written or printed; with ``--address`` the cluster is
asked once connected, and still nothing is written."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MANY = (os.cpu_count() or 1) * 32  # more CPUs than this machine has


def _study(tmp: Path, scaling: dict[str, Any], space: dict[str, Any] | None = None) -> Path:
    raw: dict[str, Any] = {
        "name": "too_big",
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "train": {"epochs": 1},
            "scaling": scaling,
        },
        "losses": ["cross_entropy"],
        "search": {"num_samples": 1, "objectives": ["val/ece"]},
    }
    if space:
        raw["space"] = space
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _calibtune(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "CUDA_VISIBLE_DEVICES": "",  # no GPU, whatever this machine has
        "RAY_TMPDIR": str(tmp / "raytmp"),  # where a Ray that started would leave its session
    }
    return subprocess.run(
        [sys.executable, "-m", "calibtune", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused_before_ray(tmp: Path, out: subprocess.CompletedProcess, *wanted: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for w in wanted:
        assert w in lines[0], lines[0]
    assert out.stdout == ""  # not even the "... on a local Ray" banner
    assert sorted(p.name for p in tmp.iterdir()) == ["s.yaml"]  # no runs/, mlflow.db, Ray temp


@pytest.mark.parametrize(
    ("scaling", "space", "wanted"),
    [
        ({"num_workers": MANY}, None, [f"needs {MANY} CPU", "CPU of this machine (a local Ray"]),
        ({"use_gpu": True}, None, ["s.yaml: trial.scaling.use_gpu: expected a visible GPU"]),
        (  # a fractional GPU (several trials packed on one GPU) still needs a GPU
            {"resources_per_worker": {"GPU": 0.25}},
            None,
            ["trial.scaling.resources_per_worker.GPU: expected a visible GPU"],
        ),
        (  # the search space's worst case counts, not only the base config
            {"num_workers": 1},
            {"scaling.num_workers": {"type": "int", "low": 1, "high": MANY}},
            [f"needs {MANY} CPU", f"a trial with space scaling.num_workers={MANY}"],
        ),
        (
            {"num_workers": 1},
            {"scaling.use_gpu": {"type": "categorical", "choices": [False, True]}},
            ["expected a visible GPU", "a trial with space scaling.use_gpu=true"],
        ),
    ],
)
def test_run_refuses_what_this_machine_cannot_hold_before_ray_starts(
    tmp_path: Path, scaling: dict, space: dict | None, wanted: list[str]
) -> None:
    _study(tmp_path, scaling, space)
    out = _calibtune(tmp_path, "run", "s.yaml")
    _refused_before_ray(tmp_path, out, *wanted)


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["--num-workers", str(MANY)], [f"needs {MANY} CPU", "this machine"]),
        (["--num-workers", "1", "--use-gpu"], ["scaling.use_gpu: expected a visible GPU"]),
    ],
)
def test_train_refuses_what_this_machine_cannot_hold_before_ray_starts(
    tmp_path: Path, args: list[str], wanted: list[str]
) -> None:
    cfg = {"data": {"name": "digits", "ood": []}, "train": {"epochs": 1}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(cfg))
    out = _calibtune(tmp_path, "train", "s.yaml", *args, "--storage-path", "runs")
    _refused_before_ray(tmp_path, out, *wanted)


def test_a_fitting_study_passes_the_machine_check() -> None:
    from calibtune.cluster._preflight import check_machine
    from calibtune.studyfile._config import study_from_text

    text = yaml.safe_dump(
        {
            "name": "fits",
            "trial": {"scaling": {"num_workers": 1}},
            "losses": ["cross_entropy"],
            "space": {"scaling.num_workers": {"type": "int", "low": 0, "high": 1}},
        }
    )
    study = study_from_text(text, "fits.yaml")
    assert [c for c, _ in study.scaling_configs()] == [
        "space scaling.num_workers=0",
        "space scaling.num_workers=1",
    ]
    check_machine(study, None)  # one CPU per trial: every machine has it
    gpu = dataclasses.replace(study, trial={"scaling": {"use_gpu": True}})
    check_machine(gpu, "ray://head:10001")  # a cluster is asked once connected, not here


def test_resume_refuses_what_this_machine_cannot_hold_before_ray_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study folder (state and study copy as `run` writes them) whose trials need more CPUs
    than this machine has: `resume` says so in one line and changes nothing there."""
    from calibtune.cli import main
    from calibtune.study import load_study
    from calibtune.studyfile._studydir import StudyDir, StudyState

    study = load_study(_study(tmp_path, {"num_workers": MANY}))
    sd = StudyDir.at(study.name, tmp_path / "studies")
    sd.write_study(study)
    sd.write_state(StudyState(f"sqlite:///{tmp_path / 'mlflow.db'}", "1", "run", None))
    before = sd.path.listdir()
    assert main(["resume", str(sd.path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"needs {MANY} CPU" in err[0], err
    assert sd.path.listdir() == before
