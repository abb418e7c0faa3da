"""Study budgets and extension on real Ray Tune + Optuna + MLflow SQLite (digits, mlp, 1 epoch):
``search.time_budget`` stops a session with its state saved and says what was not run;
``calibtune run STUDY --more N`` adds trials to a finished study, continuing its Optuna study and
MLflow parent run without training a finished trial again."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from calibtune.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _study(tmp: Path, name: str, search: dict | None = None) -> Path:
    raw = {
        "name": name,
        "trial": {
            "data": {"name": "digits"},
            "model": {"name": "mlp"},
            "optimizer": {"lr": 0.05},
            "train": {"epochs": 1, "batch_size": 64, "checkpoint_every": 1},
        },
        "losses": [{"name": "focal", "space": str(ROOT / "search_spaces" / "focal.yaml")}],
        "search": {
            "sampler": "tpe",
            "num_samples": 2,
            "max_concurrent": 2,
            "objectives": [{"metric": "val/ece", "mode": "min"}],
            **(search or {}),
        },
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": name},
        "storage": str(tmp / "studies"),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _one_line_exit_2(capsys, argv: list[str], match: str) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals exit
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err


# ----------------------------------------------------------------------------- without Ray


@pytest.mark.parametrize(
    ("value", "shown"), [(0, "0.0"), (-5, "-5.0"), ("ten", "'ten'"), (True, "True")]
)
def test_time_budget_is_checked_in_one_line(tmp_path, capsys, value, shown):
    path = _study(tmp_path, "badbudget", {"time_budget": value})
    _one_line_exit_2(
        capsys,
        ["run", str(path)],
        f"search.time_budget: expected a number in (0, inf), got {shown}",
    )


@pytest.mark.parametrize("more", ["0", "-1", "two"])
def test_more_is_a_positive_count(tmp_path, capsys, more):
    path = _study(tmp_path, "badmore")
    _one_line_exit_2(capsys, ["run", str(path), "--more", more], "expected an integer >= 1")


def test_more_refuses_a_study_that_never_ran(tmp_path, capsys):
    path = _study(tmp_path, "fresh")
    _one_line_exit_2(capsys, ["run", str(path), "--more", "2"], "expected a study that has run in")
    assert not (tmp_path / "studies" / "fresh").exists()  # nothing written


def test_the_new_rounds_sampler_starts_from_the_persisted_history(tmp_path):
    """`ConstrainedOptunaSearch(history=...)` holds the earlier rounds' trials before its first
    suggestion, and pickles without a second copy of them."""
    import pickle

    from calibtune.record._optuna import define_by_run, make_sampler, persist_ended
    from calibtune.study import load_study
    from calibtune.study._constrained import ConstrainedOptunaSearch
    from calibtune.study._extend import optuna_history

    study = load_study(_study(tmp_path, "hist"))
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    done = {"calibtune/done": 1, "val/ece": 0.1}
    ended = [(f"t{i}", {"loss": "focal", "focal": {"gamma": 1.0 + i}}, done, False) for i in (0, 1)]
    persist_ended(study, storage, ended, {"t0": {1: 0.1}})
    history = optuna_history(study, storage)
    assert [t.params["focal/gamma"] for t in history] == [1.0, 2.0]
    searcher = ConstrainedOptunaSearch(
        space=define_by_run(study), metric="val/ece", mode="min",
        sampler=make_sampler(study), study_name="hist", history=history,
    )  # fmt: skip
    trials = searcher._ot_study.trials
    assert [(t.state.name, t.values, t.intermediate_values) for t in trials] == [
        ("COMPLETE", [0.1], {1: 0.1}),
        ("COMPLETE", [0.1], {}),
    ]
    assert pickle.loads(pickle.dumps(searcher))._history == []


def test_a_raised_num_samples_alone_asks_for_the_difference(tmp_path):
    from calibtune.study import load_study
    from calibtune.study._extend import added_samples
    from calibtune.studyfile._studydir import StudyDir

    sd = StudyDir.at("grow", tmp_path / "studies")
    sd.write_study(load_study(_study(tmp_path, "grow")))  # num_samples 2, as it ran
    saved = sd.read_study()
    assert added_samples(load_study(_study(tmp_path, "grow", {"num_samples": 5})), saved) == 3
    assert added_samples(load_study(_study(tmp_path, "grow", {"num_samples": 1})), saved) == 0
    changed = {"num_samples": 5, "sampler_seed": 7}  # another study: the saved one continues
    assert added_samples(load_study(_study(tmp_path, "grow", changed)), saved) == 0


# ----------------------------------------------------------------------------- with Ray


@pytest.mark.slow
def test_more_continues_the_optuna_study_and_parent_run(tmp_path, capsys, ray_session):
    from calibtune.readers._summary import load_optuna_study
    from calibtune.studyfile._studydir import StudyDir

    path = _study(tmp_path, "rounds")
    assert main(["run", str(path)]) == 0
    sd = StudyDir.at("rounds", tmp_path / "studies")
    state = sd.read_state()
    client = MlflowClient(state.tracking_uri)

    def children():
        runs = client.search_runs(
            [state.experiment_id], f"tags.`mlflow.parentRunId` = '{state.parent_run_id}'"
        )
        return {r.data.tags["calibtune.trial_id"]: r for r in runs}

    first = children()
    epochs = {t: len(client.get_metric_history(r.info.run_id, "epoch")) for t, r in first.items()}
    assert main(["run", str(path), "--more", "2"]) == 0
    out = capsys.readouterr().out
    assert "study rounds: 2 more trials" in out and "4 finished" in out, out
    assert sd.read_state().parent_run_id == state.parent_run_id  # the same parent run
    after = children()
    assert len(after) == 4 and set(first) < set(after)
    for t, r in first.items():  # the finished trials were not trained again
        assert after[t].info.run_id == r.info.run_id
        assert len(client.get_metric_history(r.info.run_id, "epoch")) == epochs[t] == 1
    ot = load_optuna_study("rounds", f"sqlite:///{sd.optuna_db}")
    assert [t.number for t in ot.trials] == [0, 1, 2, 3]
    assert {t.user_attrs["tune_trial_id"] for t in ot.trials} == set(after)
    assert all(len(t.intermediate_values) == 1 for t in ot.trials)  # learning curves (1 epoch)
    assert sd.read_study().search.num_samples == 4  # the study copy counts all rounds
    parent = client.get_run(state.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["study/trials_finished"] == 4
    # data lineage: every trial's splits and OOD/shift sets as dataset inputs, the same for all
    for r in after.values():
        contexts = {t.value for d in r.inputs.dataset_inputs for t in d.tags}
        assert contexts == {"training", "validation", "test", "ood", "shift"}, contexts
    assert len({tuple(sorted((d.dataset.name, d.dataset.digest) for d in r.inputs.dataset_inputs))
                for r in after.values()}) == 1  # fmt: skip
    capsys.readouterr()
    assert main(["compare", str(sd.path)]) == 0
    assert "different data" not in capsys.readouterr().err
    # a larger num_samples in the study file, nothing else changed: one more trial
    _study(tmp_path, "rounds", {"num_samples": 5})
    assert main(["run", str(path)]) == 0
    assert len(children()) == 5 and set(after) < set(children())
    assert sd.read_study().search.num_samples == 5


@pytest.mark.slow
def test_time_budget_stops_the_session_with_its_state_saved(tmp_path, capsys, ray_session):
    from calibtune.studyfile._studydir import StudyDir

    path = _study(tmp_path, "budget", {"num_samples": 3, "max_concurrent": 1, "time_budget": 1})
    code = main(["run", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("calibtune: study budget: time budget of 1 s spent: "), err
    assert "of 3 trials not run yet" in err[-1] and "calibtune resume" in err[-1]
    assert code in (0, 1)  # 0 when a trial finished within the second
    sd = StudyDir.at("budget", tmp_path / "studies")
    sd.check_restorable()  # Tune's state saved: `resume` continues it
    state = sd.read_state()
    client = MlflowClient(state.tracking_uri)
    runs = client.search_runs(
        [state.experiment_id], f"tags.`mlflow.parentRunId` = '{state.parent_run_id}'"
    )
    # the trial the budget interrupted stays resumable: not marked failed
    assert {r.data.tags["calibtune.status"] for r in runs} <= {"running", "finished"}
    assert client.get_run(state.parent_run_id).info.status in ("FINISHED", "KILLED")
    _one_line_exit_2(capsys, ["run", str(path), "--more", "1"], "trials ended before adding more")
