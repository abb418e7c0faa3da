"""Subcommands as data: each ``calibtune`` subcommand is a `Command` (help, arguments, and its
handler named as ``"module:function"``) in a table, and one function turns the table into argparse
sub-parsers. Parsing imports no handler: `handler` imports the chosen one's module when it runs,
so ``calibtune --help`` costs the table alone and each command pays only for what it uses.

Options shared by several subcommands (``--storage``, ``--tracking-uri``...) are `Arg` values
defined once and listed in each command that takes them.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Arg:
    """One ``add_argument(*flags, **options)`` call."""

    flags: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)

    def add_to(self, parser: Any) -> None:
        parser.add_argument(*self.flags, **self.options)


def arg(*flags: str, **options: Any) -> Arg:
    """`Arg` with argparse's own signature.

    >>> p = argparse.ArgumentParser()
    >>> arg("--top", type=int, default=1).add_to(p)
    >>> p.parse_args(["--top", "3"]).top
    3
    """
    return Arg(flags, options)


@dataclass(frozen=True)
class OneOf:
    """Mutually exclusive arguments (``--use-gpu`` / ``--no-use-gpu``)."""

    args: tuple[Arg, ...]

    def add_to(self, parser: Any) -> None:
        group = parser.add_mutually_exclusive_group()
        for a in self.args:
            a.add_to(group)


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line ``help``, its handler ``run`` (``"module:function"``: the
    function ``Namespace -> exit code``, imported when the command runs, `handler`), its
    arguments in order, and the longer ``description`` of its own ``--help``. ``one_shot``: it
    reads, prints and ends (compare, report, export), so it runs with the cyclic garbage
    collector paused (`calibtune._lazy.gc_paused`); never for a command that keeps running."""

    help: str
    run: str
    args: tuple[Arg | OneOf, ...] = ()
    description: str | None = None
    one_shot: bool = False


def add_commands(sub: Any, commands: Mapping[str, Command]) -> None:
    """One sub-parser per command of ``commands`` on ``sub`` (``add_subparsers()``'s result);
    the parsed namespace's ``func`` is the command's handler."""
    for name, c in commands.items():
        p = sub.add_parser(name, help=c.help, description=c.description)
        for a in c.args:
            a.add_to(p)
        p.set_defaults(func=c.run)


@dataclass(frozen=True)
class Actions:
    """Nested subcommands (``calibtune data fetch``), each a `Command` with its own arguments
    and handler (which replaces the parent's)."""

    actions: Mapping[str, Command]

    def add_to(self, parser: Any) -> None:
        add_commands(
            parser.add_subparsers(dest="action", metavar="ACTION", required=True), self.actions
        )


def handler(ref: str) -> Callable[[argparse.Namespace], int]:
    """The function ``ref`` (``"module:function"``) names, its module imported now.

    >>> handler("json:dumps")([1])
    '[1]'
    """
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)
