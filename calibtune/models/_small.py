"""Small models for the embedded datasets and fast tests; each trains in seconds on a CPU."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

from .._registry import Param
from ._zoo import add_model, check_any_shape, check_image_shape, check_signal_shape

__all__ = ["MLP", "CNN1d", "SmallCNN"]


class MLP(nn.Module):
    """Flatten, ``depth`` hidden layers ``Linear(·, hidden) + ReLU``, then ``Linear(hidden, K)``.

    ``(B, *input_shape) -> (B, K)``. The MNIST-1D paper's MLP is ``hidden=100, depth=2``."""

    def __init__(self, in_features: int, num_classes: int, hidden: int, depth: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """Three 3×3 conv-BN-ReLU blocks (``width``, ``2·width``, ``2·width`` channels; the last two
    with stride 2), global average pool, linear head. ``(B, C, H, W) -> (B, K)``; any H, W ≥ 1
    (8×8 digits reach 2×2 before the pool)."""

    def __init__(self, in_channels: int, num_classes: int, width: int) -> None:
        super().__init__()

        def block(c_in: int, c_out: int, stride: int) -> list[nn.Module]:
            conv = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
            return [conv, nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]

        self.features = nn.Sequential(
            *block(in_channels, width, 1),
            *block(width, 2 * width, 2),
            *block(2 * width, 2 * width, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


def _conv_out(length: int, kernel: int, stride: int, padding: int) -> int:
    return (length + 2 * padding - kernel) // stride + 1


class CNN1d(nn.Module):
    """The MNIST-1D paper's CNN (Greydanus & Kobak 2024): ``Conv1d(C, ch, 5, stride 2, pad 1)``,
    then two ``Conv1d(ch, ch, 3, stride 2, pad 1)``, ReLU after each, flatten, linear.
    ``(B, C, L) -> (B, K)``; L = 40 gives feature maps 19 → 10 → 5 (≈5.2k parameters)."""

    def __init__(self, in_channels: int, length: int, num_classes: int, channels: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(in_channels, channels, 5, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        out = _conv_out(_conv_out(_conv_out(length, 5, 2, 1), 3, 2, 1), 3, 2, 1)
        if out < 1:
            raise ValueError(f"cnn1d: input_shape: expected a length L >= 3, got L = {length}")
        self.fc = nn.Linear(channels * out, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


def _mlp(shape: Sequence[int], num_classes: int, hidden: int, depth: int) -> nn.Module:
    return MLP(math.prod(shape), num_classes, hidden, depth)


def _small_cnn(shape: Sequence[int], num_classes: int, width: int) -> nn.Module:
    return SmallCNN(shape[0], num_classes, width)


def _cnn1d(shape: Sequence[int], num_classes: int, channels: int) -> nn.Module:
    return CNN1d(shape[0], shape[1], num_classes, channels)


add_model(
    "mlp",
    _mlp,
    check_any_shape,
    (1, 8, 8),
    "multilayer perceptron on the flattened input (default 2×100 ReLU)",
    tags=("small",),
    extra=[
        Param("hidden", 100, kind="int", low=1, doc="units per hidden layer"),
        Param("depth", 2, kind="int", low=1, doc="number of hidden layers"),
    ],
)
add_model(
    "small_cnn",
    _small_cnn,
    check_image_shape,
    (1, 8, 8),
    "3-block conv-BN-ReLU network for small images (≈56k parameters at width 32)",
    tags=("small", "image"),
    extra=[Param("width", 32, kind="int", low=1, doc="channels of the first block")],
)
add_model(
    "cnn1d",
    _cnn1d,
    check_signal_shape,
    (1, 40),
    "the MNIST-1D paper's 3-layer 1-D CNN for (C, L) signals",
    tags=("small", "signal"),
    extra=[Param("channels", 25, kind="int", low=1, doc="channels of every conv layer")],
)
