"""`calibtune data fetch` and `calibtune data verify`: the data sets the studies read, with
pinned checksums (docs/data.md).
"""

from __future__ import annotations

import argparse
import sys

from calibtune._usage import UsageError
from calibtune.commands._table import DATA_SETS, PREPARED_SETS
from calibtune.data import FetchError, fetch, verify_set

__all__ = ["fetch_sets", "verify_sets"]


def _names(names: list[str], prepared: bool = False) -> list[str]:
    known = DATA_SETS + PREPARED_SETS if prepared else DATA_SETS
    unknown = [n for n in names if n not in known]
    if unknown and unknown[0] in PREPARED_SETS:
        raise UsageError(
            f"NAME: {unknown[0]} cannot be downloaded by calibtune (its terms need an account at "
            f"image-net.org): prepare the folder as docs/data.md says (Preparing ImageNet) and "
            f"check it with `calibtune data verify {unknown[0]} --root DIR`"
        )
    if unknown:
        raise UsageError(f"NAME: expected one of {', '.join(known)}, got {unknown[0]!r}")
    return list(dict.fromkeys(names))


def fetch_sets(args: argparse.Namespace) -> int:
    for name in _names(args.names):
        try:
            done = fetch(name, args.root, mirror=args.mirror, stream=sys.stderr)
        except FetchError as e:
            raise UsageError(str(e)) from None
        print(done.line(), flush=True)
    return 0


def verify_sets(args: argparse.Namespace) -> int:
    names = _names(args.names, prepared=True) if args.names else list(DATA_SETS)
    bad = 0
    for name in names:
        check = verify_set(name, args.root, full=not args.quick)
        print(check.line(), flush=True)
        # a missing set fails only when asked for by name
        bad += check.status == "failed" or (check.status == "missing" and bool(args.names))
    return 2 if bad else 0
