"""A study's trials leave their figures to the driver (`MlflowTrialCallback(figures_for=...)`,
`render_deferred_figures`): the trial writes no figures, its run is tagged after its data files
are logged, and the driver logs the same figure files a trial draws itself, once per run, also
after a driver died before untagging, and from the logged data when the trial ran elsewhere.
The study's end (`drain_summaries`) renders what a previous driver left (a resumed study)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from calibtune.plots import save_trial_figures
from calibtune.record import _tracking as TR
from calibtune.trial import config_from_dict, run

STUDY = "deferred"


@pytest.fixture(scope="module")
def trial(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One deferring trial (adaptive loss: every figure has data), logged to a SQLite store."""
    tmp = tmp_path_factory.mktemp("deferred")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    exp = TR.experiment_id(uri, "deferred")
    run_id = TR._client(uri).create_run(exp).info.run_id
    cb = TR.MlflowTrialCallback(uri, run_id, figures_for=STUDY)
    cfg = config_from_dict(
        {
            "name": "t",
            "storage_path": str(tmp / "trials"),
            "seed": 3,
            "data": {"name": "digits", "ood": ["digits_far"]},
            "model": {"name": "mlp"},
            "loss": {"name": "adafocal"},
            "optimizer": {"lr": 0.05},
            "train": {"epochs": 2, "batch_size": 64},
            "eval": {"posthoc": ["ts"], "bootstrap": 0},
        }
    )
    res = run(cfg, callbacks=[cb])
    client = TR._client(uri)
    seen = {  # before any test renders (the driver draws into the trial's folder)
        "on_disk": (res.artifacts_dir / "figures").exists(),
        "tags": client.get_run(run_id).data.tags,
        "logged": {a.path for a in client.list_artifacts(run_id)},
    }
    expected = tmp / "expected"
    shutil.copytree(res.artifacts_dir, expected)
    names = {p.name for p in save_trial_figures(expected)}  # what a trial draws itself
    TR._client(uri).delete_tag(run_id, TR.TAG_FIGURES)  # the other tests tag their own runs
    return {"uri": uri, "exp": exp, "art": res.artifacts_dir, "names": names, **seen}


def _figures(trial: dict[str, Any], run_id: str) -> list[str]:
    arts = TR._client(trial["uri"]).list_artifacts(run_id, "figures")
    return sorted(a.path.rsplit("/", 1)[1] for a in arts)


def _tagged_copy(trial: dict[str, Any], tmp_path: Path, study: str = STUDY) -> tuple[str, Path]:
    """A new run holding a copy of the trial's artifacts, logged as a deferring trial logs."""
    art = tmp_path / "artifacts"
    shutil.copytree(trial["art"], art)
    run_id = TR._client(trial["uri"]).create_run(trial["exp"]).info.run_id
    TR.MlflowTrialCallback(trial["uri"], run_id, figures_for=study).on_trial_end({}, art)
    return run_id, art


def test_the_trial_draws_no_figures_and_tags_its_run(trial: dict[str, Any]) -> None:
    assert trial["names"] == {
        "reliability.png",
        "gamma_dynamics.png",
        "roc.png",
        "shift.png",
        "risk_coverage.png",
    }
    assert not trial["on_disk"]
    assert trial["tags"][TR.TAG_FIGURES] == STUDY
    assert trial["tags"][TR.TAG_ARTIFACTS] == str(trial["art"].resolve())
    assert set(TR.FIGURE_DATA) <= trial["logged"] and "figures" not in trial["logged"]


def test_the_driver_logs_the_same_figures_once(trial: dict[str, Any], tmp_path: Path) -> None:
    run_id, art = _tagged_copy(trial, tmp_path)
    assert TR.render_deferred_figures(trial["uri"], trial["exp"], STUDY) >= 1
    assert _figures(trial, run_id) == sorted(trial["names"])
    assert {p.name for p in (art / "figures").iterdir()} == trial["names"]  # on disk too
    assert TR.TAG_FIGURES not in TR._client(trial["uri"]).get_run(run_id).data.tags
    assert TR.render_deferred_figures(trial["uri"], trial["exp"], STUDY) == 0  # nothing left
    # a driver killed after logging, before untagging: the next one logs the same files again
    TR._client(trial["uri"]).set_tag(run_id, TR.TAG_FIGURES, STUDY)
    assert TR.render_deferred_figures(trial["uri"], trial["exp"], STUDY) == 1
    assert _figures(trial, run_id) == sorted(trial["names"])


def test_a_trial_from_another_machine_is_drawn_from_its_logged_data(
    trial: dict[str, Any], tmp_path: Path
) -> None:
    run_id, art = _tagged_copy(trial, tmp_path)
    shutil.rmtree(art)  # the driver cannot see the trial's folder
    assert TR.render_deferred_figures(trial["uri"], trial["exp"], STUDY) == 1
    assert _figures(trial, run_id) == sorted(trial["names"])


def test_another_studys_runs_are_left_to_it(trial: dict[str, Any], tmp_path: Path) -> None:
    run_id, _ = _tagged_copy(trial, tmp_path, study="other")
    assert TR.render_deferred_figures(trial["uri"], trial["exp"], STUDY) == 0
    assert _figures(trial, run_id) == []


def test_the_study_end_renders_what_a_dead_driver_left(
    trial: dict[str, Any], tmp_path: Path
) -> None:
    """A resumed study whose first driver died before drawing: Tune calls its progress
    callback's ``setup``, and `drain_summaries` (after ``Tuner.fit``) draws the figures."""
    from calibtune.study._progress import _progress, drain_summaries
    from calibtune.study._trainable import StudyPayload
    from calibtune.studyfile._config import load_study

    study = load_study(Path(__file__).parents[1] / "studies" / "quickstart.yaml")
    run_id, _ = _tagged_copy(trial, tmp_path, study=study.name)
    payload = StudyPayload(study, trial["uri"], trial["exp"], "parent", str(tmp_path))
    _progress(study, payload, None, tmp_path).setup(stop=None, num_samples=8, total_num_samples=8)
    assert _figures(trial, run_id) == []
    drain_summaries()
    assert _figures(trial, run_id) == sorted(trial["names"])
    drain_summaries()  # forgotten once drawn: a later study in this process starts clean


DEFERRING_PROCESS = """
import sys
from calibtune.record import _tracking as TR
from calibtune.trial import config_from_dict, run

tmp, = sys.argv[1:]
uri = f"sqlite:///{tmp}/mlflow.db"
run_id = TR._client(uri).create_run(TR.experiment_id(uri, "deferred")).info.run_id
cfg = {"name": "t", "storage_path": f"{tmp}/trials", "data": {"name": "digits"},
       "model": {"name": "mlp"}, "train": {"epochs": 1, "batch_size": 256}}
res = run(config_from_dict(cfg), callbacks=[TR.MlflowTrialCallback(uri, run_id, figures_for="s")])
assert res.metrics and not (res.artifacts_dir / "figures").exists()
print(sorted(m for m in ("matplotlib", "calibtune.plots") if m in sys.modules))
"""


def test_a_deferring_trial_process_never_imports_matplotlib(tmp_path: Path) -> None:
    """A study's seed-task processes defer their figures: importing matplotlib there (≈ 1 s of
    CPU per fresh process) would only delay the seeds."""
    out = subprocess.run(
        [sys.executable, "-c", DEFERRING_PROCESS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
