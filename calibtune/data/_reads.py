"""Which fetched sets a trial reads, and the stamp check of all of them before Ray starts."""

from __future__ import annotations

from collections.abc import Sequence

from ._ood import default_ood
from ._shift import default_shift, get_shift
from ._sources import FETCH_SETS
from ._verify import check_stamp

__all__ = ["check_fetched", "sets_read_by"]

#: sets read through another set's files (the generated CIFAR-10-C reads CIFAR-10's test set)
_READS = {"cifar10c_generated": "cifar10"}
#: sets a dataset reads beside its own files (text sets: the GloVe vectors they start from)
_ALSO_READS: dict[str, tuple[str, ...]] = {"sst": ("glove6b",), "20newsgroups": ("glove6b",)}


def sets_read_by(
    dataset: str, ood: Sequence[str] | None = None, shift: Sequence[str] | None = None
) -> list[str]:
    """The `FETCH_SETS` names a trial of ``dataset`` with OOD sets ``ood`` and shift sets
    ``shift`` reads (None: the dataset's defaults, as in a trial config).

    >>> sets_read_by("cifar10")
    ['cifar10', 'svhn', 'cifar10c']
    >>> sets_read_by("digits")
    []
    """
    ood = default_ood(dataset) if ood is None else ood
    shift = default_shift(dataset) if shift is None else shift
    names = [dataset, *_ALSO_READS.get(dataset, ()), *ood, *(get_shift(s).ood for s in shift)]
    return [n for n in dict.fromkeys(_READS.get(n, n) for n in names) if n in FETCH_SETS]


def check_fetched(
    dataset: str,
    root: object,
    ood: Sequence[str] | None = None,
    shift: Sequence[str] | None = None,
) -> None:
    """`check_stamp` for every set a trial reads (`sets_read_by`): one ``os.stat`` per fetched
    file, so ``calibtune train`` can refuse a changed file before Ray starts."""
    for name in sets_read_by(dataset, ood, shift):
        check_stamp(root, name)
