"""Issue 27 item 2: under bf16/fp16 autocast the logits come out of the model's head in float32.

The body may run in bf16; the classifier (the last ``nn.Linear``) runs with autocast off on
float32 features, so the logits that feed metrics, post-hoc fits, OOD scores and AdaFocal's bins
are not bf16 numbers upcast afterwards. Checked on the CPU with bf16 autocast against a reference
that computes the head in float32 by hand from the same bf16 body features.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from calibtune.data._sst import encode_tree, parse_tree
from calibtune.losses import build_loss
from calibtune.models import build_model, list_models
from calibtune.models._zoo import MODELS
from calibtune.training import Precision, epoch_metrics, float32_head, infer_logits
from calibtune.training import _loop as loop


def _last_linear(model: nn.Module) -> nn.Linear:
    return [m for m in model.modules() if isinstance(m, nn.Linear)][-1]


def _reference(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's body under bf16 autocast (in eval mode, as inference), its head by hand in
    float32 on the features."""
    head, seen, was = _last_linear(model), [], model.training
    handle = head.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    model.train(was)
    handle.remove()
    with torch.no_grad():
        return F.linear(seen[0].float(), head.weight, head.bias)


def _digits(n: int = 96, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


def _bf16_representable(t: torch.Tensor) -> bool:
    return bool((t.bfloat16().float() == t).all())


@pytest.mark.parametrize("name", ["small_cnn", "mlp"])
def test_inference_logits_under_bf16_come_from_a_float32_head(name):
    torch.manual_seed(0)
    model = build_model(name, 10, (1, 8, 8))
    ds = _digits()
    bf16 = Precision("bf16", "cpu")
    logits, labels = infer_logits(
        model, ds, batch_size=32, device=torch.device("cpu"), autocast=bf16.autocast
    )
    assert logits.dtype == torch.float32
    assert not _bf16_representable(logits)  # today's code: every logit is a bf16 number
    ref = _reference(model, ds.tensors[0])
    torch.testing.assert_close(logits, ref, rtol=1e-6, atol=1e-6)
    assert epoch_metrics("val", logits, labels, 15) == epoch_metrics("val", ref, labels, 15)
    # the body still runs in bf16: the features reaching the head are bf16 numbers
    feats = []
    _last_linear(model).register_forward_pre_hook(lambda m, a: feats.append(a[0]))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ds.tensors[0][:4])
    assert feats[0].dtype == torch.bfloat16


def test_training_logits_that_feed_the_loss_come_from_a_float32_head():
    """The training step's logits (what AdaFocal bins and every loss sees) are float32 from the
    head, and the gradient still reaches the bf16 body."""
    torch.manual_seed(0)
    model = build_model("small_cnn", 10, (1, 8, 8))
    x, y = _digits(32).tensors
    bf16 = Precision("bf16", "cpu")
    model.train()
    logits = bf16.forward(model, x)
    assert not _bf16_representable(logits.detach())
    model.eval()  # the reference: same weights, BN in eval on both sides
    torch.testing.assert_close(bf16.forward(model, x).detach(), _reference(model, x))
    model.train()
    loss = build_loss("adafocal")(bf16.forward(model, x), y)
    loss.backward()
    first = next(model.parameters())
    assert first.grad is not None and torch.isfinite(first.grad).all()


def test_the_float32_head_changes_neither_fp32_logits_nor_the_state_dict():
    torch.manual_seed(0)
    model = build_model("small_cnn", 10, (1, 8, 8)).eval()
    x = _digits(16).tensors[0]
    before, keys = model(x), list(model.state_dict())
    Precision("bf16", "cpu").prepare(model)
    assert isinstance(model.fc, nn.Linear) and list(model.state_dict()) == keys
    assert torch.equal(model(x), before)  # fp32: bit for bit the same forward
    assert float32_head(model) is model  # idempotent


@pytest.mark.parametrize("name", list_models())
def test_every_models_last_linear_is_the_layer_that_returns_its_logits(name):
    """`float32_head` converts the last ``nn.Linear``; for every registered model that layer's
    output is the model's output (checked on the meta device: no compute)."""
    shape = tuple(next(p.default for p in MODELS.get(name).params if p.name == "input_shape"))
    if "trees" in MODELS.get(name).tags:  # index arithmetic on its input: a real CPU batch
        x = torch.from_numpy(np.stack([encode_tree(parse_tree("(3 (2 a) (4 b))"), [2, 3])] * 2))
        model = float32_head(build_model(name, 7, shape)).eval()
        out = []
        _last_linear(model).register_forward_hook(lambda m, a, o: out.append(o))
        logits = model(x)
        assert out and out[-1] is logits and logits.shape == (2, 7)
        return
    with torch.device("meta"):
        model = float32_head(build_model(name, 7, shape)).eval()
        out = []
        _last_linear(model).register_forward_hook(lambda m, a, o: out.append(o))
        logits = model(torch.empty(2, *shape))
    assert out and out[-1] is logits and logits.shape == (2, 7)


def test_a_model_without_a_linear_head_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^train\.precision: expected a model whose last nn\.Li"):
        float32_head(nn.Sequential(nn.Conv2d(1, 2, 3)))


def test_the_loop_epoch_under_bf16_reports_metrics_of_float32_head_logits():
    """One epoch of the loop at bf16: the cached validation logits are the float32 head's."""
    torch.manual_seed(0)
    model = build_model("small_cnn", 10, (1, 8, 8))
    spec = loop.LoopSpec(
        model=model,
        loss_fn=build_loss("adafocal"),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        lr_at=lambda e: 0.05,
        train_set=_digits(64, 1),
        val_set=_digits(64, 2),
        test_set=None,
        epochs=1,
        batch_size=32,
        device=torch.device("cpu"),
        precision=Precision("bf16", "cpu"),
    )
    cache = loop.train_epochs(spec)
    assert cache is not None and not _bf16_representable(cache.val_logits)
    torch.testing.assert_close(cache.val_logits, _reference(model, spec.val_set.tensors[0]))
