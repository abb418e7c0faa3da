"""GloVe 6B word vectors (Pennington, Socher & Manning 2014) from the official text files.

Layout read (``calibtune data fetch glove6b`` unpacks the official ``glove.6B.zip``, whose four
files lie at the top of the archive, into a ``glove.6B`` folder)::

    <root>/glove.6B/glove.6B.<dim>d.txt      dim in 50, 100, 200, 300; 400,000 lines each

Each line is ``<word> <v_1> ... <v_dim>`` (single spaces, UTF-8, lower-cased words, no word
twice). `load_glove` returns a word → row index and the float32 table, with two rows of its
own in front (`PAD` = 0 and `UNK` = 1, both zero vectors — as in the Keras/MMCE text pipeline,
where a word without a GloVe vector embeds to zeros).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ._common import DatasetNotFoundError, resolve_root
from ._verify import check_stamp

__all__ = ["GLOVE_DIMS", "GLOVE_FOLDER", "GLOVE_URL", "PAD", "UNK", "glove_file", "load_glove"]

GLOVE_URL = "https://nlp.stanford.edu/data/glove.6B.zip"
#: the folder ``calibtune data fetch glove6b`` unpacks the (folder-less) archive into
GLOVE_FOLDER = "glove.6B"
#: the vector sizes glove.6B.zip ships
GLOVE_DIMS = (50, 100, 200, 300)
#: row of the padding token (a zero vector; never in the returned word index)
PAD = 0
#: row of every word without a row of its own (a zero vector; never in the word index)
UNK = 1


def glove_file(root: str | os.PathLike[str] | None, dim: int = 100) -> Path:
    """Path of ``glove.6B.<dim>d.txt`` under ``root`` (None: ``./data``); ``ValueError`` for a
    ``dim`` glove.6B.zip does not ship.

    >>> glove_file("/data").as_posix()
    '/data/glove.6B/glove.6B.100d.txt'
    """
    if isinstance(dim, bool) or dim not in GLOVE_DIMS:
        raise ValueError(f"glove6b: dim: expected one of {GLOVE_DIMS}, got {dim!r}")
    return resolve_root(root, "glove6b") / GLOVE_FOLDER / f"glove.6B.{dim}d.txt"


def _parse(path: Path, dim: int, wanted: set[str] | None) -> dict[str, np.ndarray]:
    """``word -> vector`` for the lines of ``path`` whose word is ``wanted`` (None: all);
    the first line of a word wins."""
    found: dict[str, np.ndarray] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            # split from the right: the vector is the last ``dim`` fields, whatever the word holds
            fields = line.rstrip("\n").rsplit(" ", dim)
            word = fields[0]
            if (wanted is not None and word not in wanted) or word in found:
                continue
            try:
                vector = np.asarray(fields[1:], dtype=np.float32)
            except ValueError:
                vector = np.empty(0, dtype=np.float32)
            if len(fields) != dim + 1 or vector.shape != (dim,) or not word:
                raise ValueError(
                    f"glove6b: {path}:{lineno}: expected '<word>' and {dim} numbers separated by "
                    f"single spaces, got {line[:80]!r}"
                )
            found[word] = vector
    return found


def load_glove(
    root: str | os.PathLike[str] | None,
    dim: int = 100,
    vocab: Sequence[str] | None = None,
) -> tuple[dict[str, int], torch.Tensor]:
    """Read ``<root>/glove.6B/glove.6B.<dim>d.txt``: ``(index, vectors)``.

    ``vectors`` is float32 ``(2 + n, dim)``: row `PAD` (0) and row `UNK` (1) are zeros; the
    ``n`` words follow in order, ``index[word]`` being their row (2 … n+1). With ``vocab=None``
    every word of the file gets a row, in file order (n = 400,000, 160 MB at dim 100). With a
    ``vocab``, only the words of ``vocab`` that GloVe has get a row, in ``vocab`` order
    (repeats counted once); the others are absent from ``index`` and a caller maps them to
    `UNK`. Words are matched exactly (GloVe 6B is lower-cased: lower-case the text first).

    Missing file: `DatasetNotFoundError` naming the path and the fetch command; a file changed
    since ``calibtune data fetch`` recorded it: ``DataVerificationError``; a malformed line:
    ``ValueError`` naming the file and line. Never downloads.
    """
    path = glove_file(root, dim)
    if not path.is_file():
        raise DatasetNotFoundError(
            f"glove6b: word vectors not found: expected {path}; run `calibtune data fetch "
            f"glove6b --root {path.parent.parent}` (or unzip the official glove.6B.zip from "
            f"{GLOVE_URL} into {path.parent})"
        )
    check_stamp(path.parent.parent, "glove6b", [f"{GLOVE_FOLDER}/{path.name}"])
    words = None if vocab is None else list(dict.fromkeys(vocab))
    found = _parse(path, dim, None if words is None else set(words))
    order = list(found) if words is None else [w for w in words if w in found]
    table = np.zeros((2 + len(order), dim), dtype=np.float32)
    if order:
        table[2:] = np.stack([found[w] for w in order])
    return {w: i for i, w in enumerate(order, start=2)}, torch.from_numpy(table)
