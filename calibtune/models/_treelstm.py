"""The binary (constituency) Tree-LSTM of Tai, Socher & Manning (ACL 2015), batched by level.

Cells as in the code Mukhoti et al. (2020) trained SST with (``treeLSTM/model.py`` of
torrvision/focal_calibration, ported from Tai et al.'s Lua): a leaf with word vector x has

    c = W_c x + b_c,   h = σ(W_o x + b_o) ⊙ tanh(c)

and an internal node with children (h_l, c_l), (h_r, c_r) has, for each gate g in
(i, f_l, f_r, u), g = U_g^l h_l + U_g^r h_r + b_g, and

    c = σ(i) ⊙ tanh(u) + σ(f_l) ⊙ c_l + σ(f_r) ⊙ c_r,   h = tanh(c)

(no output gate at internal nodes, as there). The root's h goes through dropout (p = 0.5, as
``SentimentModule(dropout=True)``) and a linear layer to the logits.

Input: the int64 ``(B, 4, N)`` rows of `calibtune.data.encode_tree` (word id, left child,
right child, level per node; −1 where none). One forward computes every leaf of the batch in
one call, then each level ℓ = 1, 2, … in one call over all nodes of that level in every tree
of the batch: the batch's nodes are sorted by level once, so a level is a contiguous slice of
the state table and its children's rows are gathered by index. The only host read is the
per-level node count (one small vector per batch), needed to slice; no Python loop over
sentences or nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._registry import Param
from ._init import ModelInit
from ._zoo import add_model

__all__ = ["TreeLSTM", "tree_shape"]

_WORD, _LEFT, _RIGHT, _LEVEL = range(4)


class TreeLSTM(nn.Module):
    """Binary Tree-LSTM classifier over encoded trees: ``(B, 4, N)`` int64 → ``(B, K)`` logits.

    ``embeddings``: float ``(V, D)`` initial word vectors (tuned with the network), or None for
    a ``vocab_size`` × ``embedding_dim`` table drawn N(0, 1) (``nn.Embedding``'s default).
    """

    def __init__(
        self,
        num_classes: int,
        hidden: int = 150,
        embedding_dim: int = 300,
        vocab_size: int = 100,
        dropout: float = 0.5,
        embeddings: Tensor | None = None,
    ) -> None:
        super().__init__()
        if embeddings is not None:
            if embeddings.ndim != 2 or embeddings.shape[0] < 2:
                raise ValueError(
                    f"treelstm: embeddings: expected a (V, D) table with V >= 2, "
                    f"got shape {tuple(embeddings.shape)}"
                )
            vocab_size, embedding_dim = embeddings.shape
        self.hidden = hidden
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        if embeddings is not None:
            with torch.no_grad():
                self.embedding.weight.copy_(embeddings)
        self.leaf = nn.Linear(embedding_dim, 2 * hidden)  # (W_c; W_o)
        self.compose_left = nn.Linear(hidden, 4 * hidden)  # U^l for (i, f_l, f_r, u)
        self.compose_right = nn.Linear(hidden, 4 * hidden)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(hidden, num_classes)  # registered last: the classifier head

    def leaf_cell(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(h, c)`` of leaves with word vectors ``x`` ``(n, D)``."""
        c, o = self.leaf(x).chunk(2, dim=1)
        return torch.sigmoid(o) * torch.tanh(c), c

    def node_cell(self, lh: Tensor, lc: Tensor, rh: Tensor, rc: Tensor) -> tuple[Tensor, Tensor]:
        """``(h, c)`` of internal nodes from their children's states (each ``(n, H)``)."""
        i, fl, fr, u = (self.compose_left(lh) + self.compose_right(rh)).chunk(4, dim=1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * lc + torch.sigmoid(fr) * rc
        return torch.tanh(c), c

    def root_states(self, x: Tensor) -> Tensor:
        """The root's h of every tree of ``x`` ``(B, 4, N)``: ``(B, H)``."""
        b, _, n = x.shape
        x = x.long()
        level = x[:, _LEVEL].reshape(-1)
        valid = level >= 0
        # sort the batch's nodes by level once: level ℓ is then one contiguous slice
        order = torch.argsort(torch.where(valid, level, n), stable=True)
        counts: list[int] = torch.bincount(level[valid], minlength=1).tolist()  # host read
        total = sum(counts)
        order = order[:total]
        pos = torch.full_like(level, -1)
        pos[order] = torch.arange(total, device=x.device)
        base = (torch.arange(b, device=x.device) * n).view(b, 1)
        left = (x[:, _LEFT] + base).reshape(-1)
        right = (x[:, _RIGHT] + base).reshape(-1)
        leaves = order[: counts[0]]
        h0, c0 = self.leaf_cell(self.embedding(x[:, _WORD].reshape(-1)[leaves]))
        h = h0.new_zeros(total, self.hidden)
        c = c0.new_zeros(total, self.hidden)
        h[: counts[0]], c[: counts[0]] = h0, c0
        start = counts[0]
        for count in counts[1:]:
            nodes = order[start : start + count]
            li, ri = pos[left[nodes]], pos[right[nodes]]
            hn, cn = self.node_cell(h[li], c[li], h[ri], c[ri])
            h[start : start + count], c[start : start + count] = hn, cn
            start += count
        roots = valid.view(b, n).sum(1) - 1 + base.view(b)  # the root is each row's last node
        return h[pos[roots]]

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.dropout(self.root_states(x)))


def tree_shape(input_shape: object, owner: str) -> tuple[int, ...]:
    """``(4, N)`` with N ≥ 1 (encoded trees), else ``ValueError``."""
    ok = isinstance(input_shape, Sequence) and not isinstance(input_shape, str)
    shape = tuple(input_shape) if ok else ()  # type: ignore[arg-type]
    if not (
        len(shape) == 2
        and shape[0] == 4
        and isinstance(shape[1], int)
        and not isinstance(shape[1], bool)
        and shape[1] >= 1
    ):
        raise ValueError(
            f"{owner}: input_shape: expected (4, N) encoded trees (calibtune.data.encode_tree), "
            f"got {input_shape!r}"
        )
    return shape


def _treelstm(
    shape: Sequence[int],
    num_classes: int,
    hidden: int,
    embedding_dim: int,
    vocab_size: int,
    dropout: float,
    embeddings: Tensor | None,
) -> nn.Module:
    return TreeLSTM(num_classes, hidden, embedding_dim, vocab_size, dropout, embeddings)


add_model(
    "treelstm",
    _treelstm,
    tree_shape,
    (4, 127),
    "binary (constituency) Tree-LSTM of Tai et al. 2015 over encoded SST trees, batched by "
    "tree level (hidden 150, 300-d tuned word vectors, dropout 0.5 before the head)",
    tags=("trees",),
    extra=[
        Param("hidden", 150, kind="int", low=1, doc="memory size of every cell (Mukhoti: 150)"),
        Param(
            "embedding_dim",
            300,
            kind="int",
            low=1,
            searchable=False,
            doc="word-vector size without `embeddings` (with them: their width)",
        ),
        Param(
            "vocab_size",
            100,
            kind="int",
            low=2,
            searchable=False,
            doc="rows of the word table without `embeddings` (with them: their rows)",
        ),
        Param("dropout", 0.5, low=0.0, high=1.0, high_open=True, doc="dropout before the head"),
        Param(
            "embeddings",
            None,
            kind="any",
            searchable=False,
            doc="initial (V, D) word vectors; a trial takes them from the data set",
        ),
    ],
    init=ModelInit(
        "torch_default",
        "torrvision/focal_calibration treeLSTM/model.py: no init code (PyTorch's defaults)",
        "torch_default",
    ),
)
