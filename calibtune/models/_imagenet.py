"""ResNet-50 for 224×224 ImageNet: torchvision's standard network, stem and initialisation.

Unlike the 32×32 networks of ``_resnet`` (3×3 stride-1 stem, no max-pool), this is He et al.
(CVPR 2016)'s ImageNet ResNet-50 exactly as ``torchvision.models.resnet50(weights=None)``
builds it: 7×7 stride-2 stem convolution, 3×3 stride-2 max-pool, bottleneck stages 3-4-6-3,
global average pool, 2048→K linear layer (25,557,032 parameters for 1000 classes). torchvision
initialises it as the ``kaiming_normal_fan_out`` scheme says (convolutions N(0, 2/fan_out),
BatchNorm 1/0, the linear layer PyTorch's default), so `build_model` redraws nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ._init import ModelInit
from ._zoo import add_model, check_image_shape

__all__ = ["imagenet_resnet50"]


def imagenet_resnet50(shape: Sequence[int], num_classes: int) -> nn.Module:
    """torchvision's ResNet-50 (no pretrained weights) with ``shape[0]`` input channels."""
    from torchvision.models.resnet import Bottleneck, ResNet

    model = ResNet(Bottleneck, [3, 4, 6, 3], num_classes=num_classes)
    if shape[0] != 3:  # same stem and init, other input channels
        model.conv1 = nn.Conv2d(shape[0], 64, kernel_size=7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


add_model(
    "resnet50_imagenet",
    imagenet_resnet50,
    check_image_shape,
    (3, 224, 224),
    "torchvision's ImageNet ResNet-50 (7×7/2 stem, max-pool, bottleneck 3-4-6-3); "
    "25.6M parameters for 1000 classes",
    ("image",),
    init=ModelInit(
        "kaiming_normal_fan_out",
        "torchvision.models.resnet50 (He et al. CVPR 2016): its own init loop, kaiming_normal_ "
        "fan_out on convolutions; the AdaFocal ImageNet code is not public",
        built_with="kaiming_normal_fan_out",
    ),
)
