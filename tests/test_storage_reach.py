"""A bucket is checked the way a study uses it: put, list and delete under its prefix. Under a
prefix-scoped IAM policy (HeadBucket and whole-bucket listing denied, the prefix allowed) a
usable prefix passes and another prefix is refused in one line; without a configured region the
bucket's region is resolved once."""

from __future__ import annotations

from typing import Any

import pytest

from calibtune.storage import StorageError, open_storage
from calibtune.storage import _storage as storage_module
from tests._s3 import S3Server, start_s3

_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)


def _scoped_server() -> S3Server:
    """moto behind a policy of ``s3:*`` on ``calib/allowed/*`` only (and listing with that
    prefix): HeadBucket, other prefixes and whole-bucket listing answer 403."""
    open_to_all = [True]  # while the test makes its bucket

    def wrap(moto_app: Any) -> Any:
        def app(environ: dict[str, Any], start: Any) -> Any:
            path, query = environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", "")
            allowed = path.startswith("/calib/allowed/") or (
                path.rstrip("/") == "/calib" and "prefix=allowed%2F" in query
            )
            if not (open_to_all[0] or allowed):
                start("403 Forbidden", [("Content-Type", "application/xml")])
                return [] if environ["REQUEST_METHOD"] == "HEAD" else [_DENIED]
            return moto_app(environ, start)

        return app

    s3 = start_s3(wrap)
    s3.client().create_bucket(Bucket="calib")
    open_to_all[0] = False
    return s3


@pytest.fixture(scope="module")
def scoped():
    s3 = _scoped_server()
    yield s3
    s3.stop()


@pytest.fixture
def scoped_env(scoped: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    for k, v in scoped.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return scoped


def test_a_prefix_scoped_policy_allows_its_prefix(scoped_env: S3Server) -> None:
    where = open_storage("s3://calib/allowed/studies")
    where.check_reachable("--storage")  # HeadBucket is denied: the old check refused this
    assert where.listdir() == []  # the probe object is gone


def test_a_prefix_the_policy_denies_is_refused_in_one_line(scoped_env: S3Server) -> None:
    with pytest.raises(StorageError) as info:
        open_storage("s3://calib/other/studies").check_reachable("--storage")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(
        "--storage: expected a store calibtune can write, list and delete in at "
        "s3://calib/other/studies, got "
    )
    assert "ACCESS_DENIED during PutObject" in msg


def test_without_a_region_the_buckets_region_is_resolved_once(monkeypatch) -> None:
    import pyarrow.fs

    asked = []
    monkeypatch.setattr(pyarrow.fs, "resolve_s3_region", lambda b: asked.append(b) or "eu-west-3")
    monkeypatch.setattr(storage_module, "_REGIONS", {})
    for k in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    assert storage_module.resolve_region("calib") == "eu-west-3"
    import os

    assert os.environ["AWS_REGION"] == "eu-west-3"
    assert storage_module.resolve_region("calib") is None  # configured now: not asked again
    assert asked == ["calib"]
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # a MinIO: no AWS region
    monkeypatch.delenv("AWS_REGION")
    assert storage_module.resolve_region("other") is None and asked == ["calib"]
