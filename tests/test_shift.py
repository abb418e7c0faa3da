"""Calibration under dataset shift: keys, shift sets (digits and CIFAR-10-C files), metrics on
cached logits, the trial config, study selection (validation side only) and a real trial."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from calibtune.data import load_ood, load_shift, load_splits, shift_severities
from calibtune.data._common import NormalizedImages, Splits
from calibtune.data._ood import DIGITS_NOISE_STD, gaussian_noise_uint8
from calibtune.data._shift import VAL_NOISE_SEED, dataset_labels
from calibtune.metrics import calibration_report
from calibtune.metrics import keys as K
from calibtune.posthoc import build_posthoc
from calibtune.training import OODLogits, ShiftLogits, evaluate_final, shift_logits, shift_metrics

ROOT = Path(__file__).resolve().parents[1]


def _logits(n: int, k: int, seed: int, scale: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(n, k, generator=g), torch.randint(0, k, (n,), generator=g)


# ----------------------------------------------------------------------------- keys

_D, _C = "digits_noise", "cifar10c-fog"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("shift/digits_noise/s3/ece@ts", K.MetricKey("shift", "ece", "ts", severity=3, shift=_D)),
        ("val_shift/digits_noise/nll", K.MetricKey("val_shift", "nll", shift=_D)),
        ("shift/cifar10c-fog/s5/error", K.MetricKey("shift", "error", severity=5, shift=_C)),
        (
            "val_shift/digits_noise/adaece@ts_std",
            K.MetricKey("val_shift", "adaece", "ts", stat="std", shift=_D),
        ),
    ],
)
def test_shift_keys_round_trip(text: str, parsed: K.MetricKey) -> None:
    assert K.parse(text) == parsed and str(parsed) == text
    assert K.from_mlflow(K.to_mlflow(text)) == text and "@" not in K.to_mlflow(text)


def test_shift_key_builder_direction_and_grammar() -> None:
    assert K.shift_key("shift", "digits_noise", "ece", "ts", 2) == "shift/digits_noise/s2/ece@ts"
    assert K.shift_key("val_shift", "digits_noise", "nll") == "val_shift/digits_noise/nll"
    assert K.to_mlflow("shift/digits_noise/s2/ece@ts") == "shift/digits_noise/s2/ece.ts"
    assert K.direction("val_shift/digits_noise/ece@ts") == "min"
    assert K.direction("shift/cifar10c-fog/s1/error") == "min"
    with pytest.raises(ValueError, match="shift_key: expected a split in shift, val_shift"):
        K.shift_key("test", "digits_noise", "ece")
    for bad in ("shift/ece", "shift/digits_noise/x3/ece", "val/digits_noise/s3/ece"):
        with pytest.raises(ValueError, match="metric key: expected"):
            K.parse(bad)
    # 5 severities + the mean, 4 metrics, uncalibrated + ts
    keys = K.shift_keys("shift", "digits_noise", (1, 2, 3, 4, 5), ["ts"])
    assert len(keys) == 6 * 4 * 2 and "shift/digits_noise/adaece@ts" in keys


def test_shift_keys_survive_a_real_mlflow_round_trip(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from calibtune.record._tracking import experiment_id, log_metrics

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = MlflowClient(uri).create_run(experiment_id(uri, "shift"))
    keys = K.shift_keys("shift", "digits_noise", (1, 5), ["ts"]) | K.shift_keys(
        "val_shift", "cifar10c-gaussian_noise", (2,), ["focal_ts"]
    )
    values = {k: float(i) / 7 for i, k in enumerate(sorted(keys))}
    log_metrics(uri, run.info.run_id, values)
    back = MlflowClient(uri).get_run(run.info.run_id).data.metrics
    assert {K.from_mlflow(k): v for k, v in back.items()} == values


def test_only_validation_side_shift_keys_are_selectable() -> None:
    assert K.is_selectable("val_shift/digits_noise/ece@ts")
    assert K.is_selectable("val_shift/digits_noise/s5/nll")
    assert not K.is_selectable("shift/digits_noise/ece@ts")
    assert not K.is_selectable("shift/digits_noise/s5/ece")
    assert K.selection_refusal("val_shift/digits_noise/ece") is None
    assert K.selection_refusal("shift/digits_noise/s2/ece@ts") == (
        "expected a validation metric (shift/ is the corrupted test split: use "
        "val_shift/digits_noise/s2/ece@ts)"
    )
    assert "never test or OOD data" in K.selection_refusal("test/ece")  # type: ignore[operator]


# ----------------------------------------------------------------------------- metrics


def test_a_shift_set_identical_to_test_reports_the_test_metrics() -> None:
    val, val_y = _logits(300, 5, 0)
    test, test_y = _logits(400, 5, 1, scale=5.0)
    same = [ShiftLogits("shift", "copy", s, test, test_y) for s in (1, 2)]
    final = evaluate_final(val, val_y, test, test_y, posthoc={"ts": {}}, shift=same)
    m = final.metrics
    for metric in K.SHIFT_METRICS:
        for method in ("", "ts"):
            expected = m[K.key("test", metric, method)]
            for sev in (1, 2, None):
                got = m[K.shift_key("shift", "copy", metric, method, sev)]
                assert got == pytest.approx(expected, rel=1e-12, abs=1e-15), (metric, method, sev)
    assert final.shift["shift"]["copy"]["severities"] == [1, 2]
    assert final.shift["shift"]["copy"]["ece"]["ts"] == [m["test/ece@ts"]] * 2


def test_hand_checked_values_and_the_mean_over_severities() -> None:
    # severity 1: 4 samples, predictions 0,0,1,1 (confidence 0.8 each) for labels 0,1,1,1:
    # error 1/4; ECE = |0.8 - 0.75| = 0.05 (one bin); AdaECE: the 4 confidences tie at 0.8,
    # so the 15 equal-mass groups keep them in one bin, |0.8 - 0.75| = 0.05 (splitting the ties
    # into singletons gave (0.8 + 3 · 0.2)/4 = 0.35, a value that depended on the labels);
    # NLL = -(3 ln 0.8 + ln 0.2)/4
    z = torch.log(torch.tensor([[0.8, 0.2], [0.8, 0.2], [0.2, 0.8], [0.2, 0.8]]))
    y1 = torch.tensor([0, 1, 1, 1])
    y2 = torch.tensor([0, 0, 1, 1])  # severity 2: all right, error 0, ECE 0.2
    items = [ShiftLogits("val_shift", "toy", 1, z, y1), ShiftLogits("val_shift", "toy", 2, z, y2)]
    metrics, curves = shift_metrics(items, {}, n_bins=15)
    nll1 = -(3 * np.log(0.8) + np.log(0.2)) / 4
    assert metrics["val_shift/toy/s1/error"] == pytest.approx(0.25)
    assert metrics["val_shift/toy/s1/ece"] == pytest.approx(0.05)
    assert metrics["val_shift/toy/s1/adaece"] == pytest.approx(0.05)
    assert metrics["val_shift/toy/s1/nll"] == pytest.approx(nll1)
    assert metrics["val_shift/toy/s2/ece"] == pytest.approx(0.2)
    assert metrics["val_shift/toy/error"] == pytest.approx(0.125)  # (0.25 + 0) / 2
    assert metrics["val_shift/toy/ece"] == pytest.approx(0.125)  # (0.05 + 0.2) / 2
    assert metrics["val_shift/toy/adaece"] == pytest.approx(0.125)  # (0.05 + 0.2) / 2
    assert set(metrics) == K.shift_keys("val_shift", "toy", (1, 2))
    assert curves["val_shift"]["toy"]["ece"]["uncalibrated"] == pytest.approx([0.05, 0.2])


def test_methods_are_fitted_on_clean_validation_only() -> None:
    """TS fitted on validation: the shifted metrics use that T, not one refitted on the shift."""
    val, val_y = _logits(500, 4, 2)
    shifted, shifted_y = _logits(300, 4, 3, scale=9.0)
    ts = build_posthoc("ts").fit(val, val_y)
    metrics, _ = shift_metrics([ShiftLogits("shift", "s", 4, shifted, shifted_y)], {"ts": ts})
    t = ts.params()["T"]
    rep = calibration_report(logits=shifted / t, labels=shifted_y)
    assert metrics["shift/s/s4/ece@ts"] == pytest.approx(rep["ece"], rel=1e-6)
    assert metrics["shift/s/s4/nll@ts"] == pytest.approx(rep["nll"], rel=1e-6)


# ----------------------------------------------------------------------------- shift sets


def test_digits_validation_side_is_the_validation_split_with_seed_1_noise() -> None:
    splits = load_splits("digits", seed=0, val_fraction=0.1)
    x, y = splits.val.tensors
    assert shift_severities("digits_noise") == {
        "shift": (1, 2, 3, 4, 5),
        "val_shift": (1, 2, 3, 4, 5),
    }
    for sev in (1, 5):
        ds = load_shift("digits_noise", "val_shift", sev, splits=splits)
        xs, ys = ds.tensors
        assert torch.equal(ys, y) and xs.shape == x.shape
        (mean,), (std,) = splits.mean, splits.std
        pixels = x.double().numpy() * std + mean
        noise = np.random.default_rng([VAL_NOISE_SEED, sev]).normal(
            scale=DIGITS_NOISE_STD[sev - 1], size=pixels.shape
        )
        expected = (np.clip(pixels + noise, 0, 1) - mean) / std
        np.testing.assert_allclose(xs.numpy(), expected, atol=1e-5)
    test_side = load_shift("digits_noise", "shift", 3, splits=splits)
    ood = load_ood("digits_noise", severity=3).dataset
    assert torch.equal(test_side.tensors[0], ood.tensors[0])


def _write_cifar10c(root: Path, per: int) -> np.ndarray:
    """CIFAR-10-C's layout: <root>/CIFAR-10-C/<corruption>.npy (5·per, 32, 32, 3) uint8, rows
    per·(s−1)…per·s at severity s, and labels.npy (5·per,) uint8."""
    folder = root / "CIFAR-10-C"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    labels = np.tile(rng.integers(0, 10, per).astype(np.uint8), 5)
    np.save(folder / "labels.npy", labels)
    for c in ("fog", "gaussian_noise"):
        np.save(folder / f"{c}.npy", rng.integers(0, 256, (5 * per, 32, 32, 3), dtype=np.uint8))
    return labels


def _cifar_splits(n_val: int) -> Splits:
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (n_val, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (n_val,), generator=g)
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    val = NormalizedImages(images, labels, mean, std)
    return Splits("cifar10", val, val, val, 10, (3, 32, 32), mean, std, None)


def test_cifar10c_test_side_from_files_and_gaussian_validation_side(tmp_path: Path) -> None:
    labels = _write_cifar10c(tmp_path, per=6)
    splits = _cifar_splits(7)
    fog = np.load(tmp_path / "CIFAR-10-C" / "fog.npy")
    ds = load_shift("cifar10c-fog", "shift", 4, splits=splits, root=tmp_path)
    assert torch.equal(ds.images, torch.from_numpy(fog[18:24].transpose(0, 3, 1, 2)))
    assert dataset_labels(ds).tolist() == labels[18:24].tolist()
    assert shift_severities("cifar10c-fog") == {"shift": (1, 2, 3, 4, 5)}
    with pytest.raises(ValueError, match="cifar10c-fog: expected a side in shift, got 'val_shift'"):
        load_shift("cifar10c-fog", "val_shift", 1, splits=splits, root=tmp_path)
    val = load_shift("cifar10c-gaussian_noise", "val_shift", 2, splits=splits, root=tmp_path)
    expected = gaussian_noise_uint8(splits.val.images.numpy(), 2, VAL_NOISE_SEED)
    assert torch.equal(val.images, torch.from_numpy(expected))
    assert torch.equal(val.labels, splits.val.labels)


def test_shift_logits_reuses_the_ood_pass_for_the_same_test_data(tmp_path: Path) -> None:
    _write_cifar10c(tmp_path, per=4)
    splits = _cifar_splits(3)
    seen: list[int] = []

    def infer(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(len(ds))
        return torch.zeros(len(ds), 10), dataset_labels(ds)

    ood = [OODLogits(K.ood_source("cifar10c", s), torch.ones(4, 10)) for s in range(1, 6)]
    out = shift_logits(
        ["cifar10c-gaussian_noise", "cifar10c-fog"], splits, infer, root=tmp_path, reuse=ood
    )
    # gaussian noise: test side reused (5 × 4 rows), validation side inferred (5 × 3 rows);
    # fog: its test side is not the OOD set's corruption, so inferred (5 × 4 rows)
    assert seen == [3] * 5 + [4] * 5
    assert [(o.side, o.name, o.severity) for o in out][:6] == [
        ("shift", "cifar10c-gaussian_noise", s) for s in range(1, 6)
    ] + [("val_shift", "cifar10c-gaussian_noise", 1)]
    assert all(torch.equal(o.logits, torch.ones(4, 10)) for o in out[:5])


# ----------------------------------------------------------------------------- config and study


def test_data_shift_is_validated_with_one_line_errors() -> None:
    from calibtune.trial import config_from_dict

    assert config_from_dict({"data": {"shift": ["digits_noise"]}}).data.shift == ("digits_noise",)
    assert config_from_dict({}).data.shift is None
    with pytest.raises(
        ValueError, match=r"^data\.shift\[0\]: expected one of 'digits_noise', got 'fog'$"
    ):
        config_from_dict({"data": {"shift": ["fog"]}})
    with pytest.raises(
        ValueError, match=r"^data\.shift: expected a list of digits shift sets, got 'digits_noise'$"
    ):
        config_from_dict({"data": {"shift": "digits_noise"}})
    with pytest.raises(
        ValueError,
        match=r"^data\.shift: expected \[\] \(no mnist1d shift sets\), got \['digits_noise'\]$",
    ):
        config_from_dict({"data": {"name": "mnist1d", "shift": ["digits_noise"]}})
    assert config_from_dict({"data": {"name": "mnist1d", "shift": []}}).data.shift == ()
    keys = config_from_dict({"data": {"shift": ["digits_noise"]}}).metric_keys(posthoc_params=False)
    assert "val_shift/digits_noise/ece@ts" in keys and "shift/digits_noise/s5/nll@spline" in keys
    none = config_from_dict({"data": {"shift": []}}).metric_keys(posthoc_params=False)
    assert not any(K.parse(k).split in K.SHIFT_SPLITS for k in none)
    cifar = config_from_dict({"data": {"name": "cifar10", "shift": ["cifar10c-fog"]}})
    assert not any(K.parse(k).split == "val_shift" for k in cifar.metric_keys(posthoc_params=False))


def test_the_shipped_study_selects_on_the_validation_side_shift_objective() -> None:
    from calibtune.study import load_study

    study = load_study(ROOT / "studies" / "shift_digits.yaml")
    assert [(o.metric, o.mode) for o in study.search.objectives] == [
        ("val_shift/digits_noise/ece@ts", "min")
    ]
    assert K.direction(study.search.objectives[0].metric) == "min"


def _study_text(objective: str, shift: list[str] | None = None) -> str:
    data: dict[str, Any] = (
        {"name": "digits"} if shift is None else {"name": "digits", "shift": shift}
    )
    return json.dumps(
        {
            "name": "s",
            "trial": {"data": data, "model": {"name": "mlp"}, "scaling": {"num_workers": 0}},
            "losses": ["cross_entropy"],
            "search": {"num_samples": 1, "objectives": [{"metric": objective}]},
        }
    )


def test_study_validation_refuses_test_side_shift_objectives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from calibtune.cli import main
    from calibtune.studyfile._config import study_from_text

    assert study_from_text(_study_text("val_shift/digits_noise/s3/nll@ts"), "s.yaml")
    with pytest.raises(
        ValueError,
        match=r"^s\.yaml: search\.objectives\[0\]\.metric: expected a validation metric "
        r"\(shift/ is the corrupted test split: use val_shift/digits_noise/ece@ts\), "
        r"got 'shift/digits_noise/ece@ts'$",
    ):
        study_from_text(_study_text("shift/digits_noise/ece@ts"), "s.yaml")
    # a selectable key that these trials do not report (no shift set configured)
    with pytest.raises(
        ValueError,
        match=r"search\.objectives\[0\]\.metric: expected a metric the trials report .* "
        r"got 'val_shift/digits_noise/ece@ts'",
    ):
        study_from_text(_study_text("val_shift/digits_noise/ece@ts", shift=[]), "s.yaml")
    # through the CLI: one line, exit 2, nothing written
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(_study_text("shift/digits_noise/s5/ece"))
    assert main(["run", "bad.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use val_shift/digits_noise/s5/ece)" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


# ----------------------------------------------------------------------------- a real trial


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tiny_digits_trial_logs_every_shift_key_and_the_figure(tmp_path: Path) -> None:
    from calibtune.trial import config_from_dict, run

    cfg = config_from_dict(
        {
            "name": "shift",
            "storage_path": str(tmp_path),
            "data": {"name": "digits", "ood": ["digits_noise"], "shift": ["digits_noise"]},
            "model": {"name": "mlp"},
            "train": {"epochs": 2, "batch_size": 128},
            "eval": {"posthoc": ["ts"], "epoch_posthoc": ["ts"], "epoch_shift": True},
            "scaling": {"num_workers": 0},
        }
    )
    res = run(cfg)
    m = res.metrics
    got = {k for k in m if K.parse(k).split in K.SHIFT_SPLITS}
    expected = K.shift_keys("shift", "digits_noise", range(1, 6), ["ts"])
    expected |= K.shift_keys("val_shift", "digits_noise", range(1, 6), ["ts"])
    assert got == expected
    reported = set(m).union(*map(set, res.history))
    assert reported == cfg.metric_keys()
    # eval.epoch_shift: every epoch reports the validation side (what Tune checks per report),
    # and the last epoch's values are the final ones (same model, same clean-validation fit)
    val_side = K.shift_keys("val_shift", "digits_noise", range(1, 6), ["ts"])
    assert all(val_side <= set(h) for h in res.history)
    assert {k: res.history[-1][k] for k in val_side} == pytest.approx({k: m[k] for k in val_side})
    for side in K.SHIFT_SPLITS:
        per = [m[K.shift_key(side, "digits_noise", "ece", "ts", s)] for s in range(1, 6)]
        assert m[K.shift_key(side, "digits_noise", "ece", "ts")] == pytest.approx(np.mean(per))
    # the test side is the OOD set digits_noise: its labels are the test labels, so severity
    # 5 noise costs accuracy relative to the clean test split
    assert m["shift/digits_noise/s5/error"] > m["test/error"]
    art = Path(res.artifacts_dir)
    curves = json.loads((art / "shift.json").read_text())
    assert curves["val_shift"]["digits_noise"]["nll"]["ts"] == pytest.approx(
        [m[K.shift_key("val_shift", "digits_noise", "nll", "ts", s)] for s in range(1, 6)]
    )
    png = art / "figures" / "shift.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_cifar10c_files_of_a_shift_set_are_reported_before_training(
    tmp_path: Path,
) -> None:
    from calibtune.data import DatasetNotFoundError
    from calibtune.trial import config_from_dict
    from calibtune.trial._driver import check_data_files

    cfg = config_from_dict(
        {"data": {"name": "cifar10", "root": str(tmp_path), "ood": [], "shift": ["cifar10c-fog"]}}
    )
    with pytest.raises(
        DatasetNotFoundError, match=r"cifar10c: dataset files not found: .*fog\.npy"
    ):
        check_data_files(cfg)
    _write_cifar10c(tmp_path, per=2)
    check_data_files(cfg)  # the files exist now


def test_a_study_selecting_on_val_shift_turns_on_epoch_shift() -> None:
    from calibtune.study import load_study
    from calibtune.study._trainable import trial_dict
    from calibtune.trial import config_from_dict

    study = load_study(ROOT / "studies" / "shift_digits.yaml")
    cfg = config_from_dict(trial_dict(study, {"loss": "cross_entropy"}, 1, "t"))
    assert cfg.eval.epoch_shift and "ts" in cfg.eval.epoch_posthoc
    assert "val_shift/digits_noise/ece@ts" in K.epoch_keys(
        epoch_posthoc=cfg.eval.epoch_posthoc, epoch_shift=[("digits_noise", range(1, 6))]
    )
    plain = load_study(ROOT / "studies" / "quickstart.yaml")
    assert not config_from_dict(
        trial_dict(plain, {"loss": "cross_entropy"}, 1, "t")
    ).eval.epoch_shift


def test_the_parent_runs_best_key_keeps_the_shift_set_and_severity() -> None:
    from calibtune.readers._summary import best_key

    assert best_key("val/ece@ts") == "study/best_val_ece@ts"
    assert best_key("val_shift/digits_noise/ece@ts") == "study/best_val_shift_digits_noise_ece@ts"
    assert best_key("val_shift/cifar10c-gaussian_noise/s3/nll") == (
        "study/best_val_shift_cifar10c-gaussian_noise_s3_nll"
    )
