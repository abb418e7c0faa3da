"""User-supplied names that become folder names, run names or labels — and paths built from them.

One rule for every name calibtune turns into a path component (study names, trial names, loss
labels): letters, digits, ``_``, ``.`` and ``-``, starting with a letter or digit, at most
`MAX_NAME` characters. Starting with a letter or digit excludes ``.``/``..``; matching the whole
string (``re.fullmatch``, not ``$``, which accepts a trailing newline) excludes control
characters. MLflow experiment names may also contain ``/`` and spaces (``calibtune/quickstart``):
each ``/``-separated part follows the name rule with spaces allowed inside.

`safe_join` is the last line of defence: the joined, resolved path must stay inside its root.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from calibtune._yaml import excerpt

__all__ = ["MAX_EXPERIMENT", "MAX_NAME", "check_experiment", "check_name", "safe_join"]

MAX_NAME = 100
MAX_EXPERIMENT = 200
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_NAME - 1}}}")
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.+-]*")
NAME_RULE = f"a name of letters, digits, _.- (starting with a letter or digit, ≤ {MAX_NAME} chars)"
EXPERIMENT_RULE = (
    "an experiment name of /-separated parts of letters, digits, spaces, _.+- (each starting "
    f"with a letter or digit, ≤ {MAX_EXPERIMENT} chars)"
)


def check_name(value: Any, where: str) -> str:
    """Return ``value`` if it is a safe name, else raise ``ValueError("where: expected …")``.

    >>> check_name("focal_g3", "losses[0].label")
    'focal_g3'
    >>> check_name("../x", "name")
    Traceback (most recent call last):
    ...
    ValueError: name: expected a name of letters, digits, _.- (starting with a letter or digit, \
≤ 100 chars), got '../x'
    """
    if not isinstance(value, str) or _NAME.fullmatch(value) is None:
        raise ValueError(f"{where}: expected {NAME_RULE}, got {excerpt(value)}")
    return value


def check_experiment(value: Any, where: str) -> str:
    """Return ``value`` if it is a safe MLflow experiment name (see the module docstring)."""
    ok = (
        isinstance(value, str)
        and len(value) <= MAX_EXPERIMENT
        and all(_PART.fullmatch(p) and p == p.rstrip() for p in value.split("/"))
    )
    if not ok:
        raise ValueError(f"{where}: expected {EXPERIMENT_RULE}, got {excerpt(value)}")
    return value


def safe_join(root: str | os.PathLike[str], *parts: str, where: str = "name") -> Path:
    """``root / parts…`` resolved; raises ``ValueError`` if the result leaves ``root``.

    >>> safe_join("/tmp/runs", "trial_1").as_posix()
    '/tmp/runs/trial_1'
    """
    base = Path(root).expanduser().resolve()
    out = base.joinpath(*parts).resolve()
    if out == base or not out.is_relative_to(base):
        raise ValueError(
            f"{where}: expected a path inside {base}, got {excerpt(os.path.join(*parts))}"
        )
    return out
