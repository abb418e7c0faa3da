"""The pinned torch/torchvision pair works on this machine (torchvision's C ops load on CPU)."""

from __future__ import annotations

import torch


def test_torchvision_imports_and_builds_a_model():
    import torchvision
    from torchvision.ops import nms

    model = torchvision.models.resnet18(num_classes=10)
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    # nms is the operator that fails when torchvision's _C cannot load
    keep = nms(torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1.0]]), torch.tensor([0.9, 0.8]), 0.5)
    assert keep.tolist() == [0]
