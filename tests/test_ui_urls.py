"""What `calibtune ui` prints: the UI's address, then one URL per calibtune experiment that
opens on its training runs (MLflow 3.17 picks the GenAI pages otherwise; the browser check is
tests/test_ui_browser.py::test_experiment_opens_on_the_training_runs)."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from calibtune.readers._ui import runs_url, ui_lines
from calibtune.record._tracking import experiment_id


def test_ui_lines_list_calibtune_experiments_with_their_runs_url(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = experiment_id(uri, "calibtune/a")
    second = experiment_id(uri, "calibtune/b")
    MlflowClient(uri).create_experiment("someone else's")  # not calibtune's: not listed
    base = "http://127.0.0.1:5123"
    lines = ui_lines(uri, base)
    assert lines[0] == f"MLflow UI for {uri}: {base}   (Ctrl-C to stop)"
    assert sorted(lines[1:]) == [  # newest first; both created within the same second here
        f"  calibtune/a: {base}/#/experiments/{first}/runs?workflowType=machine_learning",
        f"  calibtune/b: {base}/#/experiments/{second}/runs?workflowType=machine_learning",
    ]
    assert runs_url(base, "7") == f"{base}/#/experiments/7/runs?workflowType=machine_learning"
