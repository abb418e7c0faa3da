"""Bad input on the command line: one line on stderr, exit code 2 (shared by every command)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import yaml

__all__ = ["UsageError", "bad_input_message", "usage"]


class UsageError(Exception):
    """Bad input: reported as one line on stderr with exit code 2."""


def bad_input_message(exc: BaseException, path: str | os.PathLike[str] | None = None) -> str | None:
    """One line for an exception that bad input raises (a rejected value, a missing, unreadable
    or misplaced file, bytes that are not UTF-8, YAML that does not parse), else None.

    ``path`` names the file being read when the exception does not (UnicodeDecodeError)."""
    name = getattr(exc, "filename", None) or path or "input"
    if isinstance(exc, UnicodeDecodeError):
        return f"{name}: expected UTF-8 text, got a byte it cannot decode at offset {exc.start}"
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{name}: expected a file or folder, found nothing at that path"
    if isinstance(exc, (ValueError, FileNotFoundError)):
        return " ".join(str(exc).split())
    if isinstance(exc, IsADirectoryError):
        return f"{name}: expected a file, got a directory"
    if isinstance(exc, NotADirectoryError):
        return f"{name}: expected a path through directories, got a file in the way"
    if isinstance(exc, PermissionError):
        return f"{name}: expected a path this user may read and write, got permission denied"
    if isinstance(exc, yaml.YAMLError):
        return f"{name}: expected valid YAML, got {' '.join(str(exc).split())[:200]}"
    return None


@contextmanager
def usage(path: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Turn bad-input exceptions into `UsageError` (`bad_input_message`); ``CALIBTUNE_DEBUG=1``
    re-raises them with their traceback, for bug reports."""
    try:
        yield
    except Exception as exc:
        message = bad_input_message(exc, path)
        if message is None or os.environ.get("CALIBTUNE_DEBUG"):
            raise
        raise UsageError(message) from None
