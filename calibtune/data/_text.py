"""20 Newsgroups (the original 19,997-document ``20news-19997`` collection) as the MMCE code
reads it, with GloVe 6B 100d vectors.

Layout read (``calibtune data fetch 20newsgroups glove6b``)::

    <root>/20_newsgroups/<group>/<number>       20 folders, 19,997 files (latin-1 text)
    <root>/glove.6B/glove.6B.100d.txt

The pipeline is that of the MMCE repository's ``20ng_mmce.py`` (Kumar et al. 2018, itself the
Keras "pre-trained word embeddings" example), which Mukhoti et al. 2020 and Ghosh et al. 2022
adapted: groups in sorted order (class id = rank), files with all-digit names in sorted (string)
order, read as latin-1, the header cut at the first blank line (``t[t.find("\\n\\n"):]`` when
that index is > 0); Keras ``Tokenizer`` tokens (`tokenize`); a vocabulary of the 19,999 most
frequent words of all 19,997 documents (`build_vocabulary`; other words are dropped, not mapped
to an unknown token); each document's last 1,000 tokens (Keras ``pad_sequences``: padding and
truncation at the front). Test set: ``int(0.2 · 19,997) = 3,999`` documents; validation: 900
of the remaining 15,998 (``val_fraction`` 0.05626), both stratified (`stratified_holdout`); the
authors' shuffle was unseeded, so any fixed draw is theirs in distribution.

Each split is a `TokenDocuments`: int64 token ids right-aligned in ``(N, 1000)`` with their
lengths, and the frozen ``(20000, 100)`` GloVe table; batches on the trial's device are trimmed
to their longest document and embedded there (`calibtune.training.DeviceBatches`), giving the
model float ``(B, 100, T)`` inputs (``T <= 1000``; the global-pooling CNN pads back to the
authors' arithmetic, `calibtune.models.GlobalPoolCNN`).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from ._common import (
    DatasetNotFoundError,
    Splits,
    resolve_root,
    stratified_holdout,
    validation_count,
)
from ._glove import load_glove
from ._verify import check_stamp

__all__ = [
    "NEWSGROUPS_FOLDER",
    "NEWSGROUPS_URL",
    "TEST_SEED",
    "TokenDocuments",
    "build_vocabulary",
    "encode_documents",
    "load_newsgroups_splits",
    "read_newsgroups",
    "tokenize",
]

NEWSGROUPS_URL = "http://qwone.com/~jason/20Newsgroups/20news-19997.tar.gz"
NEWSGROUPS_FOLDER = "20_newsgroups"
MAX_WORDS = 20_000  # Keras Tokenizer(num_words=20000): ids 1..19,999
MAX_LENGTH = 1_000  # pad_sequences(maxlen=1000)
EMBEDDING_DIM = 100
TEST_FRACTION = 0.2  # the MMCE code's VALIDATION_SPLIT, which is its test set
#: seed of the test draw, fixed so that ``data.split_seed`` varies the validation set only
TEST_SEED = 0
#: Keras ``Tokenizer``'s default ``filters``: each becomes a space before splitting on spaces
_FILTERS = '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\t\n'
_TRANSLATE = str.maketrans(dict.fromkeys(_FILTERS, " "))


def tokenize(text: str) -> list[str]:
    """Keras ``text_to_word_sequence`` with its defaults: lower-case, every character of
    ``!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~``, tab and newline turned into a space, split on single
    spaces, empty strings dropped (other whitespace, e.g. ``\\r``, stays inside a token).

    >>> tokenize("Hello, World!\\nIt's 4.5\\r\\n")
    ['hello', 'world', "it's", '4', '5\\r']
    """
    return [t for t in text.lower().translate(_TRANSLATE).split(" ") if t]


def build_vocabulary(documents: Iterable[Sequence[str]], max_words: int = MAX_WORDS) -> list[str]:
    """The ``max_words - 1`` most frequent words, most frequent first, ties in order of first
    appearance (Keras ``fit_on_texts``: a stable sort of the counts); word ``i`` of the list
    has id ``i + 1`` (0 is padding).

    >>> build_vocabulary([["b", "a"], ["a", "c", "b"]], max_words=3)
    ['b', 'a']
    """
    counts: Counter[str] = Counter()
    for doc in documents:
        counts.update(doc)  # Counter keeps first-insertion order
    ranked = sorted(counts, key=counts.__getitem__, reverse=True)  # stable: ties keep order
    return ranked[: max_words - 1]


def encode_documents(
    documents: Sequence[Sequence[str]], vocabulary: Sequence[str], max_length: int = MAX_LENGTH
) -> tuple[Tensor, Tensor]:
    """``(tokens, lengths)``: int64 ``(N, max_length)`` ids (``vocabulary[i]`` → ``i + 1``,
    other words dropped), each document's last ``max_length`` ids right-aligned after zeros
    (Keras ``pad_sequences`` defaults), and int64 ``(N,)`` kept lengths.

    >>> tokens, lengths = encode_documents([["a", "x", "b"], ["b"] * 5], ["a", "b"], 3)
    >>> tokens.tolist(), lengths.tolist()
    ([[0, 1, 2], [2, 2, 2]], [2, 3])
    """
    index = {w: i for i, w in enumerate(vocabulary, start=1)}
    tokens = np.zeros((len(documents), max_length), dtype=np.int64)
    lengths = np.zeros(len(documents), dtype=np.int64)
    for row, doc in enumerate(documents):
        ids = [i for i in map(index.get, doc) if i is not None][-max_length:]
        if ids:
            tokens[row, max_length - len(ids) :] = ids
        lengths[row] = len(ids)
    return torch.from_numpy(tokens), torch.from_numpy(lengths)


class TokenDocuments(Dataset):
    """Documents as right-aligned token ids with a frozen embedding table.

    ``tokens``: int64 ``(N, L)``, document ``i`` in its last ``lengths[i]`` columns after
    zeros; ``lengths``: int64 ``(N,)`` on the CPU (a batch's width is read there, never from a
    device); ``labels``: int64 ``(N,)``; ``vectors``: float32 ``(V, D)``, row 0 the padding
    (zeros). ``x`` of a sample is ``vectors[tokens[i]].T``: float32 ``(D, L)``.
    `calibtune.training.DeviceBatches` keeps ``tokens`` and ``vectors`` on the device, cuts a
    batch to its longest document and embeds it there (`embed`).
    """

    def __init__(self, tokens: Tensor, lengths: Tensor, labels: Tensor, vectors: Tensor) -> None:
        n = tokens.shape[0]
        if tokens.dtype != torch.int64 or tokens.ndim != 2:
            raise ValueError(f"TokenDocuments: tokens: expected int64 (N, L), got {tokens.dtype}")
        if lengths.shape != (n,) or labels.shape != (n,):
            raise ValueError(
                f"TokenDocuments: lengths, labels: expected shape ({n},), got "
                f"{tuple(lengths.shape)} and {tuple(labels.shape)}"
            )
        self.tokens, self.lengths, self.vectors = tokens, lengths.cpu(), vectors
        self.labels = labels.to(torch.int64)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return embed(self.tokens[index : index + 1], self.vectors)[0], int(self.labels[index])

    def width(self, index: Tensor) -> int:
        """Columns a batch of rows ``index`` (CPU ids) needs: its longest document."""
        return int(self.lengths[index].max()) if index.numel() else 0

    def content_digest(self) -> str:
        """Digest of tokens, lengths, labels and vectors (`calibtune.data.dataset_digest`)."""
        h = hashlib.blake2b(digest_size=8)
        for t in (self.tokens, self.lengths, self.labels, self.vectors):
            t = t.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)};".encode())
            h.update(t.numpy().reshape(-1).view("uint8").data)
        return h.hexdigest()


def embed(tokens: Tensor, vectors: Tensor) -> Tensor:
    """``vectors[tokens]`` as float ``(B, D, T)`` (channels first, for ``Conv1d``)."""
    return torch.nn.functional.embedding(tokens, vectors).transpose(1, 2)


def _missing(folder: Path, what: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"20newsgroups: dataset files not found: expected {folder}/ with 20 group folders of "
        f"numbered files (missing: {what}); run `calibtune data fetch 20newsgroups glove6b "
        f"--root {folder.parent}` (or extract the official {NEWSGROUPS_URL} into {folder.parent})"
    )


def read_newsgroups(root: str | os.PathLike[str] | None) -> tuple[list[str], np.ndarray, list[str]]:
    """``(texts, labels, groups)`` in the MMCE code's order: sorted group folders, files with
    all-digit names in sorted (string) order, latin-1, header cut at the first blank line."""
    folder = resolve_root(root, "20newsgroups") / NEWSGROUPS_FOLDER
    if not folder.is_dir():
        raise _missing(folder, f"{NEWSGROUPS_FOLDER}/")
    groups = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if len(groups) < 2:
        raise _missing(folder, f"group folders (found {len(groups)})")
    check_stamp(folder.parent, "20newsgroups")
    texts: list[str] = []
    labels: list[int] = []
    for label, group in enumerate(groups):
        names = sorted(n for n in os.listdir(folder / group) if n.isdigit())
        if not names:
            raise _missing(folder, f"numbered files in {group}/")
        for name in names:
            t = (folder / group / name).read_text(encoding="latin-1")
            i = t.find("\n\n")  # skip the header, as the MMCE code does (keeps the blank line)
            texts.append(t[i:] if i > 0 else t)
            labels.append(label)
    return texts, np.asarray(labels, dtype=np.int64), groups


def load_newsgroups_splits(
    root: str | os.PathLike[str] | None, seed: int, val_fraction: float
) -> Splits:
    """Test ``int(0.2·N)`` (3,999) stratified with `TEST_SEED`; validation
    ``round(val_fraction · rest)`` (900 for 0.05626) stratified with ``seed``; the rest trains
    (15,098). Vocabulary and GloVe table as the MMCE code builds them (module docstring)."""
    texts, labels, groups = read_newsgroups(root)
    documents = [tokenize(t) for t in texts]
    vocabulary = build_vocabulary(documents)
    tokens, lengths = encode_documents(documents, vocabulary)
    index, glove = load_glove(root, EMBEDDING_DIM, vocabulary)
    vectors = torch.zeros(len(vocabulary) + 1, EMBEDDING_DIM)  # words without a vector: zeros
    rows = [i for i, w in enumerate(vocabulary, start=1) if w in index]
    vectors[rows] = glove[[index[vocabulary[r - 1]] for r in rows]]
    pool, test = stratified_holdout(labels, int(TEST_FRACTION * len(labels)), TEST_SEED)
    n_val = validation_count(val_fraction, len(pool), "20newsgroups")
    keep, hold = stratified_holdout(labels[pool], n_val, seed)

    def split(rows: np.ndarray) -> TokenDocuments:
        r = torch.from_numpy(rows)
        return TokenDocuments(tokens[r], lengths[r], torch.from_numpy(labels[rows]), vectors)

    return Splits(
        name="20newsgroups",
        train=split(pool[keep]),
        val=split(pool[hold]),
        test=split(test),
        num_classes=len(groups),
        input_shape=(EMBEDDING_DIM, MAX_LENGTH),
        mean=(0.0,),
        std=(1.0,),
        augment=None,
    )
