"""The global-pooling CNN over word vectors of the 20 Newsgroups studies (MMCE's ``model``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._registry import Param
from ._zoo import add_model, check_signal_shape

__all__ = ["GlobalPoolCNN"]


class GlobalPoolCNN(nn.Module):
    """Three ``Conv1d(·, channels, kernel)`` + ReLU with ``MaxPool1d(kernel, stride 1)`` between
    them (all 'valid'), a global max over time (Lin et al. 2014's global pooling), then
    ``Linear(channels, hidden)`` + ReLU, dropout, ``Linear(hidden, K)``: the network of the MMCE
    repository's ``20ng_mmce.py`` (Kumar et al. 2018) that Mukhoti et al. 2020 and Ghosh et al.
    2022 ported to PyTorch (its softmax left out: this returns logits).

    ``(B, C, T) -> (B, K)`` for word vectors ``C`` = ``input_shape[0]`` and ``T <= L`` =
    ``input_shape[1]`` (the authors' fixed length, 1,000). Batches come cut to their longest
    document (zeros in front, `calibtune.data.TokenDocuments`); ``forward`` first pads zeros in
    front up to ``min(T + r, L)`` columns, ``r`` = the receptive field (21), so every document
    meets the same windows as in the authors' full-length input: each output column sees ``r``
    inputs, and a document with at least ``r`` zeros before it (there: ``L − len ≥ r``) sees
    every mix of zeros and its own tokens, including all-zero windows. The logits of a document
    are therefore those of the authors' ``L``-column input, whatever batch it is in.
    """

    def __init__(
        self,
        in_channels: int,
        length: int,
        num_classes: int,
        channels: int,
        kernel: int,
        hidden: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.length = length
        self.field = 5 * (kernel - 1) + 1  # 3 convolutions and 2 pools, stride 1
        if length < self.field:
            raise ValueError(
                f"global_pool_cnn: input_shape: expected a length >= {self.field} (the receptive "
                f"field of kernel {kernel}), got {length}"
            )
        self.features = nn.Sequential(
            nn.Conv1d(in_channels, channels, kernel),
            nn.ReLU(),
            nn.MaxPool1d(kernel, stride=1),
            nn.Conv1d(channels, channels, kernel),
            nn.ReLU(),
            nn.MaxPool1d(kernel, stride=1),
            nn.Conv1d(channels, channels, kernel),
            nn.ReLU(),
        )
        self.head = nn.Sequential(
            nn.Linear(channels, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[-1]
        if t > self.length:
            raise ValueError(
                f"global_pool_cnn: expected at most {self.length} columns, got {tuple(x.shape)}"
            )
        x = nn.functional.pad(x, (min(t + self.field, self.length) - t, 0))
        return self.head(torch.amax(self.features(x), dim=-1))


def _build(shape: Sequence[int], num_classes: int, **p: object) -> nn.Module:
    return GlobalPoolCNN(shape[0], shape[1], num_classes, **p)  # type: ignore[arg-type]


add_model(
    "global_pool_cnn",
    _build,
    check_signal_shape,
    (100, 1000),
    "global-pooling CNN over word vectors (MMCE's 20 Newsgroups network): 3×Conv1d(128, 5), "
    "global max, 128-unit ReLU layer, dropout 0.3",
    ("text", "cnn"),
    [
        Param("channels", 128, kind="int", low=1, searchable=False, doc="filters per conv"),
        Param("kernel", 5, kind="int", low=2, searchable=False, doc="conv and pool width"),
        Param("hidden", 128, kind="int", low=1, searchable=False, doc="units of the ReLU layer"),
        Param(
            "dropout",
            0.3,
            low=0.0,
            high=1.0,
            high_open=True,
            searchable=False,
            doc="dropout before the output layer (MMCE: keep_prob 0.7)",
        ),
    ],
)
