"""ResNets, Wide-ResNet and DenseNet in the 32×32 ("CIFAR") variants the seed papers train.

Differences from the ImageNet models: a 3×3 stride-1 stem convolution and no max-pool, so a
32×32 input reaches the last stage at 4×4. torchvision's ``Bottleneck``/``BasicBlock``/
``DenseNet`` are reused; only stems, shortcuts and heads change. The architectures match the
networks of Mukhoti et al. (2020)'s code (github.com/torrvision/focal_calibration, ``Net/``),
which AdaFocal and Dual Focal reuse — with one deliberate exception, ``resnet110``
(see `cifar_resnet110`). Their initialisation is not the builders' (torchvision's own init loops
differ from the authors' code): `build_model` redraws every weight with the scheme recorded
here per network (``_SEED_MODELS``; `calibtune.models.model_init`), the authors' code's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._init import ModelInit
from ._zoo import add_model, check_image_shape

# torchvision is imported where a network is built: importing it loads torch._dynamo, which a
# study's driver and the CLI never need otherwise (`import calibtune.study, calibtune.trial,
# calibtune.cli`: 3.2–6.1 s instead of 7.9–16.5 s, alternated at load 10).
if TYPE_CHECKING:
    from torchvision.models import ResNet

__all__ = [
    "CifarResNet",
    "cifar_densenet121",
    "cifar_resnet50",
    "cifar_resnet110",
    "cifar_resnet110_bottleneck",
    "tiny_resnet50",
    "wide_resnet26_10",
]


def _cifar_stem(model: ResNet, in_channels: int) -> ResNet:
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


class _PadShortcut(nn.Module):
    """He et al.'s parameter-free shortcut "A": subsample by ``stride`` and zero-pad the new
    channels, ``(B, C, H, W) -> (B, C + extra, H/stride, W/stride)``."""

    def __init__(self, stride: int, extra_channels: int) -> None:
        super().__init__()
        self.stride = stride
        self.extra = extra_channels

    def forward(self, x: Tensor) -> Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        half = self.extra // 2
        return F.pad(x, (0, 0, 0, 0, half, self.extra - half))


class CifarResNet(nn.Module):
    """Three-or-more-stage ResNet of torchvision ``BasicBlock``s for small images.

    Stem: 3×3 conv (``stem_width``) + BN + ReLU. Stage i has ``blocks[i]`` blocks of width
    ``widths[i]``; stages after the first start with stride 2. ``shortcut="pad"`` is He et al.'s
    option A (zero-padded identity), ``"conv"`` option B (1×1 conv + BN). Head: global average
    pool + linear. ``(B, C, H, W) -> (B, num_classes)`` logits.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        stem_width: int,
        widths: Sequence[int],
        blocks: Sequence[int],
        shortcut: Literal["pad", "conv"],
    ) -> None:
        from torchvision.models.resnet import BasicBlock, conv1x1, conv3x3

        super().__init__()
        self.stem = nn.Sequential(
            conv3x3(in_channels, stem_width), nn.BatchNorm2d(stem_width), nn.ReLU(inplace=True)
        )
        stages = []
        inplanes = stem_width
        for i, (width, n) in enumerate(zip(widths, blocks, strict=True)):
            layers = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                down: nn.Module | None = None
                if stride != 1 or inplanes != width:
                    down = (
                        _PadShortcut(stride, width - inplanes)
                        if shortcut == "pad"
                        else nn.Sequential(conv1x1(inplanes, width, stride), nn.BatchNorm2d(width))
                    )
                layers.append(BasicBlock(inplanes, width, stride, down))
                inplanes = width
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(inplanes, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(torch.flatten(self.pool(self.stages(self.stem(x))), 1))


def cifar_resnet50(shape: Sequence[int], num_classes: int) -> nn.Module:
    """He et al. (CVPR 2016) ResNet-50 for 32×32 inputs as in the seeds' ``Net/resnet.py``."""
    from torchvision.models.resnet import Bottleneck, ResNet

    return _cifar_stem(ResNet(Bottleneck, [3, 4, 6, 3], num_classes=num_classes), shape[0])


def _pool_to_2x2(height: int, width: int) -> nn.Module:
    """The 2×2 average pool of a ``height``×``width`` last stage: ``nn.AvgPool2d(h/2, w/2)``
    where both sides are even — the same windows as ``nn.AdaptiveAvgPool2d(2)``, whose CUDA
    backward has no deterministic kernel (``train.deterministic`` would stop the trial) — else
    the adaptive pool (overlapping windows).

    >>> _pool_to_2x2(8, 8)
    AvgPool2d(kernel_size=(4, 4), stride=(4, 4), padding=0)
    """
    if height % 2 or width % 2:
        return nn.AdaptiveAvgPool2d(2)
    return nn.AvgPool2d((height // 2, width // 2))


def tiny_resnet50(shape: Sequence[int], num_classes: int) -> nn.Module:
    """ResNet-50 for 64×64 inputs: the last stage is 8×8, pooled to 2×2 (4·2048 features)."""
    from torchvision.models.resnet import Bottleneck

    model = cifar_resnet50(shape, num_classes)
    side = [int(n) for n in shape[1:]]
    for _ in range(3):  # three stride-2 stages: ⌈n / 2⌉ each
        side = [(n + 1) // 2 for n in side]
    model.avgpool = _pool_to_2x2(*side)
    model.fc = nn.Linear(4 * 512 * Bottleneck.expansion, num_classes)
    return model


def cifar_resnet110(shape: Sequence[int], num_classes: int) -> nn.Module:
    """The standard ResNet-110 of He et al. (CVPR 2016, §4.2): depth 6·18+2, three stages of 18
    BasicBlocks with 16/32/64 channels and parameter-free shortcuts (option A).

    The seeds' code calls an ImageNet-width bottleneck 3-4-26-3 network "resnet110" (45.9M
    parameters); that one is registered as ``resnet110_bottleneck``."""
    return CifarResNet(shape[0], num_classes, 16, (16, 32, 64), (18, 18, 18), shortcut="pad")


def cifar_resnet110_bottleneck(shape: Sequence[int], num_classes: int) -> nn.Module:
    """Bottleneck ResNet with 3-4-26-3 blocks (3·(3+4+26+3)+2 = 110 layers) and ImageNet
    widths, as ``resnet110`` in Mukhoti et al.'s ``Net/resnet.py``; for reproducing their
    numbers."""
    from torchvision.models.resnet import Bottleneck, ResNet

    return _cifar_stem(ResNet(Bottleneck, [3, 4, 26, 3], num_classes=num_classes), shape[0])


def wide_resnet26_10(shape: Sequence[int], num_classes: int) -> nn.Module:
    """Zagoruyko & Komodakis (BMVC 2016) widening (k=10) of a CIFAR ResNet, in the form the
    seeds train (``Net/wide_resnet.py``): depth 26 = 6·4+2, i.e. 4 post-activation
    (conv-BN-ReLU) BasicBlocks per stage, 16-channel stem, 1×1 conv + BN projection shortcuts,
    no dropout. (The WRN paper's own blocks are pre-activation with depth 6n+4.)"""
    return CifarResNet(shape[0], num_classes, 16, (160, 320, 640), (4, 4, 4), shortcut="conv")


def cifar_densenet121(shape: Sequence[int], num_classes: int) -> nn.Module:
    """Huang et al. (CVPR 2017) DenseNet-121 for 32×32 inputs as in the seeds'
    ``Net/densenet.py``: torchvision's dense blocks and transitions, the 7×7/2 stem, its BN-ReLU
    and the max-pool replaced by one 3×3 stride-1 convolution to 64 channels."""
    from torchvision.models import DenseNet

    model = DenseNet(32, (6, 12, 24, 16), 64, num_classes=num_classes)
    model.features.conv0 = nn.Conv2d(shape[0], 64, kernel_size=3, stride=1, padding=1, bias=False)
    # the first dense layer starts with its own BN-ReLU, so the stem needs none
    model.features.norm0 = nn.Identity()
    model.features.relu0 = nn.Identity()
    model.features.pool0 = nn.Identity()
    return model


_IMAGE32 = (3, 32, 32)
_FC = "github.com/torrvision/focal_calibration"
# the authors' code's init per network: a network without init code of its own gets PyTorch's
# per-layer defaults; the init loops of wide_resnet.py and resnet_tiny_imagenet.py draw
# convolutions from N(0, 2/(k·k·C_out)). Builders' own init is always redrawn (built_with None).
_DEFAULT_INIT = ModelInit(
    "torch_default",
    f"{_FC} Net/resnet.py and 3mcloud/adafocal models/resnet.py: no init code (PyTorch defaults)",
)
_INITS = {
    "resnet50": _DEFAULT_INIT,
    "resnet110_bottleneck": _DEFAULT_INIT,
    "densenet121": ModelInit("torch_default", f"{_FC} Net/densenet.py: no init code"),
    "wide_resnet26_10": ModelInit(
        "kaiming_normal_fan_out", f"{_FC} Net/wide_resnet.py: normal_(0, sqrt(2/(k·k·C_out)))"
    ),
    "resnet50_tiny": ModelInit(
        "kaiming_normal_fan_out",
        f"{_FC} Net/resnet_tiny_imagenet.py: normal_(0, sqrt(2/(k·k·C_out)))",
    ),
    # not in the seeds' code: He et al.'s CIFAR ResNet, with torchvision's (He) init
    "resnet110": ModelInit(
        "kaiming_normal_fan_out", "He et al. (CVPR 2016); not in the seeds' code"
    ),
}
#: name -> (builder, default input shape, summary); every one takes (C, H, W) images
_SEED_MODELS = {
    "resnet50": (
        cifar_resnet50,
        _IMAGE32,
        "ResNet-50 (bottleneck 3-4-6-3, 64-2048 channels), 3×3 stem, no max-pool; "
        "23.5M parameters for 10 classes",
    ),
    "resnet50_tiny": (
        tiny_resnet50,
        (3, 64, 64),
        "ResNet-50 for 64×64 Tiny-ImageNet: 3×3 stem, no max-pool, 2×2 average pool "
        "before an 8192→K linear layer (the seeds' Net/resnet_tiny_imagenet.py)",
    ),
    "resnet110": (
        cifar_resnet110,
        _IMAGE32,
        "He et al.'s CIFAR ResNet-110: BasicBlock 18-18-18, 16/32/64 channels, "
        "zero-padding shortcuts; 1.73M parameters",
    ),
    "resnet110_bottleneck": (
        cifar_resnet110_bottleneck,
        _IMAGE32,
        "the seeds' 'ResNet-110': ImageNet-width bottleneck 3-4-26-3, 3×3 stem; ≈45.9M parameters",
    ),
    "wide_resnet26_10": (
        wide_resnet26_10,
        _IMAGE32,
        "Wide-ResNet-26-10 as in the seeds: post-activation BasicBlocks 4-4-4, "
        "160/320/640 channels, 1×1 conv shortcuts; 36.5M parameters",
    ),
    "densenet121": (
        cifar_densenet121,
        _IMAGE32,
        "DenseNet-121 (growth 32, blocks 6-12-24-16), 3×3 stem without BN/pool; "
        "6.96M parameters for 10 classes",
    ),
}
for _name, (_build, _shape, _summary) in _SEED_MODELS.items():
    add_model(
        _name, _build, check_image_shape, _shape, _summary, ("image", "seed"), init=_INITS[_name]
    )
