"""One trial through Ray Train local mode (``num_workers=0``): reports, artifacts, resume, failure.

Ray Train's local mode runs the same training function and ``ray.train`` API in-process, so these
tests need no Ray cluster; worker-mode tests (DDP, worker failure) are in test_trial_workers.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from calibtune.losses import build_loss, list_losses
from calibtune.metrics import REPORT_KEYS, calibration_report
from calibtune.trial import TrialFailedError, TrialResult, config_from_dict, run


def _cfg(tmp_path: Path, loss: str = "cross_entropy", **over: Any) -> Any:
    raw: dict[str, Any] = {
        "name": f"t_{loss}",
        "storage_path": str(tmp_path),
        "seed": 3,
        "data": {"name": "digits", "ood": []},
        "model": {"name": "mlp"},
        "loss": {"name": loss},
        "optimizer": {"lr": 0.05},
        "train": {"epochs": 2, "batch_size": 64},
        "eval": {"posthoc": ["ts"]},
    }
    for key, value in over.items():
        node = raw
        *parents, leaf = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return config_from_dict(raw)


ADAPTIVE = [name for name in list_losses() if build_loss(name).adaptive]
PLAIN = [name for name in list_losses() if not build_loss(name).adaptive]


def _epoch_keys(h: dict[str, Any]) -> None:
    for split in ("val", "test"):
        assert all(f"{split}/{k}" in h for k in REPORT_KEYS), sorted(h)
    assert {"train/loss", "lr", "epoch_time"} <= set(h)
    assert all(math.isfinite(h[f"{s}/{k}"]) for s in ("val", "test") for k in REPORT_KEYS)


@pytest.mark.parametrize("loss", list_losses())
def test_every_loss_trains_and_reports_every_metric(loss: str) -> None:
    """Every registered loss through the plain training loop (no Ray), as a trial builds it:
    the trial-engine path itself is covered once per kind by the Ray smoke test below."""
    from calibtune.data import load_splits
    from calibtune.models import build_model
    from calibtune.training import LoopSpec, evaluate_final, infer_logits, train_epochs

    # logitnorm's CIFAR τ = 0.04 sends the untrained MLP's ‖z‖ past 1000 in 2 epochs at this lr
    # (its gradient scales as 1/(τ‖z‖); docs/losses.md): the pipeline, not τ, is tested here
    over = {"loss__params": {"tau": 1.0}} if loss == "logitnorm" else {}
    cfg = _cfg(Path("unused"), loss, **over)
    torch.manual_seed(cfg.seed)
    splits = load_splits("digits", seed=cfg.seed)
    model = build_model("mlp", splits.num_classes, splits.input_shape)
    loss_fn = build_loss(loss, **dict(cfg.loss.params))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    spec = LoopSpec(
        model=model,
        loss_fn=loss_fn,
        optimizer=opt,
        lr_at=lambda e: 0.05,
        train_set=splits.train,
        val_set=splits.val,
        test_set=splits.test,
        epochs=2,
        batch_size=64,
        augment=splits.augment,
        seed=cfg.seed,
    )
    v_logits, v_labels = infer_logits(model, splits.val, batch_size=512, device=torch.device("cpu"))
    untrained = calibration_report(logits=v_logits, labels=v_labels)
    history: list[dict[str, Any]] = []
    cache = train_epochs(spec, on_epoch_end=lambda e, m, c: history.append(m))
    assert [h["epoch"] for h in history] == [1, 2]
    for h in history:
        _epoch_keys(h)
    # the last epoch's report equals calibtune.metrics recomputed on the cached logits
    last = history[-1]
    for split in ("val", "test"):
        logits, labels = getattr(cache, f"{split}_logits"), getattr(cache, f"{split}_labels")
        ref = calibration_report(logits=logits, labels=labels)
        for k in REPORT_KEYS:
            assert last[f"{split}/{k}"] == pytest.approx(ref[k], rel=1e-9, abs=1e-12), (split, k)
    assert last["val/nll"] < 0.99 * untrained["nll"], "the loss did not train the model"
    final = evaluate_final(
        cache.val_logits, cache.val_labels, cache.test_logits, cache.test_labels, posthoc={"ts": {}}
    )
    for k in REPORT_KEYS:
        assert f"test/{k}" in final.metrics and f"test/{k}@ts" in final.metrics
    assert final.metrics["posthoc/ts/T"] > 0
    if loss_fn.adaptive:
        every = loss_fn.update_every
        assert every == "epoch" or isinstance(every, int)
        updates = sum(h["adaptive/updates"] for h in history)
        assert len(loss_fn.history) == updates >= 1
        assert len(last["adaptive/gammas"]) == len(last["adaptive/gap"]) >= 1
    else:
        assert not any(k.startswith("adaptive/") for h in history for k in h)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, TrialResult]]:
    """One trial engine (Ray Train local mode) run per loss kind: the first plain and the first
    adaptive loss of the registry, shared by the assertions below."""
    tmp = tmp_path_factory.mktemp("smoke")
    out = {}
    for loss in (PLAIN[0], ADAPTIVE[0]):
        cfg = _cfg(tmp, loss)
        out[loss] = (cfg, run(cfg))
    return out


@pytest.mark.parametrize("loss", [PLAIN[0], ADAPTIVE[0]])
def test_two_epoch_trial_reports_every_metric(smoke: dict, loss: str) -> None:
    cfg, res = smoke[loss]
    assert isinstance(res, TrialResult)
    assert res.epochs_completed == 2 and [h["epoch"] for h in res.history] == [1, 2]
    for h in res.history:
        _epoch_keys(h)
        # the whole epoch (evaluation, the checkpoint every epoch here) beside the training pass
        assert h["epoch_time"] >= h["train_time"] + h["checkpoint_time"] > h["train_time"]
        assert h["epoch_samples_per_s"] == pytest.approx(
            h["samples_per_s"] * h["train_time"] / h["epoch_time"], rel=1e-12
        )
        assert h["epoch_samples_per_s"] < h["samples_per_s"]
    for k in REPORT_KEYS:
        assert f"test/{k}" in res.metrics and f"test/{k}@ts" in res.metrics
    assert "posthoc/ts/T" in res.metrics

    # the last epoch's report equals calibtune.metrics recomputed on the saved logits
    saved = torch.load(res.artifacts_dir / "logits.pt", weights_only=True)
    last = res.history[-1]
    for split in ("val", "test"):
        ref = calibration_report(logits=saved[f"{split}_logits"], labels=saved[f"{split}_labels"])
        for k in REPORT_KEYS:
            assert last[f"{split}/{k}"] == pytest.approx(ref[k], rel=1e-9, abs=1e-12), (split, k)

    loss_fn = build_loss(loss, **dict(cfg.loss.params))
    gamma_history = json.loads((res.artifacts_dir / "gamma_history.json").read_text())
    if loss_fn.adaptive:
        updates = sum(h["adaptive/updates"] for h in res.history)
        assert len(gamma_history) == updates >= 1
        assert len(last["adaptive/gammas"]) == len(last["adaptive/gap"]) >= 1
        assert (res.artifacts_dir / "figures" / "gamma_dynamics.png").is_file()
    else:
        assert gamma_history == [] and "adaptive/gammas" not in last


def test_artifacts_and_full_final_evaluation(tmp_path: Path) -> None:
    from calibtune.data import default_ood
    from calibtune.posthoc import list_posthoc

    cfg = _cfg(tmp_path, "cross_entropy", eval__posthoc=list_posthoc(), data__ood=None)
    res = run(cfg)
    art = res.artifacts_dir
    for f in ("config.yaml", "metrics.json", "history.jsonl", "reliability.json", "roc.json"):
        assert (art / f).is_file(), f
    assert (art / "figures" / "reliability.png").is_file()
    assert config_from_dict(__import__("yaml").safe_load((art / "config.yaml").read_text())) == (
        res.config
    )
    for m in list_posthoc():
        assert f"test/ece@{m}" in res.metrics
    from calibtune.data import ood_severities

    for name in default_ood("digits"):
        keys = [f"{name}/s{s}" for s in ood_severities(name) or ()] or [name]
        for key in keys:
            for m in ("auroc", "aupr", "fpr95", "auroc_msp", "auroc@ts", "auroc_msp@ts"):
                assert f"ood/{key}/{m}" in res.metrics, (key, m)
    roc = json.loads((art / "roc.json").read_text())
    assert roc and (art / "figures" / "roc.png").is_file()
    assert len((art / "history.jsonl").read_text().splitlines()) == 2


def test_same_seed_same_metrics(tmp_path: Path) -> None:
    a = run(_cfg(tmp_path, "cross_entropy", name="a"))
    b = run(_cfg(tmp_path, "cross_entropy", name="b"))
    assert a.metrics == b.metrics
    assert [h["val/nll"] for h in a.history] == [h["val/nll"] for h in b.history]
    c = run(_cfg(tmp_path, "cross_entropy", name="c", seed=4))  # the seed is what they share
    assert c.metrics["test/nll"] != a.metrics["test/nll"]


def test_numbers_do_not_depend_on_the_callers_thread_count(tmp_path: Path) -> None:
    """A trial trains with its resources' threads (scaling.resources_per_worker.CPU, default 1),
    records them, and gives the caller its own setting back: the same config gives the same
    numbers whether the process around it runs 1 or 2 threads."""
    before = torch.get_num_threads()
    results = []
    try:
        for threads, name in ((2, "two"), (1, "one")):
            torch.set_num_threads(threads)
            res = run(_cfg(tmp_path, "cross_entropy", name=name, model__name="small_cnn"))
            assert torch.get_num_threads() == threads  # given back
            env = json.loads((res.artifacts_dir / "environment.json").read_text())
            assert env["torch_threads"] == 1  # the trial's own, not the caller's
            results.append(res)
        two = run(
            _cfg(
                tmp_path,
                "cross_entropy",
                name="cpu2",
                model__name="small_cnn",
                scaling__resources_per_worker={"CPU": 2},
            )
        )
        env = json.loads((two.artifacts_dir / "environment.json").read_text())
        assert env["torch_threads"] == 2
    finally:
        torch.set_num_threads(before)
    assert results[0].metrics == results[1].metrics
    assert [h["train/loss"] for h in results[0].history] == [
        h["train/loss"] for h in results[1].history
    ]


class _CrashOnce:
    """Raises once after epoch ``at`` (a marker file makes the retry pass)."""

    def __init__(self, marker: Path, at: int) -> None:
        self.marker, self.at = marker, at

    def on_epoch(self, epoch: int, metrics: Any) -> None:
        if epoch == self.at and not self.marker.exists():
            self.marker.touch()
            raise RuntimeError("injected failure")

    def on_trial_end(self, metrics: Any, artifacts_dir: Path) -> None:
        pass


def test_kill_and_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    loss = "adafocal"
    ref = run(_cfg(tmp_path, loss, name="ref", train__epochs=4))
    crash = _CrashOnce(tmp_path / "marker", at=2)
    cfg = _cfg(tmp_path, loss, name="crash", train__epochs=4)
    with pytest.raises(TrialFailedError, match="injected failure"):
        run(cfg, callbacks=[crash])
    ckpts = sorted(p.name for p in (tmp_path / "crash" / "checkpoints").iterdir())
    assert ckpts == ["epoch_000001", "epoch_000002"]
    resumed = run(cfg)  # same (storage_path, name): continues from epoch 2
    assert resumed.resumed_from_epoch == 2
    assert resumed.epochs_completed == ref.epochs_completed == 4
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3, 4]
    for k, v in ref.metrics.items():
        assert resumed.metrics[k] == pytest.approx(v, rel=1e-6, abs=1e-9), k


def test_local_mode_max_failures_retries_from_checkpoint(tmp_path: Path) -> None:
    crash = _CrashOnce(tmp_path / "marker", at=1)
    res = run(_cfg(tmp_path, scaling__max_failures=1), callbacks=[crash])
    assert res.resumed_from_epoch == 1 and res.epochs_completed == 2


def test_callbacks_see_every_epoch_and_the_artifacts(tmp_path: Path) -> None:
    seen: list[Any] = []

    class Log:
        def on_epoch(self, epoch: int, metrics: Any) -> None:
            seen.append((epoch, metrics["val/ece"]))

        def on_trial_end(self, metrics: Any, artifacts_dir: Path) -> None:
            seen.append(("end", (artifacts_dir / "metrics.json").is_file(), metrics["test/ece"]))

    res = run(_cfg(tmp_path), callbacks=[Log()])
    assert [s[0] for s in seen] == [1, 2, "end"]
    assert seen[-1] == ("end", True, res.metrics["test/ece"])


def test_diverging_config_fails_clearly(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, optimizer__lr=1e4, optimizer__momentum=0.0)
    with pytest.raises(TrialFailedError, match=r"non-finite loss at epoch \d+, step \d+"):
        run(cfg)


def test_missing_dataset_files_raise_before_training(tmp_path: Path) -> None:
    from calibtune.data import DatasetNotFoundError

    cfg = _cfg(tmp_path, data__name="cifar10", data__root=str(tmp_path / "none"))
    with pytest.raises(DatasetNotFoundError, match=r"^cifar10: dataset files not found"):
        run(cfg)
    assert not (tmp_path / cfg.name).exists()  # nothing started, nothing written


def test_adafocal_every_n_batches_updates_on_schedule(tmp_path: Path) -> None:
    from calibtune.data import load_splits

    cfg = _cfg(tmp_path, "adafocal", loss__params={"update_every": 5})
    res = run(cfg)
    n_train = len(load_splits("digits", seed=cfg.seed).train)
    per_epoch = -(-n_train // 64) // 5  # ceil(N/64) batches, an update after every 5th
    assert [h["adaptive/updates"] for h in res.history] == [per_epoch, per_epoch]
    records = json.loads((res.artifacts_dir / "gamma_history.json").read_text())
    assert len(records) == 2 * per_epoch
    assert [r["step"] for r in records] == list(range(1, 2 * per_epoch + 1))


def test_resuming_a_trial_folder_with_another_config_is_refused(tmp_path: Path) -> None:
    first = run(_cfg(tmp_path, "cross_entropy"))
    assert first.epochs_completed >= 1
    with pytest.raises(ValueError, match=r"started with another config \(loss.name: "):
        run(_cfg(tmp_path, "focal", name="t_cross_entropy"))
    # the unchanged config is accepted; finished, it returns the recorded result, not a retrain
    again = run(_cfg(tmp_path, "cross_entropy"))
    assert again.epochs_completed == 2 and again.metrics == first.metrics
    assert again.wall_time_s == first.wall_time_s


def test_a_failed_trial_names_calibtunes_frame_epoch_and_step(tmp_path: Path, monkeypatch) -> None:
    """An unexpected error mid-epoch (a CPU tensor meeting a device tensor, say) is reported as
    one line naming calibtune's innermost frame, the epoch and the step; the traceback is in
    artifacts/error.txt."""
    from calibtune.data import load_splits
    from calibtune.losses._base import CalibrationLoss

    per_epoch = -(-len(load_splits("digits", seed=3).train) // 64)
    calls = {"n": 0}
    original = CalibrationLoss.__call__

    def fail_at_step_3_of_epoch_2(self: Any, *args: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == per_epoch + 3:
            raise RuntimeError("Expected all tensors to be on the same device (planted)")
        return original(self, *args, **kw)

    monkeypatch.setattr(CalibrationLoss, "__call__", fail_at_step_3_of_epoch_2)
    cfg = _cfg(tmp_path)
    with pytest.raises(TrialFailedError) as info:
        run(cfg)
    msg = str(info.value)
    assert msg.startswith("RuntimeError: Expected all tensors to be on the same device (planted)")
    assert "at calibtune/training/_loop.py:" in msg and "in _step" in msg
    assert msg.endswith("epoch 2, step 3)")
    text = (tmp_path / cfg.name / "artifacts" / "error.txt").read_text()
    assert text.startswith(msg) and "Traceback (most recent call last)" in text


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_and_fp16_checkpoints_its_scaler(tmp_path: Path, precision) -> None:
    from calibtune.trial._checkpoint import latest_local_checkpoint, load_state

    cfg = _cfg(tmp_path, "focal", model__name="small_cnn", train__precision=precision,
               train__channels_last=True)  # fmt: skip
    res = run(cfg)
    assert res.epochs_completed == 2 and math.isfinite(res.metrics["test/ece"])
    state = load_state(latest_local_checkpoint(tmp_path / cfg.name / "checkpoints"))
    if precision == "fp16":
        assert state["scaler"]["scale"] > 0 and "_growth_tracker" in state["scaler"]
    else:
        assert state["scaler"] == {}
    again = run(cfg.replace(train=dataclasses.replace(cfg.train, epochs=3)))  # resumes epoch 3
    assert again.resumed_from_epoch == 2 and again.epochs_completed == 3


def test_the_validation_split_follows_split_seed_not_the_trial_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 22, item 2: the trial seed varies the initialisation only; data.split_seed (default
    # 1, the seed papers' fixed split) draws the validation split. The real load_splits runs;
    # the wrapper only records the seed the worker asked it for (local mode: in-process).
    import calibtune.trial._worker as worker

    seen: list[int] = []
    real = worker.load_splits

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["seed"])
        return real(*args, **kwargs)

    monkeypatch.setattr(worker, "load_splits", recording)
    a = run(_cfg(tmp_path, name="a", seed=3, train__epochs=1))
    run(_cfg(tmp_path, name="b", seed=4, train__epochs=1))
    c = run(_cfg(tmp_path, name="c", seed=3, train__epochs=1, data__split_seed=7))
    assert seen == [1, 1, 7]
    # same initialisation (seed 3), another validation split: the validation numbers move
    assert a.history[-1]["val/nll"] != c.history[-1]["val/nll"]


def test_best_epoch_selection_evaluates_the_best_checkpoint_and_survives_a_resume(
    tmp_path: Path,
) -> None:
    from calibtune.trial._select import best_epoch

    select = {"eval__select_epoch": "best", "eval__select_metric": "val/ece"}
    cfg = _cfg(tmp_path, "focal", optimizer__lr=0.3, train__epochs=4, train__keep_checkpoints=1,
               train__checkpoint_every=10, **select)  # fmt: skip
    res = run(cfg)
    chosen = best_epoch(res.history, "val/ece")
    assert res.metrics["selected_epoch"] == chosen
    # the final test numbers are the chosen epoch's model's (test is scored every epoch)
    assert res.metrics["test/nll"] == pytest.approx(res.history[chosen - 1]["test/nll"], rel=1e-6)
    kept = sorted(p.name for p in (tmp_path / cfg.name / "checkpoints").iterdir())
    assert kept == sorted({f"epoch_{chosen:06d}", "epoch_000004"})  # best + latest
    longer = cfg.replace(train=dataclasses.replace(cfg.train, epochs=6))
    again = run(longer)  # resumes at epoch 5 with the history and the best checkpoint
    assert again.resumed_from_epoch == 4
    chosen = best_epoch(again.history, "val/ece")
    assert again.metrics["selected_epoch"] == chosen
    assert again.metrics["test/nll"] == pytest.approx(
        again.history[chosen - 1]["test/nll"], rel=1e-6
    )


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("test/ece", "eval.select_metric: expected a validation metric"),
        ("val/ece@ts", "eval.select_metric: expected a key every epoch reports"),
        ("val/nope", "eval.select_metric: expected a metric with a direction"),
    ],
)
def test_select_metric_is_checked_like_an_objective(metric: str, expected: str) -> None:
    with pytest.raises(ValueError) as info:
        config_from_dict({"eval": {"select_epoch": "best", "select_metric": metric}})
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_while_saving_tensors_is_an_enospc_oserror(tmp_path: Path, monkeypatch) -> None:
    """Issue 24.1: PyTorch's zip writer given a path reports a full disk as ``RuntimeError:
    unexpected pos`` (seen in CI: a checkpoint hit the full disk and the trial failed with a
    traceback instead of the study's one disk-full line). Checkpoints and logits go through
    `save_tensors`, which raises the ENOSPC the study recognises."""
    import errno
    import os

    from calibtune.studyfile._diskfull import disk_full_text
    from calibtune.trial._checkpoint import save_tensors

    state = {"w": torch.zeros(100_000)}
    with pytest.raises(RuntimeError) as raw:
        torch.save(state, "/dev/full")
    assert not disk_full_text(str(raw.value))  # why the path form is not used
    target = tmp_path / "state.pt"
    save_tensors({"w": torch.ones(2)}, target)
    full = os.open("/dev/full", os.O_WRONLY)
    real = os.write
    # the storage owner's atomic writer writes a temp file: here every write hits a full disk
    monkeypatch.setattr(os, "write", lambda fd, data: real(full, data))
    with pytest.raises(OSError) as exc:
        save_tensors(state, target)
    monkeypatch.undo()
    os.close(full)
    assert exc.value.errno == errno.ENOSPC and disk_full_text(f"{exc.value!r} {exc.value}")
    assert torch.load(target, weights_only=True)["w"].tolist() == [1.0, 1.0]  # the old one
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]  # no temp file left
