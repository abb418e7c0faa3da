"""Metric keys (`calibtune.metrics.keys`): build/parse round trips, the MLflow name mapping,
directions, selectability, and `expected_keys` against what real evaluations and a real trial
report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from calibtune.metrics import REPORT_KEYS
from calibtune.metrics import keys as K
from calibtune.posthoc import list_posthoc
from calibtune.training import OODLogits, evaluate_final

EXAMPLES = [
    ("test/ece@ts", K.MetricKey("test", "ece", "ts")),
    ("val/ece@focal_ts", K.MetricKey("val", "ece", "focal_ts")),
    ("ood/svhn/s3/auroc_msp@ts", K.MetricKey("ood", "auroc_msp", "ts", "svhn", 3)),
    ("ood/digits_far/fpr95", K.MetricKey("ood", "fpr95", ood="digits_far")),
    ("posthoc/ts/T", K.MetricKey("posthoc", "T", "ts")),
    ("posthoc/spline/knot_3", K.MetricKey("posthoc", "knot_3", "spline")),
    ("train/loss", K.MetricKey("train", "loss")),
    ("adaptive/gammas", K.MetricKey("adaptive", "gammas")),
    ("adaptive/gap/bin_07", K.MetricKey("adaptive", "gap", bin=7)),
    ("lr", K.MetricKey("", "lr")),
    ("epoch_time", K.MetricKey("", "epoch_time")),
    ("val/ece@ts_std", K.MetricKey("val", "ece", "ts", stat="std")),
    ("test/classwise_ece_std", K.MetricKey("test", "classwise_ece", stat="std")),
]


@pytest.mark.parametrize(("text", "parsed"), EXAMPLES, ids=[t for t, _ in EXAMPLES])
def test_parse_and_build_are_inverse(text: str, parsed: K.MetricKey) -> None:
    assert K.parse(text) == parsed
    assert str(parsed) == text
    mlflow = K.to_mlflow(text)
    assert "@" not in mlflow and mlflow.count(".") == ("@" in text)
    assert K.from_mlflow(mlflow) == text


def test_mlflow_names_stay_as_before() -> None:
    # names already logged by earlier versions must keep meaning the same metric
    assert K.to_mlflow("test/ece@ts") == "test/ece.ts"
    assert K.to_mlflow("ood/svhn/auroc_msp@ts") == "ood/svhn/auroc_msp.ts"
    assert K.from_mlflow("system/cpu.percent") == "system/cpu.percent"  # not ours: unchanged


def test_ood_parts() -> None:
    k = K.parse("ood/digits_noise/s3/auroc_msp@ts")
    assert (k.measure, k.score, k.ood, k.severity) == ("auroc", "msp", "digits_noise", 3)
    assert K.parse("ood/svhn/aupr").score == "entropy"
    assert K.ood_key(K.ood_source("digits_noise", 3), "auroc", "msp", "ts") == (
        "ood/digits_noise/s3/auroc_msp@ts"
    )
    assert K.parse_ood_source("digits_noise/s2") == ("digits_noise", 2)
    assert K.std_key("val/ece@ts") == "val/ece@ts_std"
    assert K.element_key("adaptive/gammas", 3) == "adaptive/gammas/bin_03"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "val/",
        "val/e.ce",  # a dot would make the MLflow name ambiguous
        "val/ece@ts@ts",
        "foo/ece",
        "ood/svhn",
        "ood/svhn/x3/auroc",
        "posthoc/ts",
        "posthoc/ts/T@ets",
        "adaptive/gammas@ts",
        "lr@ts",
        "@ts",
        "val/ece@",
        "adaptive/gammas/bin_3",  # not canonical: the builder writes bin_03
        "ood/svhn/s03/auroc",
        "val/ece/bin_01",
    ],
)
def test_parse_rejects_keys_outside_the_grammar(bad: str) -> None:
    with pytest.raises(ValueError, match="metric key: expected"):
        K.parse(bad)


def test_builders_refuse_parts_that_break_the_mlflow_mapping() -> None:
    with pytest.raises(ValueError, match=r"no \., @, / or _std"):
        K.key("val", "ece", "my.method")
    with pytest.raises(ValueError, match=r"no \., @, / or _std"):
        K.posthoc_key("ts", "a/b")


def test_directions() -> None:
    assert all(not K.higher_is_better(f"val/{m}") for m in REPORT_KEYS)  # every report key known
    assert K.higher_is_better("ood/svhn/s3/auroc_msp@ts")
    assert K.higher_is_better("ood/svhn/aupr")
    assert not K.higher_is_better("ood/svhn/fpr95_msp")
    assert K.direction("train/loss") == "min" and K.direction("ood/svhn/auroc") == "max"
    for none in ("posthoc/ts/T", "lr", "adaptive/updates", "val/ece_std", "val/unknown"):
        with pytest.raises(ValueError, match="expected a metric with a direction"):
            K.higher_is_better(none)


def test_only_validation_and_training_keys_are_selectable() -> None:
    assert K.is_selectable("val/ece@ts") and K.is_selectable("train/loss")
    for key in ("test/ece", "ood/svhn/auroc", "posthoc/ts/T", "lr", "val/e.ce"):
        assert not K.is_selectable(key), key
    assert K.SELECTABLE_PREFIXES == ("val/", "train/", "val_shift/")


def _logits(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    z = torch.randn(n, k, generator=g) + 2.0 * torch.nn.functional.one_hot(y, k)
    return z, y


@pytest.mark.timeout(300)
def test_every_key_of_a_real_final_evaluation_round_trips_and_is_expected() -> None:
    val, test = _logits(300, 4, 0), _logits(300, 4, 1)
    ood = [
        OODLogits("svhn", _logits(100, 4, 2)[0]),
        OODLogits("digits_noise/s3", _logits(100, 4, 3)[0]),
    ]
    posthoc = {name: {} for name in list_posthoc()}
    final = evaluate_final(*val, *test, posthoc=posthoc, ood=ood, n_bins=10)
    for key in final.metrics:
        assert str(K.parse(key)) == key
        assert K.from_mlflow(K.to_mlflow(key)) == key
        assert "@" not in K.to_mlflow(key)
    expected = K.final_keys(
        posthoc=posthoc,
        posthoc_params={m: list(p) for m, p in final.posthoc_params.items()},
        ood=["svhn", "digits_noise/s3"],
    )
    assert set(final.metrics) == expected


@pytest.mark.timeout(600)
def test_expected_keys_equal_what_a_real_trial_reports(tmp_path: Path) -> None:
    import ray

    from calibtune.trial import config_from_dict, run

    cfg = config_from_dict(
        {
            "name": "keys",
            "storage_path": str(tmp_path),
            "data": {"name": "digits"},  # default OOD sets: digits_noise (5 severities), far
            "model": {"name": "mlp"},
            "loss": {"name": "adafocal"},  # adaptive: reports adaptive/* too
            "train": {"epochs": 1, "batch_size": 128},
            "eval": {"figures": False, "epoch_posthoc": ["ts"]},
        }
    )
    ray_before = ray.is_initialized()  # a session fixture of an earlier test may hold one
    res = run(cfg)
    reported: set[str] = set(res.metrics)
    for h in res.history:
        reported |= set(h)
    assert reported == cfg.metric_keys()
    logged = set(reported)  # as MLflow gets them: list values one element per key
    for h in res.history:
        logged |= {
            K.element_key(k, i) for k, v in h.items() if isinstance(v, list) for i in range(len(v))
        }
    assert any(k.startswith("adaptive/gammas/bin_") for k in logged)
    for key in logged:
        assert str(K.parse(key)) == key
        assert K.from_mlflow(K.to_mlflow(key)) == key
    assert ray.is_initialized() == ray_before  # local mode starts no Ray instance


def test_objectives_outside_the_reported_keys_are_refused(tmp_path: Path) -> None:
    import yaml

    from calibtune.study import StudyError, load_study

    study: dict[str, Any] = {
        "name": "k",
        "trial": {"data": {"name": "digits"}, "model": {"name": "mlp"}},
        "losses": ["cross_entropy"],
        "search": {"num_samples": 1, "objectives": ["val/ece@spline"]},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(study))
    assert load_study(path).search.objectives[0].metric == "val/ece@spline"
    for bad in ("val/does_not_exist", "val/ece@magic", "train/ece"):
        study["search"]["objectives"] = [bad]
        path.write_text(yaml.safe_dump(study))
        with pytest.raises(StudyError, match=r"objectives\[0\]\.metric: expected a metric the "):
            load_study(path)
