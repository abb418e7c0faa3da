"""Command line: ``calibtune <subcommand>`` — argument parsing and dispatch only.

The subcommands, their arguments and handlers are the table `calibtune.commands.COMMANDS`; the
chosen command's handler module is imported when it runs (`calibtune._commands.handler`), so
``--help`` imports nothing heavy. Bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from calibtune._commands import add_commands, handler
from calibtune._lazy import exit_without_teardown, gc_paused
from calibtune._usage import UsageError
from calibtune.cluster import quiet_output
from calibtune.commands import COMMANDS

__all__ = ["SUBCOMMANDS", "build_parser", "command", "main"]

#: every subcommand, in ``calibtune --help`` order
SUBCOMMANDS = COMMANDS


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block): ``calibtune ui: error: argument --port:
    expected a port 1-65535, got '99999'`` and exit code 2, like every other bad input."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="calibtune",
        description="Calibration-aware training and hyperparameter studies on Ray.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_commands(sub, SUBCOMMANDS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the subcommand's parser: "calibtune run: error: unrecognized ..."
        sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "verbose", True) is False:
        # the quiet terminal before the handler's imports: MLflow and Ray read it on import
        quiet_output()
    # only where this process is the command (argv from the command line): `gc_paused` keeps the
    # block's cyclic garbage until exit, which a longer-lived caller of `main([...])` would not want
    one_shot = SUBCOMMANDS[args.command].one_shot and argv is None
    try:
        with gc_paused() if one_shot else contextlib.nullcontext():
            return int(handler(args.func)(args))
    except UsageError as e:
        print(f"calibtune {args.command}: error: {e}".replace("\n", " "), file=sys.stderr)
        return 2


def command() -> None:
    """The ``calibtune`` executable and ``python -m calibtune``: `main` on the command line's
    arguments, then exit without the interpreter's teardown (`exit_without_teardown`). A Ray
    this process connected to or started is shut down first, directly: Ray's own exit hook
    pauses 0.5 s for worker logs still in flight, and every trial has ended by now."""
    code = main()
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
    exit_without_teardown(code)


if __name__ == "__main__":
    command()
