"""Start-up and exit helpers: lazy re-exports for package ``__init__`` modules (PEP 562),
`gc_paused` for one-shot commands and `exit_without_teardown` for the ``calibtune`` process.

A package whose public names live in heavy submodules (torch, Ray, MLflow) declares them here
instead of importing them: ``calibtune.study.StudyDir`` still works, but importing the package —
which Python does before any of its submodules, e.g. ``calibtune.commands._table`` for
``calibtune --help`` or ``calibtune.metrics.keys`` for ``calibtune compare`` — costs nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``exports`` maps each public name to the
    submodule (relative, e.g. ``"._config"``) that defines it; a name mapped to ``""`` is a
    submodule itself (``"keys": ""`` → ``package.keys``). The first access imports the submodule
    and caches the value in the package's namespace.

    >>> getattr_, dir_ = lazy_exports("json", {"JSONDecoder": ".decoder", "scanner": ""})
    >>> getattr_("JSONDecoder").__module__
    'json.decoder'
    >>> getattr_("scanner").__name__
    'json.scanner'
    >>> getattr_("nope")
    Traceback (most recent call last):
    ...
    AttributeError: module 'json' has no attribute 'nope'
    """

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if where:
            value = getattr(importlib.import_module(where, package), name)
        else:
            value = importlib.import_module(f".{name}", package)
        vars(importlib.import_module(package))[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *exports})

    return __getattr__, __dir__


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Run a block with CPython's cyclic garbage collector paused, for a one-shot command's
    start-up: importing MLflow, SQLAlchemy and pandas allocates a few hundred thousand objects
    that live until exit, and the collector's passes over them are ~20 % of the command's CPU
    time (`bench/bench_cli.py`). On the way out the survivors are moved to the permanent
    generation (`gc.freeze`) so later passes skip them, and the collector is switched back on
    (if it was on). Cyclic garbage made inside the block is kept until exit: use it only around
    the start-up of a command that ends soon after.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()


def exit_without_teardown(code: int) -> None:
    """End the process with exit status ``code`` the way Python's own exit would, minus the
    interpreter teardown: first what a normal exit does that anyone could rely on — the
    `atexit` handlers (Ray's shutdown, `logging.shutdown`, `weakref.finalize` callbacks,
    temporary directories) and flushing stdout/stderr — then `os._exit`. Tearing down the
    ≈ 700k objects of a process that imported torch, Ray and MLflow took ≈ 3 s after a study
    (bench/README.md), all of it freeing memory the OS reclaims anyway. With a non-daemon
    thread still running this falls back to `sys.exit`, which waits for it.

    For the process that is the command only (a caller of ``main([...])`` keeps running).
    """
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()  # what a normal exit runs, in the same (reverse) order
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # e.g. a closed pipe: nothing left to deliver
            stream.flush()
    os._exit(code)
