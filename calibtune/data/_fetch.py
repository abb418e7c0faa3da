"""``calibtune data fetch``: download, check and unpack the data sets of `FETCH_SETS`.

One fetch of one set, under an exclusive ``fcntl.flock`` on ``<root>/.calibtune-data/lock``
(so concurrent fetches into one shared root, from processes or nodes, download each file once):

1. a set whose stamp still matches is skipped; a set placed by hand that matches the published
   per-file checksums is stamped and skipped;
2. each file downloads to ``<root>/.calibtune-data/downloads/<file>.part``, resuming a partial
   file with an HTTP ``Range`` request when the server answers 206, restarting otherwise;
3. its MD5 must equal the published one, else the partial file is removed and the fetch
   refused; only then is it renamed (atomically, same filesystem) to ``<file>``;
4. an archive is checked member by member *before* anything is written (no absolute path, no
   ``..``, no link, device or fifo), unpacked into a temporary folder under the state folder and
   its top folder renamed into place; a plain file is renamed to ``<root>/<file>``;
5. the files the loaders read are checked against their published MD5s and the stamp is
   written last — a crash at any step leaves no stamp, hence nothing that passes verification.

torchvision's ``download_url`` has no resume and its ``extract_archive`` unpacks whatever the
archive names; importing torchvision also loads ``torch._dynamo``. Hence this module's own
small downloader (urllib) and extractor (tarfile/zipfile with the member checks above).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import os
import shutil
import tarfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from ._common import resolve_root
from ._reads import sets_read_by
from ._sources import Download, FetchSet, fetch_set
from ._verify import (
    STATE_DIR,
    forget_stamp,
    md5_file,
    record_stamp,
    verify_set,
)

__all__ = [
    "MIRROR_ENV",
    "FetchError",
    "Fetched",
    "download_url",
    "fetch",
    "fetch_argv",
    "mirror_url",
    "root_lock",
]

#: environment variable naming a lab mirror (same file names as the official hosts)
MIRROR_ENV = "CALIBTUNE_DATA_MIRROR"
_ATTEMPTS = 3  # a connection closed mid-file is resumed this many times before giving up
_CHUNK = 1 << 20


class FetchError(ValueError):
    """A fetch refused or failed; the message is one line (what was expected, what came)."""


def mirror_url(download: Download, mirror: str | None) -> str:
    """``download.url``, or ``<mirror>/<file>`` when a mirror is given (http, https or file URL).

    >>> d = Download("a.tar", "https://example.org/x/a.tar", "0" * 32, True)
    >>> mirror_url(d, "http://lab/data/")
    'http://lab/data/a.tar'
    """
    if not mirror:
        return download.url
    if not mirror.startswith(("http://", "https://", "file://")):
        raise FetchError(f"--mirror: expected an http://, https:// or file:// URL, got {mirror!r}")
    return f"{mirror.rstrip('/')}/{download.file}"


@contextlib.contextmanager
def root_lock(root: Path, say: IO[str] | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<root>/.calibtune-data/lock`` (shared filesystems:
    NFSv4 and Lustre/GPFS mounted with lock support honour it across nodes)."""
    state = root / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if say is not None:
                print(f"waiting for another fetch into {root} to finish", file=say, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class _Progress:
    """``file  12.0/163.0 MiB  8.1 MiB/s  ETA 0:18`` rewritten in place, at most 5 times a
    second, only when ``stream`` is a terminal."""

    def __init__(self, name: str, total: int | None, start: int, stream: IO[str] | None):
        self.name, self.total, self.done, self.start = name, total, start, start
        self.stream = stream if stream is not None and stream.isatty() else None
        self.t0 = self.last = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.stream is None or now - self.last < 0.2:
            return
        self.last = now
        rate = (self.done - self.start) / max(now - self.t0, 1e-9)
        mib = 1 << 20
        total = f"/{self.total / mib:.1f}" if self.total else ""
        eta = ""
        if self.total and rate > 0:
            left = int((self.total - self.done) / rate)
            eta = f"  ETA {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}"
        line = f"\r{self.name}  {self.done / mib:.1f}{total} MiB  {rate / mib:.1f} MiB/s{eta}"
        self.stream.write(line.ljust(72))
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()


def _open(url: str, offset: int) -> tuple[IO[bytes], int, int | None]:
    """Open ``url`` from byte ``offset``: ``(response, where it starts, total size or None)``;
    a server that ignores ``Range`` answers from 0."""
    request = urllib.request.Request(url, headers={"User-Agent": "calibtune-data-fetch"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    response = urllib.request.urlopen(request, timeout=60)
    length = response.headers.get("Content-Length")
    if getattr(response, "status", 200) == 206:
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        return response, offset, int(total) if total.isdigit() else None
    return response, 0, int(length) if length and length.isdigit() else None


def _append(url: str, part: Path, progress: _Progress | None, name: str) -> bool:
    """One attempt: continue ``part`` from its size; True when the server's whole file is in."""
    offset = part.stat().st_size if part.exists() else 0
    try:
        response, start, total = _open(url, offset)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # asked past the end: the file is complete already
            return True
        raise FetchError(
            f"{name}: {url}: expected the file, got HTTP {e.code} {e.reason}"
        ) from None
    with response, open(part, "r+b" if start else "wb") as out:
        out.seek(start)
        out.truncate()
        if progress is not None:
            progress.total, progress.done = total, start
        try:
            while block := response.read(_CHUNK):
                out.write(block)
                if progress is not None:
                    progress.update(len(block))
        except (OSError, http.client.HTTPException):  # connection lost mid-file: resume
            pass
        size = out.tell()
    return total is None or size >= total


def _digest(path: Path, pinned: str) -> str:
    """The digest of ``path`` in the form of ``pinned``: ``sha256:<hex>`` or a bare MD5."""
    if not pinned.startswith("sha256:"):
        return md5_file(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return f"sha256:{h.hexdigest()}"


def _named(digest: str) -> str:
    return digest.replace("sha256:", "sha256 ") if digest.startswith("sha256:") else f"md5 {digest}"


def download_url(url: str, dest: Path, md5: str, name: str, stream: IO[str] | None = None) -> Path:
    """Download ``url`` to ``dest`` (via ``dest.part``, resumed on a later call or after a
    connection closed mid-file) and check its MD5 (``md5`` of the form ``sha256:<hex>``: its
    SHA-256); a wrong digest removes the partial file and raises `FetchError`. Returns
    ``dest``."""
    if dest.is_file() and _digest(dest, md5) == md5:  # complete from an earlier, interrupted fetch
        return dest
    part = dest.with_name(dest.name + ".part")
    progress = _Progress(dest.name, None, 0, stream)
    try:
        for _ in range(_ATTEMPTS):
            try:
                if _append(url, part, progress, name):
                    break
            except urllib.error.URLError as e:
                raise FetchError(
                    f"{name}: {url}: expected a reachable server, got {e.reason}"
                ) from None
        else:
            got = part.stat().st_size if part.exists() else 0
            raise FetchError(
                f"{name}: {url}: the connection closed {_ATTEMPTS} times before the end "
                f"({got} bytes kept in {part}); run the same command again to resume"
            )
    finally:
        progress.close()
    got = _digest(part, md5)
    if got != md5:
        part.unlink()
        raise FetchError(
            f"{name}: {url}: expected {_named(md5)}, got {got.removeprefix('sha256:')} (the "
            f"download was removed; a mirror must serve the official file)"
        )
    os.replace(part, dest)
    return dest


def _check_member(name: str, archive: Path, member: str, link: bool, special: bool) -> None:
    """Refuse one archive member that could write outside the folder it is unpacked into."""
    path = PurePosixPath(member)
    reasons = (
        (path.is_absolute() or member.startswith("\\"), "an absolute path"),
        (".." in path.parts, "a path with '..'"),
        (link, "a link"),
        (special, "a device or fifo"),
    )
    why = next((why for bad, why in reasons if bad), None)
    if why is not None:
        raise FetchError(
            f"{name}: {archive.name}: expected members inside the data root, got {why}: "
            f"{member!r} (nothing was extracted)"
        )


def _safe_extract(name: str, archive: Path, into: Path) -> None:
    """Unpack ``archive`` (tar of any compression, or zip) into ``into`` after checking every
    member name (`_check_member`); any bad member refuses the whole archive."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                is_link = (info.external_attr >> 16) & 0o170000 == 0o120000
                _check_member(name, archive, info.filename, is_link, False)
            z.extractall(into)
        return
    with tarfile.open(archive) as t:
        members = t.getmembers()
        for m in members:
            _check_member(
                name, archive, m.name, m.issym() or m.islnk(), not (m.isfile() or m.isdir())
            )
        t.extractall(into, members=members, filter="data")


def _place(fs: FetchSet, root: Path, files: list[Path]) -> None:
    """Move downloaded files into the layout the loaders read."""
    state = root / STATE_DIR
    for d, path in zip(fs.downloads, files, strict=True):
        if not d.extract:
            os.replace(path, root / d.file)
            continue
        tmp = state / f"unpack-{fs.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        _safe_extract(fs.name, path, tmp)
        top = tmp if fs.flat else tmp / (fs.folder or "")  # flat: members at the top
        if not top.is_dir():
            raise FetchError(
                f"{fs.name}: {path.name}: expected a top folder {fs.folder}/, got "
                f"{sorted(p.name for p in tmp.iterdir())}"
            )
        old = root / fs.folder if fs.folder else None
        if old is not None and old.exists():
            trash = state / f"old-{fs.name}"
            shutil.rmtree(trash, ignore_errors=True)
            os.replace(old, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(top, root / (fs.folder or ""))
        shutil.rmtree(tmp, ignore_errors=True)
        path.unlink()


@dataclass(frozen=True)
class Fetched:
    """What `fetch` did for one set: ``action`` is ``fetched`` or ``present``."""

    name: str
    action: str
    detail: str

    def line(self) -> str:
        return f"{self.name}: {self.action}: {self.detail}"


def _record(fs: FetchSet, root: Path) -> None:
    """Check the placed files against their published MD5s, then write the stamp."""
    digests = {}
    for rel in fs.files or _all_files(root, fs):
        path = root / rel
        if not path.is_file():
            raise FetchError(f"{fs.name}: expected {path} in the archive, got no such file")
        digests[rel] = md5_file(path)
        if fs.files and digests[rel] != fs.files[rel]:
            raise FetchError(f"{fs.name}: {path}: expected md5 {fs.files[rel]}, got {digests[rel]}")
    record_stamp(root, fs.name, digests)


def _all_files(root: Path, fs: FetchSet) -> list[str]:
    folder = root / (fs.folder or "")
    return sorted(p.relative_to(root).as_posix() for p in folder.rglob("*") if p.is_file())


def fetch(
    name: str,
    root: object = None,
    mirror: str | None = None,
    stream: IO[str] | None = None,
) -> Fetched:
    """Fetch set ``name`` into ``root`` (None: ``./data``) from its official URLs, or from
    ``mirror`` (default: ``$CALIBTUNE_DATA_MIRROR``), once per root however many processes
    ask at the same time. Raises `FetchError` (one line) on a refused file."""
    fs = fetch_set(name)
    base = resolve_root(root, name)
    mirror = os.environ.get(MIRROR_ENV) if mirror is None else mirror
    urls = [mirror_url(d, mirror) for d in fs.downloads]  # a bad --mirror: before any I/O
    try:
        with root_lock(base, stream):
            check = verify_set(name, base, full=False)
            if check.status == "ok":
                return Fetched(name, "present", check.detail)
            forget_stamp(base, name)  # replaced files never pass under the old record
            downloads = base / STATE_DIR / "downloads"
            downloads.mkdir(parents=True, exist_ok=True)
            files = [
                download_url(url, downloads / d.file, d.md5 or f"sha256:{d.sha256}", name, stream)
                for d, url in zip(fs.downloads, urls, strict=True)
            ]
            _place(fs, base, files)
            _record(fs, base)
    except OSError as e:  # a read-only or full root, a lock the filesystem refuses
        where = e.filename or base
        raise FetchError(
            f"{name}: {where}: expected a writable data root, got {e.strerror or e}"
        ) from None
    where = mirror or "the official hosts"
    return Fetched(name, "fetched", f"{len(files)} file(s) from {where}, checked, in {base}")


def fetch_argv(
    dataset: str,
    root: str,
    ood: Sequence[str] | None = None,
    shift: Sequence[str] | None = None,
    mirror: str | None = None,
) -> list[str]:
    """The ``calibtune data fetch`` command line that gets every set a trial reads into
    ``root`` (empty when it reads no files): what a cluster job runs before the first trial —
    every node may run it, the root's lock and stamps make it download each file once.

    >>> fetch_argv("cifar10", "/shared/data", ood=["svhn"], shift=[])
    ['calibtune', 'data', 'fetch', 'cifar10', 'svhn', '--root', '/shared/data']
    """
    names = sets_read_by(dataset, ood, shift)
    if not names:
        return []
    return ["calibtune", "data", "fetch", *names, "--root", root] + (
        ["--mirror", mirror] if mirror else []
    )
