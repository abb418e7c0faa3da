"""Study and search-space files: validation with one-line errors naming file, key and rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from calibtune.cli import main
from calibtune.losses import LOSSES
from calibtune.record._optuna import define_by_run
from calibtune.study import StudyError, load_loss_space, load_study
from calibtune.study._trainable import trial_dict

ROOT = Path(__file__).resolve().parents[1]

GOOD = {
    "name": "t",
    "trial": {"data": {"name": "digits"}, "model": {"name": "mlp"}, "train": {"epochs": 2}},
    "losses": [
        "cross_entropy",
        {"name": "focal", "params": {"gamma": {"type": "float", "low": 0.5, "high": 5.0}}},
    ],
    "search": {"num_samples": 4, "objectives": [{"metric": "val/ece", "mode": "min"}]},
}


def _with(path: str, value, base=None) -> dict:
    import copy

    d = copy.deepcopy(base or GOOD)
    node = d
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
    if isinstance(node, list):
        node[int(keys[-1])] = value
    elif value is _DROP:
        node.pop(keys[-1])
    else:
        node[keys[-1]] = value
    return d


_DROP = object()

MALFORMED = [
    (["not", "a", "mapping"], r"study: expected a mapping"),
    (_with("name", _DROP), r"name: expected a name of letters"),
    (
        _with("name", "my study!"),
        r"name: expected a name of letters, digits, _.- \(starting with a letter or digit, "
        r"≤ 100 chars\), got 'my study!'",
    ),
    (_with("serch", {}), r"serch: unknown key; expected one of name, description, trial"),
    (_with("trial.loss", {"name": "focal"}), r"trial.loss: unknown key; the losses to compare"),
    (
        _with("trial.train.epochs", "ten"),
        r"trial.train.epochs: expected an integer in \[1, 100000\], got 'ten'",
    ),
    (_with("trial.data.name", "cifar11"), r"trial.data.name: expected one of .*cifar10"),
    (_with("losses", []), r"losses: expected a non-empty list of losses, got \[\]"),
    (
        _with("losses.0", "focall"),
        r"losses\[0\].loss: expected one of .*cross_entropy.*got 'focall'",
    ),
    (_with("losses.0", "focal"), r"losses\[1\]: expected distinct losses .* got 'focal' twice"),
    (
        _with("losses.1", {"name": "focal", "params": {"lam": 1.0}}),
        r"losses\[1\].params.lam: unknown parameter of loss 'focal'; expected one of .*gamma",
    ),
    (
        _with(
            "losses.1",
            {"name": "focal", "params": {"gamma": {"type": "float", "low": 5, "high": 1}}},
        ),
        r"losses\[1\].params.gamma: `low <= high` must hold, but got \(low=5.0, high=1.0\)",
    ),
    (
        _with(
            "losses.1",
            {"name": "focal", "params": {"gamma": {"type": "float", "low": -1, "high": 1}}},
        ),
        r"losses\[1\].params.gamma: expected values that are a number in \[0, inf\), got -1",
    ),
    (
        _with(
            "losses.1",
            {"name": "focal", "params": {"gamma": {"type": "normal", "low": 0, "high": 1}}},
        ),
        r"losses\[1\].params.gamma.type: expected one of float, int, categorical, got 'normal'",
    ),
    (
        _with("losses.1", {"name": "focal", "space": "nowhere/focal.yaml"}),
        r"nowhere/focal.yaml: expected a search-space file, found nothing at that path",
    ),
    (
        _with("search.num_samples", "ten"),
        r"search.num_samples: expected an integer >= 1, got 'ten'",
    ),
    (
        _with("search.max_concurrent", 0),
        r"search.max_concurrent: expected auto or an integer >= 1, got 0",
    ),
    (_with("search.sampler", "bayes"), r"search.sampler: expected one of tpe, random, grid"),
    (
        _with("search.objectives", [{"metric": "test/ece"}]),
        r"search.objectives\[0\].metric: expected a validation metric .* got 'test/ece'",
    ),
    (
        _with("search.objectives", [{"metric": "val/ece", "mode": "lowest"}]),
        r"search.objectives\[0\].mode: expected 'min' or 'max', got 'lowest'",
    ),
    (
        _with("search", {"scheduler": "asha", "objectives": ["val/ece", "val/error"]}),
        r"search.scheduler: expected 'none' for a multi-objective study",
    ),
    (_with("search.seeds", []), r"search.seeds: expected a non-empty list of integers, got \[\]"),
    (
        _with("search.reuse_actors", "yes"),
        r"search.reuse_actors: expected a boolean \(true/false\), got 'yes'",
    ),
    (_with("search.sampler", "grid"), r"search.sampler: expected categorical distributions only"),
    (
        _with("tracking", {"experiment": 5}),
        r"tracking.experiment: expected an experiment name of /-separated parts .* got 5",
    ),
    (
        _with("space", {"optimizer.lr": {"type": "float", "low": 0, "high": 0.1, "log": True}}),
        r"space.optimizer.lr: `low > 0` must hold for `log=True`",
    ),
    (
        _with("space", {"train.epochs": {"type": "int", "low": 0, "high": 3}}),
        r"space.train.epochs: value 0 is not valid here "
        r"\(train.epochs: expected an integer in \[1,",
    ),
]


@pytest.mark.parametrize(("raw", "match"), MALFORMED)
def test_malformed_study_gives_one_line_error_with_file(tmp_path, raw, match):
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(StudyError, match=match) as info:
        load_study(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") or "expected a YAML file" in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("name: [unclosed", r"x.yaml: line \d+, column \d+: not valid YAML \(.*expected ','"),
        ("", r"x.yaml: expected a study mapping .* got an empty file"),
    ],
)
def test_unparseable_files(tmp_path, text, match):
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(StudyError, match=match):
        load_study(path)


def test_cli_bad_study_exits_2_with_one_line(tmp_path, capsys):
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(_with("search.num_samples", "ten")))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"calibtune run: error: {path}: search.num_samples: expected an integer >= 1, got 'ten'"
    ]
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "expected a study YAML file, found nothing" in capsys.readouterr().err


def test_every_shipped_search_space_validates_and_covers_every_loss():
    files = sorted((ROOT / "search_spaces").glob("*.yaml"))
    losses = {load_loss_space(f).loss for f in files}
    assert losses == set(LOSSES.names())


def test_every_shipped_study_validates():
    studies = sorted((ROOT / "studies").glob("*.yaml"))
    assert {p.stem for p in studies} >= {"quickstart"}
    for p in studies:
        load_study(p)


def test_define_by_run_samples_loss_then_only_its_params(tmp_path):
    import optuna

    path = tmp_path / "s.yaml"
    raw = _with("space", {"optimizer.lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True}})
    path.write_text(yaml.safe_dump(raw))
    study = load_study(path)
    space = define_by_run(study)
    ostudy = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(12):
        t = ostudy.ask()
        space(t)
        params = t.params
        seen.add(params["loss"])
        own = {k for k in params if k.startswith(("focal/", "cross_entropy/"))}
        if params["loss"] == "cross_entropy":
            assert own == set()
        else:
            assert own == {"focal/gamma"}
            assert 0.5 <= params["focal/gamma"] <= 5.0
        assert 0.01 <= params["trial/optimizer.lr"] <= 0.1
        ostudy.tell(t, 0.0)
    assert seen == {"cross_entropy", "focal"}
    # the sampled point becomes a valid trial config carrying only that loss's parameters
    from calibtune.trial import config_from_dict

    sampled = {"loss": "focal", "focal": {"gamma": 2.5}, "trial": {"optimizer.lr": 0.05}}
    cfg = config_from_dict(trial_dict(study, sampled, seed=3, name="x"))
    assert cfg.loss.name == "focal" and cfg.loss.params["gamma"] == 2.5
    assert cfg.optimizer.lr == 0.05 and cfg.seed == 3


def test_spaces_build_optuna_distributions(tmp_path):
    path = tmp_path / "focal.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "loss": "adafocal",
                "params": {
                    "lam": {"type": "float", "low": 0.5, "high": 2.0, "log": True},
                    "n_bins": {"type": "int", "low": 5, "high": 30, "step": 5},
                    "update_every": {"type": "categorical", "choices": ["epoch", 10]},
                    "gamma_max": 20.0,
                },
            }
        )
    )
    space = load_loss_space(path).space
    assert space.dists["lam"] == FloatDistribution(0.5, 2.0, log=True)
    assert space.dists["n_bins"] == IntDistribution(5, 30, step=5)
    assert space.dists["update_every"] == CategoricalDistribution(["epoch", 10])
    assert space.fixed == {"gamma_max": 20.0}


@pytest.mark.parametrize(
    "name",
    sorted(p.stem for p in (ROOT / "studies").glob("*_cifar10.yaml")),  # every paper study
)
def test_paper_studies_stop_before_any_trial_when_files_are_missing(
    tmp_path, monkeypatch, capsys, name
):
    import torch

    monkeypatch.chdir(tmp_path)
    path = ROOT / "studies" / f"{name}.yaml"
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    if load_study(path).base_config().scaling.use_gpu and not torch.cuda.device_count():
        # the machine is checked first: a GPU study on a machine without one stops there
        assert "trial.scaling.use_gpu: expected a visible GPU on this machine" in err[0]
    else:
        assert "cifar10: dataset files not found" in err[0]
        assert "cifar-10-batches-py" in err[0]
        assert f"run `calibtune data fetch cifar10 --root {tmp_path / 'data'}`" in err[0]
    assert list(tmp_path.iterdir()) == []  # nothing written: no study state, no MLflow store


def test_reuse_actors_defaults_to_true_and_can_be_turned_off(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(_with("search.num_samples", 2)))
    assert load_study(path).search.reuse_actors is True
    path.write_text(yaml.safe_dump(_with("search.reuse_actors", False)))
    assert load_study(path).search.reuse_actors is False


def test_an_arm_reduction_reaches_its_trials_and_the_saved_study(tmp_path):
    # issue 22, item 1: losses[i].reduction is the trial's loss.reduction for that arm only
    from calibtune.studyfile._studydir import self_contained
    from calibtune.trial import config_from_dict

    raw = _with("losses", ["cross_entropy", {"name": "focal", "reduction": "sum"}])
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    study = load_study(path)
    assert [c.reduction for c in study.losses] == ["mean", "sum"]
    focal = config_from_dict(trial_dict(study, {"loss": "focal"}, seed=1, name="x"))
    ce = config_from_dict(trial_dict(study, {"loss": "cross_entropy"}, seed=1, name="y"))
    assert focal.loss.reduction == "sum" and focal.loss.build().reduction == "sum"
    assert ce.loss.reduction == "mean"
    assert yaml.safe_load(self_contained(study))["losses"][1]["reduction"] == "sum"


def test_an_arm_compile_mode_reaches_its_trials_and_bad_values_are_refused(tmp_path):
    # issue 21, item 6: losses[i].compile is the trial's loss.compile for that arm only, so a
    # study can turn torch.compile off (or on) per arm; YAML's bare off/on are read as such
    from calibtune.studyfile._studydir import self_contained
    from calibtune.trial import config_from_dict

    path = tmp_path / "s.yaml"
    text = yaml.safe_dump(_with("losses", ["cross_entropy"]))
    arm = "- {name: focal, compile: off}"  # a bare off: YAML 1.1's boolean
    path.write_text(text.replace("- cross_entropy", f"- cross_entropy\n{arm}"))
    study = load_study(path)
    assert [c.compile for c in study.losses] == ["auto", "off"]
    focal = config_from_dict(trial_dict(study, {"loss": "focal"}, seed=1, name="x"))
    ce = config_from_dict(trial_dict(study, {"loss": "cross_entropy"}, seed=1, name="y"))
    assert focal.loss.compile == "off" and ce.loss.compile == "auto"
    assert yaml.safe_load(self_contained(study))["losses"][1]["compile"] is False  # as written
    path.write_text(yaml.safe_dump(_with("losses", [{"name": "focal", "compile": "always"}])))
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert str(err.value).endswith(
        "losses[0].compile: expected one of 'auto', 'on', 'off', got 'always'"
    )
