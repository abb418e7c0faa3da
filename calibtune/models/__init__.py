"""Model zoo: ``build_model(name, num_classes, input_shape) -> nn.Module`` returning logits.

Registered names (``list_models()``): the seeds' 32×32 networks ``resnet50``, ``resnet110``
(He et al.'s CIFAR ResNet-110), ``resnet110_bottleneck`` (the seeds' code's "ResNet-110"),
``wide_resnet26_10``, ``densenet121``; ``resnet50_tiny`` for 64×64 Tiny-ImageNet;
``resnet50_imagenet`` (torchvision's 224×224 ResNet-50) for ImageNet; and the small
``mlp``, ``small_cnn`` and ``cnn1d`` for the embedded datasets;
``treelstm`` (Tai et al.'s binary Tree-LSTM, batched by tree level) for SST;
``global_pool_cnn`` (MMCE's global-pooling CNN over word vectors) for 20 Newsgroups.
Each network is initialised
as its authors' code does (``model_init(name)``; ``build_model(..., init=...)`` overrides).
See docs/models.md.
"""

from ._imagenet import imagenet_resnet50
from ._init import INIT_SCHEMES, ModelInit, init_weights
from ._resnet import CifarResNet
from ._small import MLP, CNN1d, SmallCNN
from ._text import GlobalPoolCNN
from ._treelstm import TreeLSTM
from ._zoo import MODELS, build_model, count_parameters, list_models, model_init

__all__ = [
    "INIT_SCHEMES",
    "MLP",
    "MODELS",
    "CNN1d",
    "CifarResNet",
    "GlobalPoolCNN",
    "ModelInit",
    "SmallCNN",
    "TreeLSTM",
    "build_model",
    "count_parameters",
    "imagenet_resnet50",
    "init_weights",
    "list_models",
    "model_init",
]
