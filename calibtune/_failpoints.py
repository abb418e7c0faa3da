"""Named pause points for fault-injection tests (off unless ``CALIBTUNE_FAILPOINT`` is set).

``CALIBTUNE_FAILPOINT=name[:epoch]`` and ``CALIBTUNE_FAILPOINT_DIR=DIR`` make the process that
reaches `failpoint(name, epoch)` write ``DIR/name.hit`` (its pid) and pause, so that a test can
kill a chosen process (the driver, a worker) at exactly that moment with SIGKILL; with
``CALIBTUNE_FAILPOINT_SKIP=n`` the first ``n`` processes to reach it pass (e.g. to let the first
trial of a study finish); ``CALIBTUNE_FAILPOINT_PAUSE_S`` bounds the pause (default 600 s).
``CALIBTUNE_FAILPOINT_RAISE=ERRNO`` (a name such as ``ECONNRESET``) raises ``OSError(ERRNO)``
there once instead of pausing: a storage hiccup at exactly that moment.
Production runs never set the variable; the check is one lookup.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

__all__ = ["failpoint"]


def failpoint(name: str, epoch: int | None = None) -> None:
    spec = os.environ.get("CALIBTUNE_FAILPOINT")
    if not spec:
        return
    want, _, at = spec.partition(":")
    if want != name or (at and epoch is not None and int(at) != epoch):
        return
    folder = Path(os.environ.get("CALIBTUNE_FAILPOINT_DIR", "."))
    hit = folder / f"{name}.hit"
    if hit.exists():  # pause once: the resumed run goes on
        return
    passed = len(list(folder.glob(f"{name}.pass*")))
    if passed < int(os.environ.get("CALIBTUNE_FAILPOINT_SKIP", "0")):
        (folder / f"{name}.pass{passed}").write_text(str(os.getpid()))
        return
    hit.write_text(str(os.getpid()))
    if raise_errno := os.environ.get("CALIBTUNE_FAILPOINT_RAISE"):
        code = getattr(errno, raise_errno)
        raise OSError(code, os.strerror(code), f"failpoint {name}")
    time.sleep(float(os.environ.get("CALIBTUNE_FAILPOINT_PAUSE_S", "600")))
