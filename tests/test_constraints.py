"""Accuracy-constrained search (``search.constraints``): the study file's rules, the judgment
(Optuna's convention: feasible iff every value <= 0), and a real study in which a constraint
makes some trials infeasible — marked in MLflow, Optuna and `compare`, skipped by `export`."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from calibtune.studyfile._config import StudyError, parse_study
from calibtune.studyfile._constraints import Constraint, baseline_values, judge, violations

BASE = {
    "name": "cons",
    "trial": {"data": {"name": "digits"}, "model": {"name": "mlp"}, "train": {"epochs": 1}},
    "losses": ["cross_entropy", "focal"],
    "search": {"sampler": "tpe", "objectives": ["val/ece"]},
}


def _study(constraints, sampler="tpe"):
    raw = copy.deepcopy(BASE)
    raw["search"].update(constraints=constraints, sampler=sampler)
    return parse_study(raw, "s.yaml")


def test_constraints_parse_absolute_and_relative():
    s = _study(
        [
            {"metric": "val/error", "max": 0.02},
            {"metric": "val/error", "max_over_baseline": 0.005, "baseline": "cross_entropy"},
        ]
    )
    assert s.search.constraints == (
        Constraint("val/error", "max", 0.02),
        Constraint("val/error", "max", 0.005, "cross_entropy"),
    )
    assert [str(c) for c in s.search.constraints] == [
        "val/error <= 0.02",
        "val/error <= cross_entropy's best + 0.005",
    ]
    assert _study(None).search.constraints == ()


@pytest.mark.parametrize(
    ("constraints", "sampler", "message"),
    [
        (
            [{"metric": "test/error", "max": 0.02}],
            "tpe",
            r"^s\.yaml: search\.constraints\[0\]\.metric: expected a validation metric such as "
            r"val/error \(constraints never look at test or OOD data\), got 'test/error'$",
        ),
        (
            [{"metric": "val/bogus", "max": 0.02}],
            "tpe",
            r"^s\.yaml: search\.constraints\[0\]\.metric: expected a metric the trials report "
            r".*got 'val/bogus'$",
        ),
        (
            [{"metric": "val/error", "max": 0.02}],
            "random",
            r"^s\.yaml: search\.sampler: expected tpe, nsga2, gp for a study with "
            r"search\.constraints \(the samplers that take them\), got 'random'$",
        ),
        (
            [{"metric": "val/error", "max_over_baseline": 0.01, "baseline": "ce"}],
            "tpe",
            r"search\.constraints\[0\]\.baseline: expected a loss of the study "
            r"\(cross_entropy, focal\), got 'ce'$",
        ),
        (
            [{"metric": "val/error", "max": 0.02, "baseline": "focal"}],
            "tpe",
            r"search\.constraints\[0\]\.baseline: expected nothing with max",
        ),
        (
            [{"metric": "val/error", "max": 0.02, "min": 0.0}],
            "nsga2",
            r"search\.constraints\[0\]: expected exactly one bound of max, min, "
            r"max_over_baseline, min_under_baseline, got \['max', 'metric', 'min'\]$",
        ),
        (
            [{"metric": "val/error", "max_over_baseline": -0.1, "baseline": "focal"}],
            "gp",
            r"search\.constraints\[0\]\.max_over_baseline: expected a number in \[0, inf\), "
            r"got -0\.1$",
        ),
        (
            [{"metric": "val/error", "maxx": 0.1}],
            "tpe",
            r"search\.constraints\[0\]\.maxx: expected one of metric, baseline, max, min",
        ),
        (
            {"metric": "val/error", "max": 0.1},
            "tpe",
            r"search\.constraints: expected a list of \{metric, max\|min",
        ),
    ],
)
def test_bad_constraints_are_one_line_errors(constraints, sampler, message):
    with pytest.raises(StudyError, match=message):
        _study(constraints, sampler)


def test_violations_follow_optunas_convention():
    upper = Constraint("val/error", "max", 0.1)
    lower = Constraint("val/error", "min", 0.05)
    rel = Constraint("val/error", "max", 0.01, "cross_entropy")
    # baselines: cross_entropy's best (lowest, val/error is lower-is-better) of its trials
    trials = [
        ("cross_entropy", {"val/error": 0.12}),
        ("cross_entropy", {"val/error": 0.08}),
        ("focal", {"val/error": 0.02}),  # not the baseline's
    ]
    base = baseline_values([upper, rel], trials)
    assert base == {rel: 0.08}
    # m = 0.095: 0.095 - 0.1; 0.05 - 0.095; 0.095 - (0.08 + 0.01)
    got = violations([upper, lower, rel], {"val/error": 0.095}, base)
    assert got == pytest.approx([-0.005, -0.045, 0.005])
    assert violations([upper], {}, base) == [math.inf]  # metric missing
    # baseline unknown: the sampler's default counts it met; the final judgment does not
    assert violations([rel], {"val/error": 0.5}, {rel: None}) == [0.0]
    assert judge([rel], [("focal", {"val/error": 0.0})]) == [False]
    assert judge([rel], trials) == [False, True, True]  # 0.12 > 0.09; 0.08, 0.02 <= 0.09


@pytest.mark.parametrize("sampler", ["tpe", "nsga2", "gp"])
def test_the_searcher_sets_optuna_constraints_before_telling(sampler):
    """Ray Tune's searcher (driven by hand, no Tune run) gives each ended trial its constraint
    values as Optuna trial constraints, the relative one from the baseline's best so far."""
    from calibtune.record._optuna import define_by_run, make_sampler
    from calibtune.study._constrained import ConstrainedOptunaSearch

    raw = copy.deepcopy(BASE)
    raw["losses"] = ["cross_entropy"]
    raw["search"].update(
        sampler=sampler,
        constraints=[
            {"metric": "val/error", "max": 0.15},
            {"metric": "val/error", "max_over_baseline": 0.01, "baseline": "cross_entropy"},
        ],
    )
    study = parse_study(raw, "s.yaml")
    searcher = ConstrainedOptunaSearch(
        constraints=study.search.constraints,
        space=define_by_run(study),
        metric="val/ece",
        mode="min",
        sampler=make_sampler(study),
    )
    for i, error in enumerate([0.10, 0.20, 0.05]):
        assert searcher.suggest(f"t{i}") is not None
        searcher.on_trial_complete(f"t{i}", {"val/ece": 0.1, "val/error": error})
    got = [t.constraints for t in searcher._ot_study.trials]
    # absolute: error - 0.15; relative: error - (best so far, this trial included, + 0.01)
    expected = [(-0.05, -0.01), (0.05, 0.09), (-0.10, -0.01)]
    assert [list(c) for c in got] == [
        ["val/error <= 0.15", "val/error <= cross_entropy's best + 0.01"]
    ] * 3
    assert [tuple(c.values()) for c in got] == [pytest.approx(e) for e in expected]


def test_cli_refuses_a_test_constraint_before_ray_starts(tmp_path):
    raw = copy.deepcopy(BASE)
    raw["search"]["constraints"] = [{"metric": "test/error", "max": 0.1}]
    raw["storage"] = str(tmp_path / "studies")
    raw["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    calibtune = Path(sys.executable).parent / "calibtune"
    run = subprocess.run(
        [str(calibtune), "run", str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "search.constraints[0].metric: expected a validation" in lines[0]
    assert not (tmp_path / "studies").exists() and not (tmp_path / "mlflow.db").exists()


# ----------------------------------------------------------------------------- a real study

#: lr 1e-6 leaves the MLP untrained after one epoch (val/error ~0.9), lr 0.3 trains it (val/error
#: ~0.5): the bound lies between them.
BOUND = 0.6


@pytest.fixture(scope="module")
def constrained(tmp_path_factory, ray_session):
    from calibtune.study import load_study, run_study

    tmp = tmp_path_factory.mktemp("cons")
    raw = {
        "name": "cons",
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "mlp"},
            "train": {"epochs": 1, "batch_size": 64},
            "eval": {"posthoc": []},
        },
        "losses": ["cross_entropy"],
        "space": {"optimizer.lr": {"type": "categorical", "choices": [1.0e-6, 0.3]}},
        "search": {
            "sampler": "tpe",
            "sampler_seed": 7,  # its first 4 points: lr 0.3, 0.3, 1e-6, 1e-6
            "num_samples": 4,
            "max_concurrent": 2,
            "objectives": [{"metric": "val/ece", "mode": "min"}],
            "constraints": [
                {"metric": "val/error", "max": BOUND},
                {"metric": "val/error", "max_over_baseline": 0.2, "baseline": "cross_entropy"},
            ],
        },
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": "cons"},
        "storage": str(tmp / "studies"),
    }
    path = tmp / "cons.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    outcome = run_study(load_study(path), verbose=0)
    assert outcome.counts["finished"] == 4, outcome.counts
    return outcome


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_infeasible_trials_are_marked_in_mlflow_optuna_and_compare(constrained, tmp_path):
    import optuna
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from calibtune.readers._results import compare_table, locate_study

    ref = locate_study(constrained.storage)
    runs = MlflowClient(constrained.tracking_uri).search_runs(
        [constrained.experiment_id],
        f"tags.`mlflow.parentRunId` = '{constrained.parent_run_id}'",
    )
    errors = {r.data.tags["calibtune.trial_id"]: r.data.metrics["val/error"] for r in runs}
    best_error = min(errors.values())  # the baseline's best: every trial is cross_entropy
    expected = {t: e <= BOUND and e <= best_error + 0.2 for t, e in errors.items()}
    assert set(expected.values()) == {True, False}, errors  # the bound lies between trials
    for r in runs:
        ok = expected[r.data.tags["calibtune.trial_id"]]
        assert r.data.tags["calibtune.feasible"] == ("yes" if ok else "no")
        assert r.info.run_name.endswith(" [infeasible]") is not ok, r.info.run_name
    table = compare_table(ref)
    assert dict(zip(table["trial_id"], table["feasible"], strict=True)) == expected
    assert "val/error" in table.columns
    # the parent run's summary table (refreshed as trials end) has the column too
    client = MlflowClient(constrained.tracking_uri)
    local = client.download_artifacts(
        constrained.parent_run_id, "summary/compare.csv", str(tmp_path)
    )
    summary = pd.read_csv(local, dtype={"trial_id": str})
    assert dict(zip(summary["trial_id"], summary["feasible"], strict=True)) == expected
    # the parent's "best" is the best feasible trial by the objective (val/ece), as export's
    eces = {r.data.tags["calibtune.trial_id"]: r.data.metrics["val/ece"] for r in runs}
    tagged = client.get_run(constrained.parent_run_id).data.tags["calibtune.best_trial"]
    assert expected[tagged]  # trials can tie (same config and seed): compare values
    assert eces[tagged] == min(e for t, e in eces.items() if expected[t])
    # the persisted Optuna study: Optuna's trial constraints, the absolute one = m - BOUND
    ot = optuna.load_study(study_name="cons", storage=f"sqlite:///{constrained.storage}/optuna.db")
    done = [t for t in ot.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 4
    for t in done:
        error = errors[t.user_attrs["tune_trial_id"]]
        assert len(t.constraints) == 2
        assert t.constraints[f"val/error <= {BOUND:g}"] == pytest.approx(error - BOUND)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_export_picks_the_best_feasible_trial(constrained, tmp_path):
    import dataclasses

    from calibtune.readers._results import compare_table, export_best, locate_study

    ref = locate_study(constrained.storage)
    table = compare_table(ref)  # sorted by val/ece, best first
    feasible = table[table["feasible"].astype(bool)]
    assert 0 < len(feasible) < len(table), table
    [path] = export_best(ref, tmp_path / "out")
    text = path.read_text()
    assert f"trial {feasible.iloc[0]['trial_id']} " in text.splitlines()[0]
    assert "among the trials that meet val/error <= 0.6" in text.splitlines()[0]
    strict = dataclasses.replace(ref, constraints=(Constraint("val/error", "max", 0.0),))
    with pytest.raises(ValueError, match=r"expected a finished trial that meets them .*none"):
        export_best(strict, tmp_path / "none")
    assert not (tmp_path / "none").exists()
