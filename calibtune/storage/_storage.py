"""`Storage`: one location of a study's or trial's files, as a (pyarrow file system, path) pair.

A location is resolved once, at the command line's boundary (`open_storage`), from a local path
or a URI: a path (or ``file://``) is the local disk, written through `atomic_filesystem`
(temp file, fsync, rename); ``s3://BUCKET/PREFIX`` is an S3 or S3-compatible store whose
endpoint and region come from the standard environment variables (``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``); any other URI goes to
``pyarrow.fs.FileSystem.from_uri`` (``gs://``, ``hdfs://``...). A text that starts like a URI
(``s3:``, ``gs:``) without ``//``, a URI with a ``?query`` or ``#fragment`` (which `Storage.uri`
could not name again) and a URI with credentials in it are refused.

Credentials are never arguments: the S3 client reads them through the AWS SDK's default chain
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, a profile, a web
identity, the node's instance or pod role) in each process that uses it. Ray Tune pickles the
file system it is handed (``tuner.pkl``, the experiment state, every trial's task), and
pyarrow pickles explicit keys with it; a file system built from the chain pickles none, and
each process that unpickles it asks its own chain.

Everything else — reading, atomic writing, listing, deleting, streams for ``torch.save`` and
``torch.load`` — goes through the pair, so the same code serves a local disk, NFS and a bucket,
and Ray Tune/Train get the same pair (`Storage.ray_args`).

Atomicity: a local write renames a complete temp file over the target; an object store makes an
object visible only once its upload completes, and calibtune uploads a stream only when the code
writing it finished without an error, so readers see the old or the new object, never a part.
An object smaller than pyarrow's part size (10 MiB) goes as one ``PutObject``
(``allow_delayed_open``): no multipart upload, which some S3-compatible servers answer wrongly
(moto 5.2.1 reports a failed ``CompleteMultipartUpload`` inside a 200).
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import re
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from calibtune.storage._atomic import AtomicWriter

__all__ = ["Storage", "StorageError", "check_location", "open_storage"]

S3_CONNECT_TIMEOUT_S = 5.0
S3_REQUEST_TIMEOUT_S = 60.0
S3_ATTEMPTS = 3

# RFC 3986's scheme, then ":"; a drive letter ("C:") is not a concern on the POSIX nodes served
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


class StorageError(ValueError):
    """A storage location calibtune cannot use (one line: what was expected, what was found)."""


@dataclass(frozen=True)
class Storage:
    """A file or folder in a file system: ``fs`` (``pyarrow.fs.FileSystem``) and ``path`` (the
    file system's own path: absolute for the local disk, ``BUCKET/KEY`` for a bucket);
    ``scheme`` is ``""`` for the local disk, else the URI scheme it was opened with.

    >>> import tempfile
    >>> root = open_storage(tempfile.mkdtemp())
    >>> f = root / "a" / "b.txt"
    >>> f.write_text("hello")
    >>> f.read_text(), root.listdir(), (root / "a").listdir()
    ('hello', ['a'], ['b.txt'])
    >>> f.delete(); f.exists()
    False
    """

    fs: Any
    path: str
    scheme: str = ""

    # ------------------------------------------------------------------ names

    @property
    def is_local(self) -> bool:
        """Whether this is the local disk (a POSIX path other processes here can open)."""
        return self.scheme == ""

    def local_path(self) -> Path:
        """The local path, for what truly needs one (``flock``, caches); refused for a URI."""
        if not self.is_local:
            raise StorageError(f"{self.uri}: expected a local path here, got an object store")
        return Path(self.path)

    @property
    def uri(self) -> str:
        """How a person (or `open_storage`) names it: the local path, or ``SCHEME://PATH``."""
        return self.path if self.is_local else f"{self.scheme}://{self.path}"

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:
        # only the local disk is a path; os.fspath of a bucket is a mistake that must not
        # silently become a local folder named 's3:'
        return str(self.local_path())

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def parent(self) -> Storage:
        return Storage(self.fs, posixpath.dirname(self.path.rstrip("/")), self.scheme)

    def join(self, *parts: str) -> Storage:
        """The location ``parts`` below this one (relative parts, ``/``-separated)."""
        for part in parts:
            if part.startswith("/") or ".." in part.split("/"):
                raise StorageError(f"{self.uri}: expected a relative name below it, got {part!r}")
        return Storage(self.fs, posixpath.join(self.path, *parts), self.scheme)

    def __truediv__(self, part: str) -> Storage:
        return self.join(part)

    def __lt__(self, other: Storage) -> bool:  # sorted() of listings
        return self.uri < other.uri

    def ray_args(self) -> tuple[str, Any]:
        """``(storage_path, storage_filesystem)`` for Ray Tune's and Ray Train's ``RunConfig``
        and ``Tuner.restore``: the same file system, so Ray's files land where calibtune's do,
        and no credential copied from this process into Ray's trial actors
        (`_ray_copies_no_credentials`)."""
        _ray_copies_no_credentials()
        return self.path, self.fs

    # ------------------------------------------------------------------ queries

    def _info(self) -> Any:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type != FileType.NotFound

    def is_file(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.File

    def is_dir(self) -> bool:
        from pyarrow.fs import FileType

        return self._info().type == FileType.Directory

    def listdir(self) -> list[str]:
        """The names directly below this folder, sorted (``[]`` when there is none)."""
        from pyarrow.fs import FileSelector

        infos = self.fs.get_file_info(FileSelector(self.path, allow_not_found=True))
        return sorted(posixpath.basename(i.path.rstrip("/")) for i in infos)

    def glob(self, pattern: str) -> list[Storage]:
        """The entries directly below this folder whose names match ``pattern`` (fnmatch)."""
        import fnmatch

        return [self / n for n in self.listdir() if fnmatch.fnmatchcase(n, pattern)]

    # ------------------------------------------------------------------ reading

    def read_bytes(self) -> bytes:
        """The file's bytes; ``FileNotFoundError`` when there is no file."""
        if not self.is_file():
            raise FileNotFoundError(2, "No such file", self.uri)
        with self.fs.open_input_stream(self.path) as f:
            return f.readall()

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def open_input(self) -> IO[bytes]:
        """A seekable binary file object of the file (e.g. for ``torch.load``)."""
        if self.is_local:
            return open(self.path, "rb")  # the caller closes it
        return io.BytesIO(self.read_bytes())

    # ------------------------------------------------------------------ writing

    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """Create this folder and its parents (an object store has prefixes, not folders);
        the arguments are ``pathlib``'s, accepted for callers written for a ``Path``."""
        if self.is_local:
            self.fs.create_dir(self.path, recursive=True)

    def write_bytes(self, data: bytes) -> None:
        """Replace the file's content atomically (readers see the old or the new bytes)."""
        with self.open_output() as f:
            f.write(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))

    @contextlib.contextmanager
    def open_output(self) -> Iterator[IO[bytes]]:
        """A binary file object whose bytes replace the file atomically when the block ends
        without an error; an error (a full disk, the writer's own) keeps the previous file. A
        write that failed is what the block raises, however the caller reported it."""
        if self.is_local:
            self.parent.mkdir()
            writer = AtomicWriter(self.path)
            try:
                yield writer  # type: ignore[misc]
            except BaseException as exc:
                writer.abort()
                reworded = isinstance(exc, Exception) and not isinstance(exc, OSError)
                if writer.error is not None and reworded:
                    # a writer that words a failed write its own way (torch's zip writer:
                    # `RuntimeError: … unexpected pos`): the write's own error (a full disk)
                    raise writer.error from exc
                raise
            writer.close()
            return
        buf = io.BytesIO()
        yield buf
        with self.fs.open_output_stream(self.path) as out:  # one upload of complete bytes
            out.write(buf.getbuffer())

    def delete(self) -> None:
        """Remove the file, or the folder with everything below it; nothing there is fine."""
        from pyarrow.fs import FileType

        kind = self._info().type
        if kind == FileType.File:
            self.fs.delete_file(self.path)
        elif kind == FileType.Directory:
            self.fs.delete_dir(self.path)

    # ------------------------------------------------------------------ checks

    def check_reachable(self, key: str) -> None:
        """For an object store: calibtune can put, list and delete under this prefix (what a
        study does; a ``HeadBucket`` alone is refused under prefix-scoped IAM policies that
        allow all of that); one line naming ``key`` otherwise, saying when the bucket does not
        exist. For S3 without a configured region or endpoint, the bucket's region is resolved
        first (`resolve_region`). The local disk is checked by `calibtune.cluster._preflight`."""
        if self.is_local:
            return
        where = self
        if self.scheme in ("s3", "s3a") and resolve_region(self.path.split("/", 1)[0]):
            where = open_storage(self.uri, key)  # a client in the bucket's region
        probe = where / f".calibtune-reach-{uuid.uuid4().hex[:12]}"
        try:
            probe.write_text("")
            where.listdir()
            probe.delete()
            return
        except OSError as exc:
            why = " ".join(str(exc).split())[:160]
        bucket = self.path.split("/", 1)[0]
        from pyarrow.fs import FileType

        denied = any(w in why.upper() for w in ("ACCESS_DENIED", "ACCESSDENIED", "FORBIDDEN"))
        try:
            kind = where.fs.get_file_info(bucket).type
        except OSError:
            if denied:  # it answered: this prefix is not the caller's
                kind = FileType.Unknown
            else:
                raise StorageError(
                    f"{key}: expected a reachable store at {self.uri}, got {why}"
                ) from None
        if kind == FileType.NotFound:
            raise StorageError(
                f"{key}: expected an existing bucket {bucket!r} at {self.uri}, found none; "
                "create it first"
            )
        raise StorageError(
            f"{key}: expected a store calibtune can write, list and delete in at {self.uri}, "
            f"got {why}"
        ) from None


#: buckets whose region `resolve_region` looked up (bucket -> region, or None: not found)
_REGIONS: dict[str, str | None] = {}


def resolve_region(bucket: str) -> str | None:
    """The AWS region of ``bucket`` when neither ``AWS_REGION``/``AWS_DEFAULT_REGION`` nor an
    endpoint is set (pyarrow would use us-east-1 and fail on a bucket elsewhere): looked up once
    (``pyarrow.fs.resolve_s3_region``) and put in ``AWS_REGION``, which this process's clients,
    a local Ray's workers and `calibtune submit` (an allow-listed name) pass on; None when a
    region is configured already or the lookup fails (the client's own error says why later)."""
    env = os.environ
    if any(env.get(k) for k in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3")):
        return None
    if env.get("AWS_ENDPOINT_URL"):
        return None
    if bucket not in _REGIONS:
        from pyarrow.fs import resolve_s3_region

        try:
            _REGIONS[bucket] = resolve_s3_region(bucket)
        except (OSError, ValueError):
            _REGIONS[bucket] = None
    region = _REGIONS[bucket]
    if region:
        env["AWS_REGION"] = region
    return region


#: what Ray Tune copies from the driver's environment into every trial actor's ``runtime_env``
#: (``ray.tune.execution.class_cache.ENV_VARS_TO_PROPAGATE``), which Ray logs on each node
#: (``runtime_env_agent.log``) and shows to anyone who can list actors
_RAY_COPIED_CREDENTIALS = frozenset(
    {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN"}
)


def _ray_copies_no_credentials() -> None:
    """Take the credential variables out of Ray Tune's copy list (Ray has no setting for it):
    a local Ray's workers inherit the driver's environment anyway, and a cluster's nodes use
    their own credentials (`calibtune submit --env` names one that must travel)."""
    from ray.tune.execution import class_cache

    class_cache.ENV_VARS_TO_PROPAGATE = (
        frozenset(class_cache.ENV_VARS_TO_PROPAGATE) - _RAY_COPIED_CREDENTIALS
    )


def _s3(parsed: urllib.parse.SplitResult) -> Storage:
    """An S3 (or S3-compatible) store: endpoint and region from the standard AWS environment
    variables, credentials from the SDK's default chain (never passed: they would be pickled)."""
    from pyarrow.fs import AwsStandardS3RetryStrategy, S3FileSystem

    env = os.environ
    kw: dict[str, Any] = {
        "connect_timeout": S3_CONNECT_TIMEOUT_S,
        "request_timeout": S3_REQUEST_TIMEOUT_S,
        "retry_strategy": AwsStandardS3RetryStrategy(max_attempts=S3_ATTEMPTS),
        "allow_delayed_open": True,  # a stream under one part is one PutObject at close
    }
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        ep = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kw["endpoint_override"] = ep.netloc
        kw["scheme"] = ep.scheme
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        kw["region"] = region
    path = f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
    return Storage(S3FileSystem(**kw), path, "s3")


def _shown(parsed: urllib.parse.SplitResult) -> str:
    """A URI as a message may show it: without its user information, query or fragment, which
    may hold a key (pyarrow reads ``secret_key=`` from a query)."""
    host = parsed.netloc.rpartition("@")[2]
    user = "…@" if "@" in parsed.netloc else ""
    rest = ("?…" if parsed.query else "") + ("#…" if parsed.fragment else "")
    return f"{parsed.scheme}://{user}{host}{parsed.path}{rest}"


def check_location(text: str, key: str = "storage") -> urllib.parse.SplitResult | None:
    """The URI ``text`` names, parsed (None for a local path), without opening anything; refused
    in one line naming ``key`` (never echoing a secret): a scheme and ``:`` without ``//``
    (``s3:/b/x``, ``s3:b/x``, ``gs:/b``, ``a:b``: a local folder of that name is ``./a:b``), a
    query or fragment (`Storage.uri` could not name it again; pyarrow reads ``secret_key=`` from
    a query), credentials (a password, or any user part of a bucket URI: pyarrow reads
    ``s3://KEY:SECRET@BUCKET``).

    >>> check_location("runs/studies") is None, check_location("s3://b/p").netloc
    (True, 'b')
    >>> check_location("s3:b/p", "--storage")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    calibtune.storage._storage.StorageError: --storage: expected SCHEME://… (s3://BUCKET/...
    """
    head = _SCHEME.match(text)
    if head is not None and not text[head.end() :].startswith("//"):
        raise StorageError(
            f"{key}: expected SCHEME://… (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, file:///PATH) "
            f"or a local path (./{text} for a folder of that name), got {text!r}"
        )
    if "://" not in text:
        return None
    parsed = urllib.parse.urlsplit(text)
    shown = _shown(parsed)
    if parsed.query or parsed.fragment or text.endswith(("?", "#")):
        raise StorageError(
            f"{key}: expected a URI without ?query or #fragment (an S3 endpoint and region come "
            f"from AWS_ENDPOINT_URL_S3 and AWS_REGION), got {shown!r}"
        )
    bucket = parsed.scheme.lower() in ("s3", "s3a", "gs", "gcs")  # its user part is a key
    if parsed.password is not None or (bucket and "@" in parsed.netloc):
        raise StorageError(
            f"{key}: expected a URI without credentials (they come from the environment or "
            f"the node's role), got {shown!r}"
        )
    return parsed


def open_storage(where: str | os.PathLike[str] | Storage, key: str = "storage") -> Storage:
    """The `Storage` that ``where`` names: a local path (made absolute, ``~`` expanded), a
    ``file://`` URI, ``s3://BUCKET[/PREFIX]`` (AWS environment variables), or any URI
    ``pyarrow.fs.FileSystem.from_uri`` opens; `StorageError` naming ``key`` otherwise: what
    `check_location` refuses, a URI no file system opens.

    >>> open_storage("s3://calib/studies/").uri
    's3://calib/studies'
    >>> open_storage("ftp://host/x", "--storage")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    calibtune.storage._storage.StorageError: --storage: expected a local path or a URI ...
    """
    if isinstance(where, Storage):
        return where
    text = os.fspath(where)
    parsed = check_location(text, key)
    if parsed is None:
        # pyarrow (and numpy) only once a path is opened: `calibtune --help` imports this module
        from calibtune.storage._local import atomic_filesystem

        return Storage(atomic_filesystem(), os.path.abspath(os.path.expanduser(text)))
    scheme = parsed.scheme.lower()
    if scheme == "file":
        return open_storage(urllib.parse.unquote(parsed.path) or "/", key)
    if scheme in ("s3", "s3a"):
        if not parsed.netloc:
            raise StorageError(f"{key}: expected s3://BUCKET[/PREFIX], got {text!r}")
        return _s3(parsed)
    from pyarrow.fs import FileSystem

    try:
        fs, path = FileSystem.from_uri(text)
    except (OSError, ValueError, TypeError) as exc:
        why = " ".join(str(exc).split())[:160]
        raise StorageError(
            f"{key}: expected a local path or a URI pyarrow opens (s3://, gs://, hdfs://, "
            f"file://), got {text!r} ({why})"
        ) from None
    return Storage(fs, path.rstrip("/"), scheme)
