"""Small file-system helpers shared by the trial and study layers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from calibtune.storage import open_storage

__all__ = ["atomic_write", "cache_home"]


def cache_home() -> Path:
    """calibtune's folder for caches of this machine (``$XDG_CACHE_HOME/calibtune``, by default
    ``~/.cache/calibtune``): what may be thrown away at any time and made again."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "calibtune"


def atomic_write(path: str | os.PathLike[str] | Any, text: str) -> None:
    """Write ``text`` to ``path`` (a local path, or a `calibtune.storage.Storage`) so that
    readers see the old or the new file, never a part: through the storage owner (temp file in
    the same folder, fsync, rename; one complete upload to a bucket); a failure (a full disk)
    leaves the old one."""
    open_storage(path).write_text(text)
