"""`calibtune report` on a text study (issue 44, item 6): the shipped Mukhoti et al. 20 Newsgroups
study, shrunk to two arms, one seed and one epoch on a few documents of four newsgroups in the
official layout, runs for real (Ray Tune + MLflow SQLite in tmp) and `report` prints the papers'
table for it with the columns of an image study, each value the trial's logged test metric."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pytest
import yaml

from calibtune.cli import main
from calibtune.study import load_study, locate_study, run_study, trials_frame
from tests.test_text_newsgroups import write_glove, write_newsgroups

# `long`: the text networks train end to end in `make test` (tests/test_text_newsgroups.py,
# tests/test_sst_treelstm.py) and `report` renders the papers' table of a study there
# (tests/test_paired_report.py)
pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "studies" / "mukhoti2020_focal_20newsgroups.yaml"
#: the columns `report` gives an image study with temperature scaling and no OOD set
#: (tests/test_study_e2e.py reads the same table for digits)
IMAGE_COLUMNS = [
    "loss",
    "Error",
    "ECE",
    "ECE (TS)",
    "AdaECE",
    "AdaECE (TS)",
    "Classwise ECE",
    "Classwise ECE (TS)",
    "ECE (focal TS)",
    "NLL",
    "trial",
]


def _small_copy(tmp: Path) -> Path:
    """The shipped study with its protocol kept (network, optimizer, selection, TS, reductions)
    and only its size and places changed: tiny files, one epoch, two arms, one seed."""
    raw = yaml.safe_load(SHIPPED.read_text())
    trial = raw["trial"]
    # 20 documents: 4 test, 4 validation (a quarter of the 16 left), 12 trained
    trial["data"].update(root=str(tmp), val_fraction=0.25)
    trial["train"].update(epochs=1, batch_size=8, checkpoint_every=1)
    trial["eval"].update(figures=False, bootstrap=0)
    trial["scaling"] = {"num_workers": 1, "use_gpu": False}
    keep = ("cross_entropy", "flsd53")
    raw["losses"] = [c for c in raw["losses"] if c.get("label", c["name"]) in keep]
    raw["search"].update(num_samples=2, seeds=[1], max_concurrent=1)
    raw["tracking"] = {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": "text-report"}
    raw["storage"] = str(tmp / "studies")
    path = tmp / "text_report.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_report_prints_the_papers_table_for_a_text_study(tmp_path, capsys, ray_session):
    write_newsgroups(tmp_path, per_group=5)
    write_glove(tmp_path, dims=(100,))
    path = _small_copy(tmp_path)
    study = load_study(path)
    base = study.base_config()
    assert (base.data.name, base.model.name, base.eval.select_epoch) == (
        "20newsgroups",
        "global_pool_cnn",
        "best",
    )
    outcome = run_study(study, verbose=0)
    assert outcome.counts.get("finished") == 2, outcome.counts
    capsys.readouterr()

    assert main(["report", str(path), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(rows[0]) == IMAGE_COLUMNS
    assert sorted(r["loss"] for r in rows) == ["cross_entropy", "flsd53"]  # one row per arm
    trials = trials_frame(locate_study(path)).set_index("trial_id")
    for r in rows:
        logged = trials.loc[r["trial"]]
        assert float(r["Error"]) == pytest.approx(100 * logged["test/error"]), r
        assert float(r["ECE"]) == pytest.approx(100 * logged["test/ece"]), r
        assert float(r["NLL"]) == pytest.approx(logged["test/nll"], rel=1e-6), r
        t = logged["posthoc/ts/T"]
        assert 0.1 <= t <= 10.0
        ece_ts, shown_t = r["ECE (TS)"].split(" (")
        assert float(ece_ts) == pytest.approx(100 * logged["test/ece@ts"], abs=0.005), r
        assert math.isclose(float(shown_t.rstrip(")⚠")), t, abs_tol=0.05), r

    assert main(["report", str(path)]) == 0  # the markdown table, as for an image study
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| " + " | ".join(IMAGE_COLUMNS) + " |"
    assert sorted(line.split(" | ")[0] for line in table[2:]) == ["| cross_entropy", "| flsd53"]
