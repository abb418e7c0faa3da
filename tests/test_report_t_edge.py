"""A fitted temperature at either end of its grid is marked in `calibtune report`'s table
(issue 31.5): a T there is a bound of the search, not a fitted value. The grid comes from the
study file the study's parent MLflow run holds (a real SQLite store here)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from calibtune.readers._results import StudyRef, _report_row, grid_ends, t_grid_ends
from calibtune.record._tracking import TAG_T_GRID_ENDS

ROOT = Path(__file__).resolve().parents[1]
ENDS = {"ts": (0.1, 10.0), "focal_ts": (0.01, 5.0)}


def _best(t: float, focal_t: float) -> pd.Series:
    return pd.Series(
        {
            "trial_id": "t1",
            "test/error": 0.01,
            "test/ece": 0.02,
            "test/ece@ts": 0.01,
            "test/adaece@focal_ts": 0.015,
            "posthoc/ts/T": t,
            "posthoc/focal_ts/T": focal_t,
            "posthoc/focal_ts/gamma_ev": 1.0,
        }
    )


def test_a_temperature_at_an_end_of_its_grid_is_marked_in_the_report_row():
    row = _report_row(_best(0.1, 5.0), ENDS)
    assert row["ECE (TS)"] == "1.00 (0.1⚠)"
    assert row["AdaECE (focal_ts)"] == "1.50 (5.00⚠)"
    row = _report_row(_best(10.0, 0.01), ENDS)
    assert row["ECE (TS)"] == "1.00 (10.0⚠)" and row["AdaECE (focal_ts)"] == "1.50 (0.01⚠)"
    row = _report_row(_best(0.3, 1.2), ENDS)
    assert row["ECE (TS)"] == "1.00 (0.3)" and row["AdaECE (focal_ts)"] == "1.50 (1.20)"
    assert _report_row(_best(0.1, 5.0))["ECE (TS)"] == "1.00 (0.1)"  # grid unknown: no mark


@pytest.mark.slow  # a new SQLite MLflow store: its migrations take 10–40 s on 2 shared cores
def test_the_grid_ends_come_from_the_study_file_of_the_parent_run(tmp_path: Path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("edge", artifact_location=str(tmp_path / "art"))
    run = client.create_run(exp).info.run_id
    client.log_artifact(run, str(ROOT / "studies" / "results" / "digits.yaml"), "study")
    ref = StudyRef("results_digits", uri, exp, run, (("val/ece@ts", "min"),))
    assert t_grid_ends(ref) == {"ts": (0.1, 10.0), "focal_ts": (0.01, 5.0)}
    bare = client.create_run(exp).info.run_id  # no study file: nothing is marked
    assert t_grid_ends(StudyRef("x", uri, exp, bare, ())) == {}
    # the tag a study writes when it starts wins (read without building the trial config)
    client.set_tag(bare, TAG_T_GRID_ENDS, '{"ts": [0.25, 4.0]}')
    assert t_grid_ends(StudyRef("x", uri, exp, bare, ())) == {"ts": (0.25, 4.0)}
    # a study's own grid (t_min/t_max or a list) is the one read
    assert grid_ends({"ts": {"temperatures": [0.5, 1.0, 2.0]}}) == {"ts": (0.5, 2.0)}
