"""The argparse types of ``calibtune``'s options: each turns one command-line string into a
value or raises ``argparse.ArgumentTypeError`` with what was expected and what was found (argparse
prints it as ``calibtune run: error: argument --more: expected ...``, exit code 2). Light by
design: the command table (`calibtune.commands`) imports this to build every sub-parser.
"""

from __future__ import annotations

import argparse
import re

__all__ = ["parse_duration", "port_number", "trial_count", "wait_duration"]

_UNITS = {
    **dict.fromkeys(["s", "sec", "secs", "second", "seconds"], 1.0),
    **dict.fromkeys(["m", "min", "mins", "minute", "minutes"], 60.0),
    **dict.fromkeys(["h", "hr", "hrs", "hour", "hours"], 3600.0),
    **dict.fromkeys(["d", "day", "days"], 86400.0),
}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"\s*({_NUMBER})\s*([a-z]*)")
_CLOCK = re.compile(r"(?:(\d+):)?(\d+):([0-5]\d(?:\.\d*)?)")  # [H:]M:SS, as the status line


def parse_duration(text: str) -> float:
    """Seconds of ``--wait-for-resources``: a number of seconds (``600``), one or more numbers
    with units (``90s``, ``10m``, ``1.5h``, ``1h30m``, ``10 min``, ``2 days``) or the status
    line's clock (``10:00``, ``1:30:00``); a ValueError saying what was expected otherwise.

    >>> parse_duration("10m"), parse_duration("90s"), parse_duration("1h 30m"), parse_duration("0")
    (600.0, 90.0, 5400.0, 0.0)
    >>> parse_duration("10:00"), parse_duration("1:02:03")
    (600.0, 3723.0)
    """
    t = text.strip().lower()
    if clock := _CLOCK.fullmatch(t):
        h, m, sec = clock.groups()
        return int(h or 0) * 3600.0 + int(m) * 60.0 + float(sec)
    parts, pos = [], 0
    while pos < len(t) and (part := _PART.match(t, pos)) and part.end() > pos:
        parts.append(part.groups())
        pos = part.end()
    units = [u for _, u in parts]
    plain = len(parts) == 1 and not units[0]  # a bare number: seconds
    if pos < len(t) or not parts or not (plain or all(u in _UNITS for u in units)):
        raise ValueError(
            f"expected a duration such as 600, 90s, 10m, 1.5h, 1h30m or 10:00, got {text!r}"
        )
    return sum(float(v) * _UNITS.get(u, 1.0) for v, u in parts)


def port_number(text: str) -> int:
    """argparse type of a TCP port: an integer in 1..65535.

    >>> port_number("8080")
    8080
    """
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 1-65535, got {text!r}")
    return port


def wait_duration(text: str) -> float:
    """argparse type of ``--wait-for-resources``: seconds (`parse_duration`).

    >>> wait_duration("1h30m")
    5400.0
    """
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def trial_count(text: str) -> int:
    """argparse type of ``--more``: an integer >= 1.

    >>> trial_count("3")
    3
    """
    n = int(text) if text.strip().isdigit() else 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (trials to add), got {text!r}")
    return n
