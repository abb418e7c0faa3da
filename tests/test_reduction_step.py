"""One optimiser step of calibtune equals the authors' update (issue 22, item 1).

calibtune's side: the loss built from a trial config (``loss.reduction``), torch SGD with the
config's optimiser settings, and ``train.grad_clip`` applied as the training loop applies it
(``nn.utils.clip_grad_norm_`` after ``backward``, before ``optimizer.step()``). The loop calls
only ``loss_fn(logits, y)``, so the reduction lives in the loss module.

The reference is written out by hand from the seed code (torrvision/focal_calibration,
``train_utils.py``: ``loss = loss_function(logits, labels)`` with ``size_average=False`` for
CE/focal/FLSD/MMCE, ``loss.backward()``, ``clip_grad_norm(model.parameters(), 2)``,
``optimizer.step()``; ``Losses/focal_loss.py``: ``-(1 - pt)**gamma * logpt`` summed;
``Losses/brier_score.py``: ``sum((onehot - softmax)**2) / batch_size``), with the gradient-norm
clip and SGD + momentum + weight decay spelled out as formulas — not through torch.optim or
``clip_grad_norm_`` — so that the two sides share nothing but autograd.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from calibtune.trial import config_from_dict

B, D, K = 16, 5, 4
LR, MOMENTUM, WD, CLIP = 0.1, 0.9, 5e-4, 2.0


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, D, generator=g, dtype=torch.float64)
    y = torch.randint(0, K, (B,), generator=g)
    return x, y


def _model() -> nn.Linear:
    torch.manual_seed(1)
    return nn.Linear(D, K).double()


def _cfg(loss: dict, grad_clip: float | None) -> object:
    return config_from_dict(
        {
            "loss": loss,
            "optimizer": {"name": "sgd", "lr": LR, "momentum": MOMENTUM, "weight_decay": WD},
            "train": {"grad_clip": grad_clip},
        }
    )


def _calibtune_steps(cfg, n_steps: int) -> list[torch.Tensor]:
    """What calibtune's loop does per batch, on the same batch ``n_steps`` times."""
    model = _model()
    loss_fn = cfg.loss.build()
    o = cfg.optimizer
    opt = torch.optim.SGD(
        model.parameters(),
        lr=o.lr,
        momentum=o.momentum,
        weight_decay=o.weight_decay,
        nesterov=o.nesterov,
    )
    x, y = _batch()
    for _ in range(n_steps):
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.train.grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _focal_summed(logits: torch.Tensor, y: torch.Tensor, gamma: float) -> torch.Tensor:
    # Losses/focal_loss.py with size_average=False
    logpt = torch.log_softmax(logits, 1).gather(1, y[:, None]).squeeze(1)
    return (-((1 - logpt.exp()) ** gamma) * logpt).sum()


def _brier_seed(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # Losses/brier_score.py: squared difference summed over batch and classes, / batch size
    onehot = torch.zeros_like(logits).scatter_(1, y[:, None], 1.0)
    return ((onehot - torch.softmax(logits, 1)) ** 2).sum() / logits.shape[0]


def _authors_steps(loss_of, n_steps: int) -> tuple[list[torch.Tensor], float]:
    """The seed code's step written out: g = ∇loss; if ‖g‖ > c: g ← g·c/(‖g‖ + 1e-6) (torch's
    clip rule); d = g + wd·θ; buf = d (first step), buf ← μ·buf + d (later); θ ← θ − lr·buf.
    Returns the parameters and the first step's unclipped gradient norm."""
    model = _model()
    params = [p.detach().clone().requires_grad_(True) for p in model.parameters()]
    x, y = _batch()
    bufs: list[torch.Tensor | None] = [None] * len(params)
    first_norm = 0.0
    for step in range(n_steps):
        logits = x @ params[0].T + params[1]
        grads = torch.autograd.grad(loss_of(logits, y), params)
        norm = float(torch.sqrt(sum((g**2).sum() for g in grads)))
        if step == 0:
            first_norm = norm
        scale = min(1.0, CLIP / (norm + 1e-6))
        with torch.no_grad():
            for i, (p, g) in enumerate(zip(params, grads, strict=True)):
                d = g * scale + WD * p
                bufs[i] = d.clone() if bufs[i] is None else MOMENTUM * bufs[i] + d
                p -= LR * bufs[i]
    return [p.detach() for p in params], first_norm


@pytest.mark.parametrize("n_steps", [1, 2])
def test_summed_focal_with_clip_2_steps_as_mukhotis_code(n_steps: int) -> None:
    cfg = _cfg({"name": "focal", "params": {"gamma": 3.0}, "reduction": "sum"}, CLIP)
    ours = _calibtune_steps(cfg, n_steps)
    ref, norm = _authors_steps(lambda z, y: _focal_summed(z, y, 3.0), n_steps)
    # the clip is active on the sum's gradient and not on the mean's (norm / B)
    assert norm / B < CLIP < norm
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # the default (mean) reduction takes a different step: the test would notice a lost setting
    mean = _calibtune_steps(_cfg({"name": "focal", "params": {"gamma": 3.0}}, CLIP), n_steps)
    assert not torch.allclose(mean[0], ref[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("n_steps", [1, 2])
def test_mean_brier_with_clip_2_steps_as_mukhotis_code(n_steps: int) -> None:
    cfg = _cfg({"name": "brier", "reduction": "mean"}, CLIP)
    ours = _calibtune_steps(cfg, n_steps)
    ref, _ = _authors_steps(_brier_seed, n_steps)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    summed = _calibtune_steps(_cfg({"name": "brier", "reduction": "sum"}, CLIP), n_steps)
    assert not torch.allclose(summed[0], ref[0], rtol=0, atol=1e-6)


def test_loss_reduction_is_validated_once_with_the_key_path() -> None:
    with pytest.raises(
        ValueError, match=r"^loss.reduction: expected one of 'mean', 'sum', got 'none'$"
    ):
        _cfg({"name": "focal", "reduction": "none"}, None)
    assert _cfg({"name": "focal"}, None).loss.build().reduction == "mean"
