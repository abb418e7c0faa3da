"""Trial-config validation: defaults, round trip, key-path error messages, overrides, YAML files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from calibtune.trial import (
    TrialConfig,
    apply_overrides,
    check_resources,
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)

TRIALS = Path(__file__).resolve().parents[1] / "studies" / "trials"


def test_defaults_follow_the_seeds() -> None:
    cfg = config_from_dict({})
    assert cfg.optimizer.name == "sgd"
    assert cfg.optimizer.momentum == 0.9
    assert cfg.optimizer.weight_decay == 5e-4
    assert cfg.schedule.name == "step" and cfg.schedule.gamma == 0.1
    assert cfg.scaling.num_workers == 0
    # 350 epochs: 3/7·350 = 150 and 5/7·350 = 250, the seeds' milestones
    assert config_from_dict({"train": {"epochs": 350}}).milestones() == (150, 250)
    assert config_from_dict({"schedule": {"milestones": [2, 5]}}).milestones() == (2, 5)


def test_round_trip_through_dict_and_yaml(tmp_path: Path) -> None:
    cfg = config_from_dict(
        {
            "name": "x",
            "loss": {"name": "cross_entropy"},
            "train": {"epochs": 3, "grad_clip": 5},
            "optimizer": {"weight_decay": "5e-4"},  # YAML 1.1 reads 5e-4 as a string
            "eval": {"posthoc": ["ts"]},
        }
    )
    assert cfg.optimizer.weight_decay == 5e-4
    assert cfg.train.grad_clip == 5.0
    assert config_from_dict(config_to_dict(cfg)) == cfg
    save_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg
    assert isinstance(cfg, TrialConfig)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"train": {"epochs": "ten"}},
            r"^train\.epochs: expected an integer in \[1, 100000\], got 'ten'$",
        ),
        ({"train": {"epochs": 0}}, r"^train\.epochs: expected an integer in \[1, 100000\], got 0$"),
        ({"train": {"epoch": 3}}, r"^train\.epoch: unknown key; expected one of epochs, "),
        ({"trian": {}}, r"^trian: unknown key"),
        ({"optimizer": {"lr": -1}}, r"^optimizer\.lr: expected a number in \(0, inf\), got -1"),
        ({"optimizer": {"name": "lamb"}}, r"^optimizer\.name: expected one of 'sgd', 'adam'"),
        ({"schedule": {"milestones": [5, 2]}}, r"^schedule\.milestones: expected strictly"),
        ({"data": {"name": "nope"}}, r"^data\.name: expected one of .*digits"),
        ({"model": {"name": "nope"}}, r"^model\.name: expected one of .*mlp"),
        ({"loss": {"name": "nope"}}, r"^loss\.name: expected one of .*cross_entropy"),
        ({"loss": {"name": "focal", "params": {"gama": 1}}}, r"^loss\.params: focal: unknown"),
        ({"eval": {"posthoc": ["platt"]}}, r"^eval\.posthoc: expected names from .*ts"),
        ({"scaling": {"use_gpu": "yes"}}, r"^scaling\.use_gpu: expected a boolean"),
        ({"data": {"val_fraction": 0.9}}, r"^data\.val_fraction: expected a number in \(0, 0\.5\]"),
        ([1, 2], r"^config: expected a mapping"),
    ],
)
def test_errors_name_the_key_path(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config_from_dict(raw)  # type: ignore[arg-type]


def test_loss_params_are_resolved_with_defaults() -> None:
    from calibtune.losses import LOSSES

    cfg = config_from_dict({"loss": {"name": "focal"}})
    assert dict(cfg.loss.params) == LOSSES.get("focal").resolve()


def test_overrides_parse_values_as_yaml() -> None:
    raw = {"train": {"epochs": 3}}
    out = apply_overrides(raw, ["train.epochs=7", "loss.name=focal", "data.ood=[]", "seed=3"])
    assert out == {
        "train": {"epochs": 7},
        "loss": {"name": "focal"},
        "data": {"ood": []},
        "seed": 3,
    }
    assert raw == {"train": {"epochs": 3}}  # not mutated
    with pytest.raises(ValueError, match=r"^--set: expected key\.path=value, got 'epochs'"):
        apply_overrides(raw, ["epochs"])
    with pytest.raises(
        ValueError, match=r"^--set train\.epochs\.x: train\.epochs is not a mapping"
    ):
        apply_overrides(raw, ["train.epochs.x=1"])


def test_load_config_reports_file_problems(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ValueError, match="expected a mapping at the top level, got list"):
        load_config(bad)
    bad.write_text("train: {epochs: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(bad)


@pytest.mark.parametrize("path", sorted(TRIALS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_trial_configs_validate(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.data.name == "digits"
    assert cfg.train.epochs >= 1


def test_one_shipped_config_per_loss_family() -> None:
    from calibtune.losses import list_losses

    shipped = {load_config(p).loss.name for p in TRIALS.glob("*.yaml")}
    assert "adafocal" in shipped
    assert set(list_losses()) <= shipped, f"no trial config for {set(list_losses()) - shipped}"


def test_check_resources_fails_fast_with_the_numbers() -> None:
    cfg = config_from_dict({"scaling": {"num_workers": 3, "resources_per_worker": {"CPU": 1}}})
    with pytest.raises(
        ValueError, match=r"fits the 2 CPU of the Ray cluster, got one that needs 3 CPU \(3 wor"
    ):
        check_resources(cfg, {"CPU": 2.0})
    gpu = config_from_dict({"scaling": {"num_workers": 1, "use_gpu": True}})
    with pytest.raises(ValueError, match=r"^scaling\.use_gpu: expected a visible GPU on the Ray"):
        check_resources(gpu, {"CPU": 2.0})
    with pytest.raises(ValueError, match=r"fits the 1 GPU .* needs 2 GPU \(2 workers × 1\)"):
        check_resources(gpu.replace(scaling=dataclasses.replace(gpu.scaling, num_workers=2)),
                        {"CPU": 2.0, "GPU": 1.0})  # fmt: skip
    packed = config_from_dict({"scaling": {"resources_per_worker": {"GPU": 0.25}}})
    with pytest.raises(ValueError, match=r"^scaling\.resources_per_worker\.GPU: expected a vis"):
        check_resources(packed, {"CPU": 2.0})  # local mode: a quarter GPU is still a GPU
    check_resources(packed, {"CPU": 1.0, "GPU": 1.0})
    check_resources(cfg, {"CPU": 4.0})  # fits: no error
