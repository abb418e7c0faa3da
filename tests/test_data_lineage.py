"""Data lineage without Ray: content digests of the real splits and OOD/shift sets, logged as
MLflow dataset inputs (real SQLite store), and `compare`/`report` on trials that saw different
data."""

from __future__ import annotations

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.utils.data import TensorDataset

from calibtune.cli import main
from calibtune.data import NormalizedImages
from calibtune.data._digest import DataInput, array_digest, data_inputs, dataset_digest
from tests.test_study_dashboard import _fake_trials, _study_file


def test_digest_is_of_the_content_not_the_object():
    x, y = torch.arange(12.0).reshape(3, 4), torch.tensor([0, 1, 2])
    assert dataset_digest(TensorDataset(x, y)) == dataset_digest(TensorDataset(x.clone(), y))
    assert dataset_digest(TensorDataset(x, y)) != dataset_digest(TensorDataset(x, y.flip(0)))
    assert array_digest(x) != array_digest(x.reshape(4, 3))  # the shape counts
    images = torch.zeros(2, 1, 2, 2, dtype=torch.uint8)
    a = NormalizedImages(images, torch.tensor([0, 1]), (0.5,), (0.25,))
    b = NormalizedImages(images, torch.tensor([0, 1]), (0.4,), (0.25,))
    assert dataset_digest(a) != dataset_digest(b)  # the normalisation is part of the data


def test_digits_inputs_per_context_seed_and_cache():
    one = data_inputs("digits", None, 1, 0.1, ("digits_far",), ("digits_noise",))
    by_name = {i.name: i for i in one}
    assert [i.context for i in one] == ["training", "validation", "test", "ood"] + ["shift"] * 5
    assert by_name["digits/train"].num_samples + by_name["digits/val"].num_samples == 1438
    assert data_inputs("digits", None, 1, 0.1, ("digits_far",), ("digits_noise",)) is one  # cached
    two = {i.name: i.digest for i in data_inputs("digits", None, 2, 0.1, (), ())}
    # the seed draws the train/validation split; the test split is fixed
    assert two["digits/train"] != by_name["digits/train"].digest
    assert two["digits/test"] == by_name["digits/test"].digest


def _fake_study(tmp_path, test_digests: dict[str, str]):
    """A study folder whose trials (cross_entropy t0, focal t1) logged these test digests."""
    from calibtune.record._lineage import log_data_inputs
    from calibtune.studyfile._studydir import StudyDir, StudyState

    study = _study_file(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("dash")
    parent = client.create_run(exp_id).info.run_id
    done = {"val/ece@ts": 0.1, "test/error": 0.1, "test/ece": 0.05}
    _fake_trials(uri, exp_id, parent, [("cross_entropy", None, "finished", done),
                                       ("focal", 2.0, "finished", done)])  # fmt: skip
    runs = client.search_runs([exp_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    for r in runs:
        trial = r.data.tags["calibtune.trial_id"]
        inputs = [DataInput("digits/train", "training", "aa", 10),
                  DataInput("digits/test", "test", test_digests[trial], 5)]  # fmt: skip
        for _ in range(2):  # a resumed trial logs them again: MLflow keeps one of each
            log_data_inputs(uri, r.info.run_id, inputs)
        assert len(client.get_run(r.info.run_id).inputs.dataset_inputs) == 2
    sd = StudyDir.at(study.name, study.storage)
    sd.write_study(study)
    sd.write_state(StudyState(uri, exp_id, parent, None))
    return sd


def test_same_data_compares_and_pairs_without_a_note(tmp_path, capsys):
    sd = _fake_study(tmp_path, {"t0": "bb", "t1": "bb"})
    capsys.readouterr()
    assert main(["compare", str(sd.path)]) == 0
    assert "calibtune:" not in capsys.readouterr().err


def test_different_data_is_said_by_compare_and_report_and_refused_by_baseline(tmp_path, capsys):
    sd = _fake_study(tmp_path, {"t0": "bb", "t1": "cc"})
    capsys.readouterr()  # the store's creation lines
    assert main(["compare", str(sd.path)]) == 0
    out, err = capsys.readouterr()
    assert "t0" in out and "t1" in out  # the table as before
    assert err.strip() == (
        "calibtune: note: these trials were trained or evaluated on different data (digests "
        "differ): test: 2 versions (t0 | t1)"
    )
    assert main(["report", str(sd.path)]) == 0
    assert "test: 2 versions" in capsys.readouterr().err
    assert main(["report", str(sd.path), "--baseline", "cross_entropy"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--baseline: expected focal's best trial t1 and the baseline's t0 trained and " in err
    assert "different test data (digests differ)" in err


@pytest.mark.parametrize("ctx", ["training", "validation", "test", "ood", "shift"])
def test_the_trial_callback_logs_each_input_once_with_its_context(tmp_path, ctx):
    from calibtune.record._tracking import MlflowTrialCallback

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("cb")).info.run_id
    cb = MlflowTrialCallback(uri, run_id, inputs=[DataInput(f"x/{ctx}", ctx, "0f", 3)])
    cb.on_start([])
    cb.on_start([])  # resumed
    (d,) = client.get_run(run_id).inputs.dataset_inputs
    assert (d.dataset.name, d.dataset.digest) == (f"x/{ctx}", "0f")
    assert {t.key: t.value for t in d.tags} == {"mlflow.data.context": ctx}


def test_a_trials_inputs_are_the_split_it_trains_on_drawn_with_split_seed():
    from calibtune.record._lineage import trial_inputs
    from calibtune.trial import config_from_dict

    cfg = config_from_dict({"seed": 5, "data": {"name": "digits", "ood": [], "shift": []}})
    assert cfg.data.split_seed == 1
    ours = {i.name: i.digest for i in trial_inputs(cfg)}
    split = {i.name: i.digest for i in data_inputs("digits", None, 1, 0.1, (), ())}
    assert ours == split  # the trial's seed (5) draws no split


@pytest.mark.slow  # four processes importing MLflow, 24 runs: ~11 s
def test_trials_starting_together_log_the_same_new_data_without_failing(tmp_path):
    # MLflow looks a dataset up, then inserts it: processes logging the same new dataset at
    # once collide on its unique key (a study's trial failed so); the loser logs again
    import multiprocessing as mp

    from tests._lineage_race import log_rounds

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("race")
    procs, rounds = 4, 6
    runs = [[client.create_run(exp_id).info.run_id for _ in range(rounds)] for _ in range(procs)]
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=log_rounds, args=(uri, r, barrier, out)) for r in runs]
    for w in workers:
        w.start()
    results = [out.get(timeout=120) for _ in range(procs * rounds)]
    for w in workers:
        w.join(timeout=60)
    assert [r for r in results if r != "ok"] == []
    for run_id in (r for rs in runs for r in rs):  # every run has its six inputs, once each
        assert len(client.get_run(run_id).inputs.dataset_inputs) == 6
    assert len({d.dataset.name for d in client.get_run(runs[0][0]).inputs.dataset_inputs}) == 6
