"""SST Binary (Socher et al. 2013) from the official PTB-format trees, encoded for a Tree-LSTM.

Layout read (``calibtune data fetch sst`` unpacks the official ``trainDevTestTrees_PTB.zip``,
whose top folder is ``trees/``)::

    <root>/trees/train.txt   8,544 trees, one per line: (4 (2 It) (4 (2 's) (4 great)))
    <root>/trees/dev.txt     1,101
    <root>/trees/test.txt    2,210
    <root>/glove.6B/glove.6B.300d.txt   (``calibtune data fetch glove6b``)

Every node carries a sentiment label 0–4; SST Binary keeps the sentences whose root is not
neutral (label 2) — 6,920 / 872 / 1,821 — and labels each by its root: 0 (0, 1: negative) or
1 (3, 4: positive). The official dev set is the validation set, so ``seed`` and
``val_fraction`` play no part (they are declared only because every dataset takes them).

Each tree is parsed once into one int64 ``(4, MAX_NODES)`` row (`encode_tree`): the leaves
first, left to right, then the internal nodes in post-order (children before parents, the
root last), and per node its word id (leaves), its left and right child (internal nodes) and
its level (0 for a leaf, 1 + the higher child's level otherwise). A batch is just rows, so it
takes the resident device path of every in-memory set (`calibtune.training.DeviceBatches`),
and `calibtune.models.TreeLSTM` computes a whole batch level by level.

Words are lower-cased (GloVe 6B is) and ``-LRB-``/``-RRB-`` become ``(``/``)``; the
vocabulary is every word of the three files (as Tai et al.'s preprocessing builds it); a word
GloVe 6B has starts from its 300-d vector, any other from U(−0.05, 0.05) (Tai et al.'s
``sentiment/main``), drawn once from a fixed seed so that every trial starts from the same
table. The table travels with the splits (`SSTSplits.embeddings`) and the trial hands it to
the network (``model_inputs``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from ._common import DatasetNotFoundError, Splits, resolve_root
from ._glove import UNK, load_glove
from ._verify import check_stamp

__all__ = [
    "MAX_NODES",
    "MAX_WORDS",
    "SST_DIM",
    "SST_FILES",
    "SST_FOLDER",
    "SST_URL",
    "EncodedTree",
    "SSTSplits",
    "encode_tree",
    "load_sst_splits",
    "parse_tree",
    "read_sst",
]

SST_URL = "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
SST_FOLDER = "trees"
SST_FILES = ("train.txt", "dev.txt", "test.txt")
#: longest sentence a row holds (SST's longest has 56 tokens)
MAX_WORDS = 64
#: nodes of a full binary tree over MAX_WORDS leaves
MAX_NODES = 2 * MAX_WORDS - 1
#: GloVe 6B vectors used (Mukhoti et al. and Tai et al. used 300-d GloVe 840B; see docs/data.md)
SST_DIM = 300
#: rows of an encoded tree: word id, left child, right child, level (-1: none / padding)
WORD, LEFT, RIGHT, LEVEL = range(4)
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_ESCAPES = {"-lrb-": "(", "-rrb-": ")"}
_OOV_SEED = 20130000  # fixed: the table is data, the same for every trial


@dataclass(frozen=True)
class EncodedTree:
    """A parsed binary tree: ``words`` (leaves, left to right), ``labels`` per node (0–4),
    ``children`` per internal node (``(left, right)`` node ids); node ids as in the module
    docstring (leaves 0…n−1, then internal nodes in post-order, the root last)."""

    words: tuple[str, ...]
    labels: tuple[int, ...]
    children: tuple[tuple[int, int], ...]

    @property
    def root_label(self) -> int:
        return self.labels[-1]


def parse_tree(line: str, where: str = "tree") -> EncodedTree:
    """Parse one PTB-format SST line: ``(label word)`` for a leaf, ``(label left right)`` for
    an internal node, labels 0–4. Anything else (a unary or ternary node, a missing bracket,
    text after the tree) raises ``ValueError`` naming ``where``.

    >>> t = parse_tree("(3 (2 It) (4 (2 's) (4 great)))")
    >>> t.words, t.children, t.root_label
    (('it', "'s", 'great'), ((1, 2), (0, 3)), 3)
    """
    tokens = _TOKEN.findall(line)
    words: list[str] = []
    leaf_labels: list[int] = []
    inner: list[tuple[int, int, int]] = []  # (label, left, right) with provisional child ids
    pos = 0

    def bad(why: str) -> ValueError:
        return ValueError(
            f"sst: {where}: expected a binary PTB tree '(label word)' / '(label left right)' "
            f"with labels 0-4, got {why}: {line.strip()[:80]!r}"
        )

    def node() -> int:
        # provisional ids: leaves >= 0, internal nodes ~k (k-th in post-order)
        nonlocal pos
        if tokens[pos : pos + 1] != ["("] or pos + 2 >= len(tokens):
            raise bad(f"{tokens[pos] if pos < len(tokens) else 'the end'!r} at token {pos}")
        label = tokens[pos + 1]
        if label not in ("0", "1", "2", "3", "4"):
            raise bad(f"label {label!r}")
        pos += 2
        if tokens[pos] not in ("(", ")"):  # a leaf: (label word)
            word = tokens[pos].lower()
            words.append(_ESCAPES.get(word, word))
            leaf_labels.append(int(label))
            pos += 1
            kids: list[int] = [len(words) - 1]
        else:
            kids = []
            while pos < len(tokens) and tokens[pos] == "(":
                kids.append(node())
            if len(kids) != 2:
                raise bad(f"a node with {len(kids)} children")
            inner.append((int(label), kids[0], kids[1]))
            kids = [~(len(inner) - 1)]
        if tokens[pos : pos + 1] != [")"]:
            raise bad("a missing ')'")
        pos += 1
        return kids[0]

    if not tokens:
        raise bad("an empty line")
    try:
        node()
    except RecursionError:
        raise bad("a tree nested too deeply") from None
    if pos != len(tokens):
        raise bad("text after the tree")
    n = len(words)

    def final(k: int) -> int:
        return k if k >= 0 else n + ~k

    children = tuple((final(a), final(b)) for _, a, b in inner)
    return EncodedTree(tuple(words), (*leaf_labels, *(lab for lab, _, _ in inner)), children)


def encode_tree(tree: EncodedTree, word_ids: Sequence[int]) -> np.ndarray:
    """The int64 ``(4, MAX_NODES)`` row of ``tree`` whose leaves have ids ``word_ids``:
    rows ``WORD`` (leaf word ids; 0 elsewhere), ``LEFT`` and ``RIGHT`` (child node ids of
    internal nodes; −1 elsewhere) and ``LEVEL`` (0 leaf, 1 + max(children's) internal, −1
    padding). A tree of more than ``MAX_WORDS`` leaves raises ``ValueError``.

    >>> encode_tree(parse_tree("(3 (2 a) (4 b))"), [5, 6])[:, :4].tolist()
    [[5, 6, 0, 0], [-1, -1, 0, -1], [-1, -1, 1, -1], [0, 0, 1, -1]]
    """
    n = len(tree.words)
    if n > MAX_WORDS:
        raise ValueError(f"sst: a sentence of {n} tokens; expected at most {MAX_WORDS}")
    row = np.full((4, MAX_NODES), -1, dtype=np.int64)
    row[WORD] = 0
    row[WORD, :n] = word_ids
    row[LEVEL, :n] = 0
    for k, (a, b) in enumerate(tree.children):
        row[LEFT, n + k], row[RIGHT, n + k] = a, b
        row[LEVEL, n + k] = 1 + max(row[LEVEL, a], row[LEVEL, b])
    return row


def _missing(folder: Path, what: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"sst: dataset files not found: expected {folder}/ with {', '.join(SST_FILES)} "
        f"(missing: {what}); run `calibtune data fetch sst glove6b --root {folder.parent}` "
        f"(or get the official trainDevTestTrees_PTB.zip from {SST_URL} and extract it into "
        f"{folder.parent})"
    )


def read_sst(root: str | Path | None) -> dict[str, list[EncodedTree]]:
    """Every tree of ``train``, ``dev`` and ``test`` (all five classes, neutral included),
    parsed (`parse_tree`), after checking the layout and the fetch stamp."""
    folder = resolve_root(root, "sst") / SST_FOLDER
    for name in SST_FILES:
        if not (folder / name).is_file():
            raise _missing(folder, name)
    check_stamp(folder.parent, "sst", [f"{SST_FOLDER}/{name}" for name in SST_FILES])
    out: dict[str, list[EncodedTree]] = {}
    for name in SST_FILES:
        path = folder / name
        lines = path.read_text(encoding="utf-8").splitlines()
        out[name.removesuffix(".txt")] = [
            parse_tree(line, f"{path}:{i}") for i, line in enumerate(lines, 1) if line.strip()
        ]
    return out


def _embedding_table(
    root: str | Path | None, vocab: list[str]
) -> tuple[dict[str, int], Tensor, int]:
    """``(word -> row, float32 table, words found in GloVe)``: GloVe 6B rows for the words it
    has, then one U(−0.05, 0.05) row per other word (rows 0 and 1: padding and unknown)."""
    index, vectors = load_glove(root, SST_DIM, vocab)
    found = len(index)
    missing = [w for w in vocab if w not in index]
    rng = np.random.default_rng(_OOV_SEED)
    extra = rng.uniform(-0.05, 0.05, size=(len(missing), SST_DIM)).astype(np.float32)
    start = vectors.shape[0]
    index.update({w: start + i for i, w in enumerate(missing)})
    return index, torch.cat([vectors, torch.from_numpy(extra)]), found


@dataclass(frozen=True)
class SSTSplits(Splits):
    """`Splits` of SST Binary plus the word-vector table the network starts from:
    ``embeddings`` float32 ``(V, 300)`` (row 0 padding, row 1 unknown), ``vocab`` the word →
    row map, ``glove_found`` how many words had a GloVe vector."""

    embeddings: Tensor | None = None
    vocab: dict[str, int] | None = None
    glove_found: int = 0

    def model_inputs(self) -> dict[str, Tensor]:
        """Model parameters that come from the data (`calibtune.models.TreeLSTM`)."""
        return {"embeddings": self.embeddings}


def load_sst_splits(root: str | Path | None, seed: int, val_fraction: float) -> SSTSplits:
    """SST Binary: official train/dev/test minus neutral roots (6,920/872/1,821 with the
    official files); ``seed`` and ``val_fraction`` are unused (the split is official)."""
    del seed, val_fraction
    trees = read_sst(root)
    vocab = sorted({w for split in trees.values() for t in split for w in t.words})
    index, table, found = _embedding_table(root, vocab)

    def split(name: str) -> TensorDataset:
        kept = [t for t in trees[name] if t.root_label != 2]
        rows = [encode_tree(t, [index.get(w, UNK) for w in t.words]) for t in kept]
        x = torch.from_numpy(np.stack(rows)) if rows else torch.empty(0, 4, MAX_NODES).long()
        y = torch.tensor([int(t.root_label > 2) for t in kept], dtype=torch.int64)
        return TensorDataset(x, y)

    return SSTSplits(
        name="sst",
        train=split("train"),
        val=split("dev"),
        test=split("test"),
        num_classes=2,
        input_shape=(4, MAX_NODES),
        mean=(0.0,),
        std=(1.0,),
        augment=None,
        embeddings=table,
        vocab=index,
        glove_found=found,
    )
