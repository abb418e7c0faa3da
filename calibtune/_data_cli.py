"""``calibtune data fetch`` / ``calibtune data verify`` (argument parsing only; the work is in
`calibtune.data`, imported by the handlers so that ``--help`` stays free of torch)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from calibtune._commands import Command, arg
from calibtune._usage import UsageError

__all__ = ["DATA", "DATA_SETS"]

#: the names ``calibtune data`` takes, as in `calibtune.data.FETCH_SETS` (a test keeps them equal;
#: listed here so that parsing imports nothing heavy)
DATA_SETS = (
    "cifar10",
    "cifar100",
    "svhn",
    "cifar10c",
    "cifar100c",
    "tiny_imagenet",
    "sst",
    "glove6b",
    "20newsgroups",
)
#: sets the user prepares (`calibtune.data.PREPARED_SETS`): ``verify`` checks them by name only
PREPARED_SETS = ("imagenet",)


@dataclass(frozen=True)
class _Actions:
    """Nested sub-commands (``calibtune data fetch``), each with its own arguments."""

    actions: Mapping[str, Command]

    def add_to(self, parser: Any) -> None:
        sub = parser.add_subparsers(dest="data_action", metavar="ACTION", required=True)
        for name, c in self.actions.items():
            p = sub.add_parser(name, help=c.help, description=c.description)
            for a in c.args:
                a.add_to(p)
            p.set_defaults(data_run=c.run)


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


def _fetch(args: argparse.Namespace) -> int:
    from calibtune.data import FetchError, fetch

    for name in _names(args.names):
        try:
            done = fetch(name, args.root, mirror=args.mirror, stream=sys.stderr)
        except FetchError as e:
            raise UsageError(str(e)) from None
        print(done.line(), flush=True)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from calibtune.data import verify_set

    names = _names(args.names, prepared=True) if args.names else list(DATA_SETS)
    bad = 0
    for name in names:
        check = verify_set(name, args.root, full=not args.quick)
        print(check.line(), flush=True)
        # a missing set fails only when asked for by name
        bad += check.status == "failed" or (check.status == "missing" and bool(args.names))
    return 2 if bad else 0


_ROOT = arg("--root", metavar="DIR", help="data root (default: ./data, as a config's data.root)")
_SETS_HELP = f"data set: {', '.join(DATA_SETS)}"

DATA = Command(
    "fetch and verify the data sets (CIFAR-10/100, SVHN, CIFAR-10-C/100-C, Tiny-ImageNet)",
    lambda args: args.data_run(args),
    (
        _Actions(
            {
                "fetch": Command(
                    "download, check and unpack data sets into the data root",
                    _fetch,
                    (
                        arg("names", nargs="+", metavar="NAME", help=_SETS_HELP),
                        _ROOT,
                        arg(
                            "--mirror",
                            metavar="URL",
                            help="a lab mirror serving the official file names (default: "
                            "$CALIBTUNE_DATA_MIRROR, else the official hosts); checksums apply",
                        ),
                    ),
                    "Download each set from its official URL (or --mirror), check the "
                    "published MD5, unpack it safely into the layout calibtune reads and record "
                    "a stamp; a set already fetched is skipped, a partial download resumed, and "
                    "concurrent fetches into one root download each file once. See "
                    "docs/data.md.",
                ),
                "verify": Command(
                    "check data sets against their published checksums or fetch record",
                    _verify,
                    (
                        arg(
                            "names",
                            nargs="*",
                            metavar="NAME",
                            help=f"{_SETS_HELP}, or {', '.join(PREPARED_SETS)} (a prepared "
                            "folder: its layout and file headers; by name only) (default: every "
                            "set above)",
                        ),
                        _ROOT,
                        arg(
                            "--quick",
                            action="store_true",
                            help="compare sizes and mtimes with the fetch record, re-hash only "
                            "changed files (what runs do)",
                        ),
                    ),
                    "One line per set: ok, missing, failed or unverified. Files with a fetch "
                    "record are re-hashed against it; files placed by hand are hashed against "
                    "the published checksums and, when they match, recorded. Exit code 2 if a "
                    "set fails (or a named set is missing).",
                ),
            }
        ),
    ),
    "Fetch the data sets the studies read, with pinned checksums (docs/data.md).",
)
