"""A failed trial says where: one line for the user, the full traceback in its artifacts.

The one line names the error, calibtune's innermost frame (file:line, function) and where the
training loop was (`calibtune.training.Progress`: epoch and step, or the phase); the traceback
goes to ``<trial>/artifacts/error.txt`` (other ranks: ``error_rank<r>.txt``) and, through each
callback's ``on_trial_error``, to the trial's MLflow run.

A storage or network hiccup (`transient_io`: an S3 503 SlowDown, a connection reset, an expired
session token, an NFS stale handle) is not the trial's own error: the trial raises
`TransientIOError` after a backoff, which the study's scheduler lets Tune retry from the trial's
last checkpoint (``search.max_failures`` times; `calibtune.study._scheduling`). A full disk is
never a hiccup: it keeps its own stop (`calibtune.studyfile._diskfull`).
"""

from __future__ import annotations

import contextlib
import errno
import random
import re
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from calibtune._io import atomic_write
from calibtune.training import NonFiniteLossError, Progress

__all__ = [
    "TransientIOError",
    "TrialStepError",
    "backoff_s",
    "failure",
    "innermost_frame",
    "transient_io",
]

_PACKAGE = Path(__file__).resolve().parent.parent  # .../calibtune


class TrialStepError(RuntimeError):
    """An unexpected error inside a trial, re-raised with the place it happened."""


class TransientIOError(TrialStepError):
    """A storage or network hiccup inside a trial (`transient_io`): retried from the trial's
    last checkpoint, not the trial's own error. The study's scheduler tells it apart by its
    name in the error's text (`calibtune.study._scheduling.TRANSIENT`)."""


#: errnos of a connection or file handle that a later attempt gets afresh
TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,  # a store restarting
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ENETRESET,
        errno.ESTALE,  # NFS: the server lost the handle (failover, export remounted)
    }
)
#: errnos of a full disk or quota: the study stops for them (`calibtune.studyfile._diskfull`)
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: S3 error codes (botocore's ``response["Error"]["Code"]``) a retry gets past: throttling, a
#: busy or failing server, a session token that the credential chain renews
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ExpiredToken",
        "ExpiredTokenException",
        "TokenRefreshRequired",
    }
)
#: botocore's exceptions for a connection that failed or timed out (no response to read)
_BOTO_CONNECTION = frozenset(
    {
        "ConnectionClosedError",
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionError",
        "ProxyConnectionError",
        "IncompleteReadError",
    }
)
#: pyarrow's OSError text for S3 and GCS errors (it carries no errno): the AWS SDK's error
#: type, the HTTP status of an error it could not parse, or the error code it could not map
_TRANSIENT_TEXT = re.compile(
    r"AWS Error (SLOW_DOWN|NETWORK_CONNECTION|SERVICE_UNAVAILABLE|THROTTLING|INTERNAL_FAILURE"
    r"|REQUEST_TIMEOUT)\b|HTTP status (5\d\d|429)\b"
    rf"|ExceptionName: ({'|'.join(sorted(TRANSIENT_CODES))})\b"
    r"|google::cloud::Status\((UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED)\b"
)
_FULL_TEXT = re.compile(r"No space left on device|Disk quota exceeded|\[errno 28\]", re.I)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)


def _io_verdict(exc: BaseException) -> bool | None:
    """Whether one exception is a transient I/O error (True), another I/O error (False), or no
    I/O error at all (None: the chain's next link decides)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and isinstance(response.get("Error"), dict):  # botocore
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = response["Error"].get("Code")
        busy = isinstance(status, int) and (status == 429 or status >= 500)
        return code in TRANSIENT_CODES or busy
    if type(exc).__module__.startswith("botocore") and type(exc).__name__ in _BOTO_CONNECTION:
        return True
    if isinstance(exc, TimeoutError):  # socket timeouts too (errno None)
        return True
    if isinstance(exc, OSError):
        if exc.errno is not None:
            return exc.errno in TRANSIENT_ERRNOS
        return _TRANSIENT_TEXT.search(str(exc)) is not None
    return None


def transient_io(exc: BaseException) -> bool:
    """Whether ``exc`` is a storage or network hiccup that a retry gets past, judged by the
    innermost I/O error of its chain (``__cause__``, else ``__context__``): an `OSError` with
    an errno in `TRANSIENT_ERRNOS` (a connection reset, an NFS stale handle...) or a timeout,
    botocore's connection errors and its `TRANSIENT_CODES` (SlowDown, ExpiredToken...) or an
    HTTP 5xx/429, pyarrow's S3/GCS error text for the same (`_TRANSIENT_TEXT`). Never a full
    disk or quota anywhere in the chain (its own stop), nor a chain without an I/O error.

    >>> transient_io(RuntimeError("upload failed"))
    False
    >>> err = RuntimeError("checkpoint upload")
    >>> err.__cause__ = ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
    >>> transient_io(err)
    True
    >>> transient_io(OSError("When uploading part for key 'k': AWS Error SLOW_DOWN during ..."))
    True
    >>> transient_io(OSError(errno.ENOSPC, "No space left on device"))
    False
    """
    links = list(_chain(exc))
    for link in links:
        if isinstance(link, OSError) and link.errno in FULL_ERRNOS:
            return False
        if _FULL_TEXT.search(str(link)):
            return False
    for link in reversed(links):
        verdict = _io_verdict(link)
        if verdict is not None:
            return verdict
    return False


def innermost_frame(exc: BaseException) -> str | None:
    """``calibtune/<module>.py:<line> in <function>`` of the deepest calibtune frame of
    ``exc``'s traceback (None when no frame is calibtune's).

    >>> try:
    ...     innermost_frame(None)  # type: ignore[arg-type]
    ... except AttributeError as e:
    ...     innermost_frame(e).startswith("calibtune/trial/_errors.py:")
    True
    """
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(_PACKAGE):
            rel = path.relative_to(_PACKAGE.parent).as_posix()
            return f"{rel}:{frame.lineno} in {frame.name}"
    return None


#: the wait before a trial's first retry after a hiccup, doubled at each later one, at most
#: `BACKOFF_MAX_S`; Tune bounds the retries (``search.max_failures``)
BACKOFF_S = 2.0
BACKOFF_MAX_S = 60.0
#: ``<trial>/artifacts/transient_errors.txt``: one line per hiccup of the trial (its count sets
#: the backoff; a retried trial runs in a new process)
HICCUPS_FILE = "transient_errors.txt"


def backoff_s(earlier: int, jitter: float | None = None) -> float:
    """Seconds to wait before retrying a trial that had ``earlier`` hiccups before this one:
    ``min(BACKOFF_MAX_S, BACKOFF_S * 2**earlier) * (0.5 + jitter / 2)``, ``jitter`` uniform in
    [0, 1) (AWS's "equal jitter": trials that failed together do not retry together).

    >>> backoff_s(0, jitter=1.0), backoff_s(2, jitter=0.0), backoff_s(50, jitter=1.0)
    (2.0, 4.0, 60.0)
    """
    j = random.random() if jitter is None else jitter
    return min(BACKOFF_MAX_S, BACKOFF_S * 2.0 ** min(earlier, 32)) * (0.5 + j / 2)


def _note_hiccup(trial_dir: Any, rank: int, reason: str) -> float:
    """Record one more hiccup of the trial (rank 0) and return its backoff (`backoff_s`);
    the storage may be what hiccups: a record that cannot be read or written counts none."""
    path = trial_dir / "artifacts" / HICCUPS_FILE
    before = ""
    with contextlib.suppress(Exception):
        before = path.read_text() if path.is_file() else ""
    if rank == 0:
        with contextlib.suppress(Exception):
            atomic_write(path, f"{before}{time.strftime('%Y-%m-%dT%H:%M:%S')} {reason}\n")
    return backoff_s(len(before.splitlines()))


def _one_line(exc: BaseException, progress: Progress) -> str:
    lines = str(exc).strip().splitlines()
    where = innermost_frame(exc)
    at = f"at {where}; " if where else ""
    return f"{type(exc).__name__}: {lines[0] if lines else ''} ({at}{progress.where()})"


def failure(
    exc: BaseException,
    progress: Progress,
    trial_dir: Any,
    rank: int,
    callbacks: Sequence[Any],
) -> BaseException:
    """Record ``exc`` (traceback file, callbacks) and return what the trial raises: ``exc``
    itself for bad input and divergence (their messages already say what and where, and the
    driver tells them apart by type); for a storage or network hiccup (`transient_io`) a
    `TransientIOError` with the one-line reason, after its backoff (`backoff_s`); else a
    `TrialStepError` with the one-line reason."""
    known = isinstance(exc, ValueError | NonFiniteLossError)
    reason = str(exc).strip() if known else _one_line(exc, progress)
    text = f"{reason}\n\n" + "".join(traceback.format_exception(exc))
    name = "error.txt" if rank == 0 else f"error_rank{rank}.txt"
    try:
        (trial_dir / "artifacts").mkdir(parents=True, exist_ok=True)
        atomic_write(trial_dir / "artifacts" / name, text)
    except Exception:  # a full, read-only or hiccuping store must not hide the original error
        pass
    for cb in callbacks:
        if hasattr(cb, "on_trial_error"):
            # the trial's own error is what the user needs, not a logging one
            with contextlib.suppress(Exception):
                cb.on_trial_error(reason, text)
    if known:
        return exc
    if transient_io(exc):
        time.sleep(_note_hiccup(trial_dir, rank, reason))  # the store gets a moment first
        return TransientIOError(reason)
    return TrialStepError(reason)
