"""Per-arm ``epochs`` (issue 31.2): an arm of a study trains as long as its authors trained it
(Mukhoti et al.'s Wide-ResNet-26-10 Brier arm: 550 epochs where every other arm trains 350),
checked at the boundary like the arm's ``reduction`` and ``compile``."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from calibtune.study import load_study
from calibtune.study._trainable import trial_dict
from calibtune.studyfile._config import StudyError, parse_study

ROOT = Path(__file__).resolve().parents[1]
WRN = ["mukhoti2020_ood_wrn26_10_cifar10.yaml", "ghosh2022_adafocal_ood_wrn26_10_cifar10.yaml"]


@pytest.mark.parametrize("name", WRN)
def test_the_wide_resnet_brier_arm_trains_550_epochs_the_others_350(name: str) -> None:
    study = load_study(ROOT / "studies" / name)
    epochs = {c.label: c.epochs for c in study.losses}
    assert epochs.pop("brier") == 550
    assert set(epochs.values()) == {None}  # the trial's 350
    for c in study.losses:
        d = trial_dict(study, {"loss": c.label}, seed=1, name="t")
        assert d["train"]["epochs"] == (550 if c.label == "brier" else 350), c.label
        assert d["train"]["batch_size"] == 128  # the rest of train: kept
    assert study.base_config().train.epochs == 350


def _raw() -> dict:
    return yaml.safe_load((ROOT / "studies" / WRN[0]).read_text())


@pytest.mark.parametrize(
    ("epochs", "scheduler", "message"),
    [
        (0, None, r"^s\.yaml: losses\[1\]\.epochs: expected an integer >= 1, got 0$"),
        ("long", None, r"^s\.yaml: losses\[1\]\.epochs: expected an integer >= 1, got 'long'$"),
        (10**6, None, r"losses\[1\]\.epochs: 1000000 makes trial\.train\.epochs: expected an"),
        (550, "asha", r"losses\[1\]\.epochs: expected no per-arm epochs with search\.scheduler"),
    ],
)
def test_bad_arm_epochs_are_one_line_errors(epochs, scheduler, message) -> None:
    raw = _raw()
    raw["losses"][1]["epochs"] = epochs
    if scheduler:
        raw["search"]["scheduler"] = scheduler
    with pytest.raises(StudyError, match=message):
        parse_study(copy.deepcopy(raw), "s.yaml")
