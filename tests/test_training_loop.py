"""The pure training loop (no Ray): batching, schedules, evaluation passes, adaptive updates."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

from calibtune.training import (
    LoopSpec,
    NonFiniteLossError,
    epoch_index_batches,
    epoch_metrics,
    evaluate_final,
    gather_rows,
    infer_logits,
    lr_schedule,
    train_epochs,
)


def _blobs(n: int, k: int = 3, d: int = 5, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(k, d, generator=g) * 3
    y = torch.randint(0, k, (n,), generator=g)
    x = centers[y] + torch.randn(n, d, generator=g)
    return TensorDataset(x, y)


def test_epoch_batches_are_a_permutation_split_round_robin() -> None:
    one = epoch_index_batches(10, 4, seed=1, epoch=3)
    assert [len(b) for b in one] == [4, 4, 2]
    assert sorted(torch.cat(one).tolist()) == list(range(10))
    r0 = epoch_index_batches(10, 4, seed=1, epoch=3, rank=0, world=2)
    r1 = epoch_index_batches(10, 4, seed=1, epoch=3, rank=1, world=2)
    # global batch b of 2 workers (2 each) = global batch b of one worker (4)
    for b in range(2):
        assert sorted(torch.cat([r0[b], r1[b]]).tolist()) == sorted(one[b].tolist())
    # a new epoch reshuffles, the same (seed, epoch) does not
    assert not torch.equal(torch.cat(one), torch.cat(epoch_index_batches(10, 4, seed=1, epoch=4)))
    assert torch.equal(torch.cat(one), torch.cat(epoch_index_batches(10, 4, seed=1, epoch=3)))


def test_odd_sizes_pad_by_wrapping_like_distributed_sampler() -> None:
    r0 = torch.cat(epoch_index_batches(5, 2, seed=0, epoch=1, rank=0, world=2))
    r1 = torch.cat(epoch_index_batches(5, 2, seed=0, epoch=1, rank=1, world=2))
    assert len(r0) == len(r1) == 3  # 5 padded to 6
    assert set(torch.cat([r0, r1]).tolist()) == set(range(5))


def test_gather_rows_single_process_is_identity() -> None:
    x = torch.arange(6.0).reshape(3, 2)
    assert gather_rows(x, 3, 1) is x


def test_lr_schedule_step_cosine_constant() -> None:
    step = lr_schedule(0.1, "step", 10, milestones=(4, 7), gamma=0.1)
    # epochs 1-4 at 0.1, 5-7 at 0.01, 8-10 at 0.001 (decay *after* a milestone epoch)
    assert [round(step(e), 6) for e in (1, 4, 5, 7, 8, 10)] == [0.1, 0.1, 0.01, 0.01, 0.001, 0.001]
    cos = lr_schedule(1.0, "cosine", 4)
    # ½(1 + cos(π(e−1)/4)): e=1 → 1, e=3 → ½
    assert cos(1) == pytest.approx(1.0) and cos(3) == pytest.approx(0.5)
    warm = lr_schedule(1.0, "constant", 5, warmup_epochs=3)
    assert [warm(e) for e in (1, 3, 4)] == [0.25, 0.75, 1.0]
    with pytest.raises(ValueError, match="expected one of step, cosine, constant, got 'x'"):
        lr_schedule(1.0, "x", 3)(1)


def test_infer_logits_keeps_dataset_order_and_training_mode() -> None:
    ds = _blobs(50)
    model = nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.5), nn.Linear(8, 3))
    model.train()
    logits, labels = infer_logits(model, ds, batch_size=7, device=torch.device("cpu"))
    assert model.training  # restored
    model.eval()
    with torch.no_grad():
        ref = model(ds.tensors[0])
    torch.testing.assert_close(logits, ref)
    assert torch.equal(labels, ds.tensors[1])


class _Recorder(nn.Module):
    """Cross-entropy that records the model's mode at every training forward, adaptive API."""

    adaptive = True

    def __init__(self, model: nn.Module, update_every: Any) -> None:
        super().__init__()
        self.model, self.update_every = model, update_every
        self.modes: list[bool] = []
        self.history: list[dict[str, Any]] = []

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        self.modes.append(self.model.training)
        return nn.functional.cross_entropy(logits, targets)

    def update(self, probs: Tensor, labels: Tensor) -> dict[str, Any]:
        rec = {"step": len(self.history) + 1, "gammas": [1.0], "edges": [0.0, 1.0]}
        rec |= {"c_val": [float(probs.max(1).values.mean())], "a_val": [0.5], "switched": [False]}
        self.history.append(rec)
        return rec


def _spec(model: nn.Module, loss: nn.Module, **kw: Any) -> LoopSpec:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    args: dict[str, Any] = dict(
        model=model,
        loss_fn=loss,
        optimizer=opt,
        lr_at=lambda e: 0.1,
        train_set=_blobs(200, seed=1),
        val_set=_blobs(60, seed=2),
        test_set=_blobs(60, seed=3),
        epochs=3,
        batch_size=32,
    )
    args.update(kw)
    return LoopSpec(**args)


def test_mid_epoch_updates_count_and_return_to_train_mode() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    loss = _Recorder(model, update_every=3)
    reports: list[dict[str, Any]] = []
    train_epochs(_spec(model, loss), on_epoch_end=lambda e, m, c: reports.append(m))
    # 200 samples / 32 = 7 batches per epoch → updates after batches 3 and 6: 2 per epoch
    assert len(loss.history) == 3 * 2
    assert [r["adaptive/updates"] for r in reports] == [2, 2, 2]
    assert all(loss.modes), "a training forward ran with the model in eval() mode"
    assert reports[-1]["adaptive/gap"] == pytest.approx(
        [loss.history[-1]["c_val"][0] - 0.5], abs=1e-12
    )


def test_epoch_updates_once_per_epoch_and_metrics_match_cached_logits() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    loss = _Recorder(model, update_every="epoch")
    seen: list[tuple[dict[str, Any], Any]] = []
    last = train_epochs(_spec(model, loss), on_epoch_end=lambda e, m, c: seen.append((m, c)))
    assert len(loss.history) == 3
    m, cache = seen[-1]
    assert cache is last
    from calibtune.metrics import calibration_report

    ref = calibration_report(logits=cache.val_logits, labels=cache.val_labels)
    assert m["val/ece"] == pytest.approx(ref["ece"], abs=0)
    ref_t = calibration_report(logits=cache.test_logits, labels=cache.test_labels)
    assert m["test/nll"] == pytest.approx(ref_t["nll"], abs=0)
    losses = [r["train/loss"] for r, _ in seen]
    assert losses[-1] < losses[0]
    assert set(m) >= {"epoch", "lr", "train/loss", "train/error", "epoch_time", "val/smece"}


def test_non_finite_loss_names_epoch_and_step() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    spec = _spec(model, nn.CrossEntropyLoss(), lr_at=lambda e: 1e6)
    with pytest.raises(NonFiniteLossError, match=r"^non-finite loss at epoch 1, step \d+ "):
        train_epochs(spec)


def test_grad_clip_rescales_the_step_to_the_clip_norm() -> None:
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    spec = _spec(model, nn.CrossEntropyLoss(), optimizer=opt, lr_at=lambda e: 1.0)
    spec.epochs, spec.batch_size = 1, 200
    # the unclipped gradient of the one full batch (the mean loss ignores the batch order)
    x, y = spec.train_set.tensors
    grads = torch.autograd.grad(nn.functional.cross_entropy(model(x), y), model.parameters())
    g = torch.cat([gr.reshape(-1) for gr in grads])
    clip = 1e-3
    assert g.norm() > 100 * clip  # the clip is active
    spec.grad_clip = clip
    train_epochs(spec)
    # one step of plain SGD with lr 1: Δθ = −g · clip / (‖g‖ + 1e-6) (clip_grad_norm_)
    moved = torch.cat(
        [(p.detach() - b).reshape(-1) for p, b in zip(model.parameters(), before, strict=True)]
    )
    # float32 θ ≈ 0.3 leaves Δθ ≈ 1e-4 with ~3e-8 of rounding
    torch.testing.assert_close(moved, -g * clip / (g.norm() + 1e-6), rtol=1e-3, atol=1e-7)
    assert moved.norm().item() == pytest.approx(clip, rel=1e-3)


def test_epoch_metrics_prefixes_every_scalar() -> None:
    ds = _blobs(40)
    logits = torch.randn(40, 3)
    m = epoch_metrics("val", logits, ds.tensors[1], 10)
    from calibtune.metrics import calibration_report
    from calibtune.metrics.keys import FINAL_ONLY_KEYS
    from calibtune.training._uncertainty import selective_metrics

    report = calibration_report(logits=logits, labels=ds.tensors[1], n_bins=10)
    scalars = {k for k, v in report.items() if isinstance(v, int | float)}
    scalars |= {k for k, v in report.items() if isinstance(v, torch.Tensor) and v.numel() == 1}
    assert set(m) == {f"val/{k}" for k in scalars}
    assert all(m[f"val/{k}"] == pytest.approx(float(report[k]), abs=0) for k in scalars)
    assert {"val/ece", "val/nll", "val/error"} <= set(m)
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())
    # selective: AURC/AUGRC/refinement NLL too; the refit on the logits equals the one on log p
    s = epoch_metrics("val", logits, ds.tensors[1], 10, selective=True)
    assert set(s) == set(m) | {f"val/{k}" for k in FINAL_ONLY_KEYS}
    assert s["val/refinement_nll"] <= s["val/nll"] + 1e-12
    on_log_p = selective_metrics(torch.softmax(logits.double(), 1), ds.tensors[1], "val")
    assert {k: s[k] for k in on_log_p} == pytest.approx(on_log_p, abs=1e-12)


@pytest.mark.parametrize("selective", [False, True])
def test_selective_metrics_every_epoch_only_when_asked(selective: bool) -> None:
    """``epoch_selective`` (a study names val/aurc, val/augrc or val/refinement_nll): in every
    epoch's report, for the epoch_posthoc methods too; else in none (the final evaluation has
    them)."""
    from calibtune.metrics import keys as K

    ds = _blobs(60)
    model = nn.Linear(5, 3)
    spec = LoopSpec(
        model=model,
        loss_fn=nn.CrossEntropyLoss(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        lr_at=lambda e: 0.1,
        train_set=ds,
        val_set=_blobs(30, seed=1),
        test_set=None,
        epochs=2,
        batch_size=16,
        epoch_posthoc={"ts": {}},
        epoch_selective=selective,
    )
    history: list[dict[str, Any]] = []
    train_epochs(spec, on_epoch_end=lambda e, m, c: history.append(m))
    want = {K.key("val", m, p) for m in K.FINAL_ONLY_KEYS for p in ("", "ts")}
    for h in history:
        assert (want & set(h)) == (want if selective else set())
        assert set(h) <= K.epoch_keys(epoch_posthoc=["ts"], selective=selective)


def test_evaluate_final_names_and_ts_keeps_argmax() -> None:
    from calibtune.metrics import calibration_report
    from calibtune.training import OODLogits

    g = torch.Generator().manual_seed(0)
    y_val, y_test = (
        torch.randint(0, 4, (300,), generator=g),
        torch.randint(0, 4, (300,), generator=g),
    )
    # over-confident logits: correct class boosted, then scaled by 4
    z_val = 4 * (torch.randn(300, 4, generator=g) + 2 * nn.functional.one_hot(y_val, 4))
    z_test = 4 * (torch.randn(300, 4, generator=g) + 2 * nn.functional.one_hot(y_test, 4))
    ood = [OODLogits("noise/s1", torch.randn(100, 4, generator=g))]
    out = evaluate_final(z_val, y_val, z_test, y_test, posthoc={"ts": {}}, ood=ood)
    ref = calibration_report(logits=z_test, labels=y_test)
    assert out.metrics["test/ece"] == pytest.approx(ref["ece"])
    assert out.metrics["test/error@ts"] == pytest.approx(ref["error"])  # TS keeps argmax
    assert out.metrics["test/ece@ts"] < out.metrics["test/ece"]
    assert out.metrics["posthoc/ts/T"] > 1.0  # over-confident → T > 1
    for suffix in ("", "_msp", "@ts", "_msp@ts"):
        for k in ("auroc", "aupr", "fpr95"):
            assert f"ood/noise/s1/{k}{suffix}" in out.metrics
    assert out.metrics["ood/noise/s1/auroc"] > 0.9
    assert set(out.roc) == {
        "noise/s1/entropy",
        "noise/s1/msp",
        "noise/s1/entropy@ts",
        "noise/s1/msp@ts",
    }
    assert set(out.reliability) == {"uncalibrated", "ts"}
