"""Model zoo: ``build_model(name, num_classes, input_shape) -> nn.Module`` returning logits.

Registered names (``list_models()``): the seeds' 32×32 networks ``resnet50``, ``resnet110``
(He et al.'s CIFAR ResNet-110), ``resnet110_bottleneck`` (the seeds' code's "ResNet-110"),
``wide_resnet26_10``, ``densenet121``; ``resnet50_tiny`` for 64×64 Tiny-ImageNet; and the small
``mlp``, ``small_cnn`` and ``cnn1d`` for the embedded datasets. Each network is initialised
as its authors' code does (``model_init(name)``; ``build_model(..., init=...)`` overrides).
See docs/models.md.
"""

from ._init import INIT_SCHEMES, ModelInit, init_weights
from ._resnet import CifarResNet
from ._small import MLP, CNN1d, SmallCNN
from ._zoo import MODELS, build_model, count_parameters, list_models, model_init

__all__ = [
    "INIT_SCHEMES",
    "MLP",
    "MODELS",
    "CNN1d",
    "CifarResNet",
    "ModelInit",
    "SmallCNN",
    "build_model",
    "count_parameters",
    "init_weights",
    "list_models",
    "model_init",
]
