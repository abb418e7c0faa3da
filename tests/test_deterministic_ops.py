"""``train.deterministic`` on a GPU: no registered model or loss dispatches an op that torch
lists as having no deterministic CUDA kernel (`calibtune.training._determinism`). The ops are
recorded on the ``meta`` device (models) and the CPU (losses): the dispatch is CUDA's, without
one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calibtune.data._sst import encode_tree, parse_tree
from calibtune.losses import build_loss, list_losses
from calibtune.models import build_model, list_models
from calibtune.models._zoo import MODELS
from calibtune.training._determinism import cuda_nondeterministic_ops


def _default_shape(name: str) -> tuple[int, ...]:
    return tuple(next(p.default for p in MODELS.get(name).params if p.name == "input_shape"))


def _model_ops(model: torch.nn.Module, shape: tuple[int, ...]) -> set[str]:
    with torch.device("meta"):
        model = model.to("meta")
        x = torch.randn(2, *shape)
    return cuda_nondeterministic_ops(lambda: model(x).sum().backward())


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_trains_under_deterministic_cuda(name):
    shape = _default_shape(name)
    if "trees" in MODELS.get(name).tags:  # index arithmetic on its input: a real CPU batch
        rows = [encode_tree(parse_tree("(3 (2 a) (4 (1 b) (0 c)))"), [2, 3, 4])] * 2
        x = torch.from_numpy(np.stack(rows))
        model = build_model(name, 10, shape)
        found = cuda_nondeterministic_ops(lambda: model(x).sum().backward())
        assert found == set(), f"{name}: no deterministic CUDA kernel"
        return
    with torch.device("meta"):
        model = build_model(name, 10, shape)
    assert _model_ops(model, shape) == set(), f"{name}: no deterministic CUDA kernel"


def test_the_audit_sees_the_adaptive_pool_resnet50_tiny_had():
    """The check can fail: Tiny-ImageNet's ResNet-50 with its earlier ``AdaptiveAvgPool2d(2)``
    dispatches ``_adaptive_avg_pool2d_backward``, which stops a deterministic CUDA trial."""
    shape = _default_shape("resnet50_tiny")
    with torch.device("meta"):
        model = build_model("resnet50_tiny", 10, shape)
    model.avgpool = torch.nn.AdaptiveAvgPool2d(2)
    assert _model_ops(model, shape) == {"_adaptive_avg_pool2d_backward"}


def test_resnet50_tiny_pools_exactly_as_the_adaptive_pool():
    """``nn.AvgPool2d(4)`` on the 8×8 last stage = ``nn.AdaptiveAvgPool2d(2)``, forward and
    backward, to the bit on the CPU."""
    torch.manual_seed(0)
    x = torch.randn(3, 2048, 8, 8, dtype=torch.float64, requires_grad=True)
    model = build_model("resnet50_tiny", 200, (3, 64, 64))
    a = model.avgpool(x)
    b = torch.nn.AdaptiveAvgPool2d(2)(x)
    assert torch.equal(a, b)
    ga = torch.autograd.grad(a.square().sum(), x)[0]
    gb = torch.autograd.grad(b.square().sum(), x)[0]
    assert torch.equal(ga, gb)


@pytest.mark.parametrize("name", list_losses())
def test_every_registered_loss_trains_under_deterministic_cuda(name):
    torch.manual_seed(0)
    logits = torch.randn(16, 5, requires_grad=True)
    y = torch.randint(0, 5, (16,))
    loss = build_loss(name)
    assert cuda_nondeterministic_ops(lambda: loss(logits, y).backward()) == set(), name
    if getattr(loss, "adaptive", False):  # AdaFocal's γ update from validation bins
        probs = torch.softmax(logits.detach(), 1)
        assert cuda_nondeterministic_ops(lambda: loss.update(probs, y)) == set(), name
