"""Checking a data set's files: against the published checksums, or the stamp written at fetch.

A *stamp* (``<root>/.calibtune-data/stamps/<set>.json``) records, for every file of a set,
``[size, mtime_ns, md5]`` at the moment ``calibtune data fetch`` (or a passing
``calibtune data verify``) checked it. Loaders compare the stamp with ``os.stat`` (free) and
re-hash only a file whose size or mtime changed, so a run refuses a truncated or altered file
without hashing 178 MB of CIFAR-10 at every start; a file whose stamp is missing (placed by
hand) is left to ``calibtune data verify``, which hashes it against the published checksum and
then writes the stamp.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

from .._io import atomic_write
from ._common import DatasetNotFoundError, SetCheck, resolve_root
from ._imagenet import verify_imagenet
from ._sources import FetchSet, fetch_set

__all__ = [
    "PREPARED_SETS",
    "STATE_DIR",
    "DataVerificationError",
    "SetCheck",
    "check_stamp",
    "forget_stamp",
    "md5_file",
    "record_stamp",
    "set_files",
    "verify_set",
]

#: sets calibtune cannot download: the user prepares their folder, `verify_set` checks its layout
PREPARED_SETS = ("imagenet",)

#: the folder under a data root holding calibtune's own state: the lock, partial downloads,
#: stamps (hidden, so no loader ever reads it as data)
STATE_DIR = ".calibtune-data"


class DataVerificationError(DatasetNotFoundError):
    """A data set's file differs from what was fetched or published (one-line message naming
    the file, what was expected and the command that fetches it again)."""


def md5_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex MD5 of a file's bytes, read in 1 MiB chunks (the digest torchvision and Zenodo
    publish).

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     _ = f.write(b"abc"); f.flush(); md5_file(Path(f.name))
    '900150983cd24fb0d6963f7d28e17f72'
    """
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _stamp_path(root: Path, name: str) -> Path:
    return root / STATE_DIR / "stamps" / f"{name}.json"


def _fetch_hint(name: str, root: Path) -> str:
    return f"calibtune data fetch {name} --root {root}"


def set_files(root: Path, fs: FetchSet) -> list[str]:
    """The files of ``fs`` relative to ``root``: the published list, or (no per-file checksums
    published: Tiny-ImageNet) every file under its folder, sorted."""
    if fs.files:
        return list(fs.files)
    folder = root / (fs.folder or "")
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(root).as_posix() for p in folder.rglob("*") if p.is_file())


def record_stamp(root: Path, name: str, digests: dict[str, str]) -> None:
    """Write the stamp of set ``name``: each file's size, mtime and the given MD5 (atomic)."""
    entries = {}
    for rel, md5 in digests.items():
        st = (root / rel).stat()
        entries[rel] = [st.st_size, st.st_mtime_ns, md5]
    path = _stamp_path(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"set": name, "files": entries}, sort_keys=True))


def forget_stamp(root: Path, name: str) -> None:
    """Remove the stamp of set ``name`` (before its files are replaced)."""
    _stamp_path(root, name).unlink(missing_ok=True)


def _read_stamp(root: Path, name: str) -> dict[str, list] | None:
    try:
        return json.loads(_stamp_path(root, name).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _mismatch(root: Path, rel: str, entry: list, rehash: bool) -> str | None:
    """Why ``rel`` no longer matches its stamp entry ``[size, mtime_ns, md5]``, or None."""
    size, mtime_ns, md5 = entry
    try:
        st = (root / rel).stat()
    except OSError:
        return "missing"
    if st.st_size != size:
        return f"{st.st_size} bytes, {size} when fetched"
    if (rehash or st.st_mtime_ns != mtime_ns) and (got := md5_file(root / rel)) != md5:
        return f"md5 {got}, {md5} when fetched"
    return None


def check_stamp(root: object, name: str, files: list[str] | None = None) -> None:
    """Refuse files of set ``name`` under ``root`` that changed since their stamp was written:
    ``os.stat`` per file (size, mtime), an MD5 only where the mtime moved. ``files``: the
    relative paths a loader reads (None: every file of the stamp). No stamp: nothing to check.
    Raises `DataVerificationError` (one line)."""
    base = resolve_root(root, name)
    stamp = _read_stamp(base, name)
    if stamp is None:
        return
    for rel in stamp if files is None else [f for f in files if f in stamp]:
        why = _mismatch(base, rel, stamp[rel], rehash=False)
        if why is not None:
            raise DataVerificationError(
                f"{name}: {base / rel} changed since it was fetched ({why}); run "
                f"`{_fetch_hint(name, base)}` to fetch it again (or delete "
                f"{_stamp_path(base, name)} to use the files unverified)"
            )


def verify_set(name: str, root: object = None, *, full: bool = True) -> SetCheck:
    """Check set ``name`` under ``root``: against its stamp when there is one (``full``:
    re-hash every file; else only those whose size or mtime moved), else against the
    published per-file MD5s — and, when those pass, write the stamp so runs check it.
    A set the user prepares (`PREPARED_SETS`: ImageNet) is checked by its own verifier: its
    layout and (``full``) every file's header."""
    if name in PREPARED_SETS:
        return verify_imagenet(root, full=full)  # type: ignore[return-value]
    fs = fetch_set(name)
    base = resolve_root(root, name)
    stamp = _read_stamp(base, name)
    if stamp is not None:
        for rel, entry in stamp.items():
            if (why := _mismatch(base, rel, entry, rehash=full)) is not None:
                hint = _fetch_hint(name, base)
                return SetCheck(name, "failed", f"{base / rel}: {why}; run `{hint}`")
        how = "re-hashed" if full else "size and mtime"
        return SetCheck(name, "ok", f"{len(stamp)} files match the fetch record ({how})")
    rels = set_files(base, fs)
    present = [r for r in rels if (base / r).is_file()]
    if not present:
        return SetCheck(name, "missing", f"nothing under {base}; run `{_fetch_hint(name, base)}`")
    if not fs.files:
        return SetCheck(
            name,
            "unverified",
            f"{len(present)} files, not fetched by calibtune and no "
            f"per-file checksums published; run `{_fetch_hint(name, base)}` to fetch it checked",
        )
    if len(present) < len(rels):
        absent = sorted(set(rels) - set(present))
        return SetCheck(
            name,
            "failed",
            f"missing {', '.join(str(base / r) for r in absent[:3])}"
            f"{' …' if len(absent) > 3 else ''}; run `{_fetch_hint(name, base)}`",
        )
    for rel in rels:
        if (got := md5_file(base / rel)) != fs.files[rel]:
            return SetCheck(
                name,
                "failed",
                f"{base / rel}: md5 {got}, expected {fs.files[rel]} "
                f"({fs.checksum_source}); run `{_fetch_hint(name, base)}`",
            )
    with contextlib.suppress(OSError):  # a read-only root: verified now, just not recorded
        record_stamp(base, name, dict(fs.files))
    return SetCheck(name, "ok", f"{len(rels)} files match the published checksums")
