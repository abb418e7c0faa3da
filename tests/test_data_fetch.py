"""``calibtune data fetch`` / ``verify`` (issue 30) against a local HTTP server on 127.0.0.1.

The server (a thread of `http.server`) serves small archives in each set's official layout
(CIFAR pickles, SVHN .mat, CIFAR-10-C .npy, a Tiny-ImageNet zip: the suite's own writers), with
``Range`` support, a request log, and faults: a response cut half-way, ``Range`` ignored, a
first request held until two fetching processes have started. The official table is replaced
by one pointing at the server with the fakes' MD5s (`_serve`); the real table is tested for
shape and against torchvision. No test reaches the internet.
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import re
import sys
import tarfile
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from calibtune.cli import main
from calibtune.commands import DATA_SETS
from calibtune.data import (
    FETCH_SETS,
    DataVerificationError,
    Download,
    FetchSet,
    check_fetched,
    fetch_argv,
    load_ood,
    load_splits,
    sets_read_by,
    verify_set,
)
from calibtune.data._verify import STATE_DIR
from tests.test_data import write_cifar10, write_tiny_imagenet
from tests.test_data_ood import write_cifar10c, write_svhn

# a Ray left up by the `ray_session` unit on this worker would hide one these refusals started
pytestmark = pytest.mark.usefixtures("ray_down")

ROOT = Path(__file__).resolve().parents[1]


# --- a local HTTP server ------------------------------------------------------------------


class _Server:
    """Files by URL path; ``log`` holds ``(path, Range header)`` per GET; ``cut[path]`` responses
    of that path end half-way (then the connection closes); paths in ``no_range`` ignore
    ``Range``; ``hold`` (a predicate) makes the first GET wait until it is true."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.log: list[tuple[str, str | None]] = []
        self.cut: Counter[str] = Counter()
        self.no_range: set[str] = set()
        self.hold: Callable[[], bool] | None = None
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server.serve(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def gets(self, path: str) -> int:
        return sum(p == path for p, _ in self.log)

    def serve(self, h: BaseHTTPRequestHandler) -> None:
        path, rng = h.path, h.headers.get("Range")
        with self.lock:
            self.log.append((path, rng))
            first = len(self.log) == 1
            cut = self.cut[path] > 0
            self.cut[path] -= cut
        data = self.files.get(path)
        if data is None:
            h.send_error(404)
            return
        if first and self.hold is not None:
            deadline = time.monotonic() + 60
            while not self.hold() and time.monotonic() < deadline:
                time.sleep(0.05)
        start = int(rng[6:].split("-")[0]) if rng and path not in self.no_range else 0
        if start >= len(data) > 0:
            h.send_error(416)
            return
        h.send_response(206 if start else 200)
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        body = data[start:]
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body[: len(body) // 2] if cut else body)
        h.wfile.flush()
        h.close_connection = True


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _tar(folder: Path, arcname: str, mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        t.add(folder, arcname=arcname)
    return buf.getvalue()


def _zip(folder: Path, arcname: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for p in sorted(folder.rglob("*")):
            z.write(p, f"{arcname}/{p.relative_to(folder).as_posix()}")
    return buf.getvalue()


def _fake(name: str, work: Path) -> tuple[dict[str, bytes], dict[str, str]]:
    """Files to serve for set ``name`` in its official layout, and the MD5 of each file the
    loaders read (relative to the root)."""
    src = work / f"src-{name}"
    if name == "cifar10":
        folder = write_cifar10(src)
        served = {"cifar-10-python.tar.gz": _tar(folder, folder.name)}
    elif name == "svhn":
        write_svhn(src)
        (src / "train_32x32.mat").write_bytes((src / "test_32x32.mat").read_bytes()[::-1])
        served = {f: (src / f).read_bytes() for f in ("train_32x32.mat", "test_32x32.mat")}
    elif name == "cifar10c":
        write_cifar10c(src, "gaussian_noise", per_severity=4)
        served = {"CIFAR-10-C.tar": _tar(src / "CIFAR-10-C", "CIFAR-10-C", "w")}
    else:
        folder = write_tiny_imagenet(src, per_class=3, val_per_class=1)
        served = {"tiny-imagenet-200.zip": _zip(folder, folder.name)}
    files = {
        p.relative_to(src).as_posix(): _md5(p.read_bytes())
        for p in src.rglob("*")
        if p.is_file() and name != "tiny_imagenet"
    }
    return served, files


def _serve(server: _Server, name: str, work: Path) -> FetchSet:
    """Put set ``name``'s fakes on the server; return its table row pointing there."""
    real = FETCH_SETS[name]
    served, files = _fake(name, work)
    downloads = []
    for d in real.downloads:
        server.files[f"/official/{d.file}"] = served[d.file]
        downloads.append(
            Download(d.file, f"{server.url}/official/{d.file}", _md5(served[d.file]), d.extract)
        )
    return FetchSet(name, real.title, tuple(downloads), real.folder, files, "", "the test")


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch, server: _Server, tmp_path: Path) -> dict[str, FetchSet]:
    """The official table replaced by rows served from ``server``."""
    rows = {
        n: _serve(server, n, tmp_path) for n in ("cifar10", "svhn", "cifar10c", "tiny_imagenet")
    }
    for n, row in rows.items():
        monkeypatch.setitem(FETCH_SETS, n, row)
    monkeypatch.delenv("CALIBTUNE_DATA_MIRROR", raising=False)
    return rows


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    rc = main(["data", *argv])
    out, err = capsys.readouterr()
    return rc, out, [line for line in err.splitlines() if line.strip()]


# --- the official table ---------------------------------------------------------------------

#: hosts whose official URL is plain HTTP (no HTTPS served by the data set's authors)
_HTTP_HOSTS = (
    "http://ufldl.stanford.edu/",
    "http://cs231n.stanford.edu/",
    "http://qwone.com/",  # 20 Newsgroups: the collection's own page serves no HTTPS
)


def test_official_table_shape() -> None:
    assert tuple(FETCH_SETS) == DATA_SETS  # the CLI's list (kept import-free) is the table's
    for name, fs in FETCH_SETS.items():
        assert fs.name == name and fs.downloads and fs.checksum_source and fs.size
        for d in fs.downloads:
            # an MD5, or where only a SHA-256 is published (SST, 20 Newsgroups) that instead
            sha = d.md5 == "" and re.fullmatch(r"[0-9a-f]{64}", d.sha256)
            assert re.fullmatch(r"[0-9a-f]{32}", d.md5) or sha, (name, d.md5, d.sha256)
            assert d.url.startswith("https://") or d.url.startswith(_HTTP_HOSTS), d.url
            assert d.url.rsplit("/", 1)[1] == d.file  # a mirror serves the same name
        for rel, md5 in fs.files.items():
            assert re.fullmatch(r"[0-9a-f]{32}", md5), (name, rel)
            assert fs.folder is None or rel.startswith(f"{fs.folder}/")
    assert len(FETCH_SETS["cifar10c"].files) == len(FETCH_SETS["cifar100c"].files) == 20
    assert FETCH_SETS["tiny_imagenet"].files == {}  # none published: said, not invented
    assert "none published" in FETCH_SETS["tiny_imagenet"].checksum_source


def test_official_table_matches_torchvision() -> None:
    from torchvision.datasets import CIFAR10, CIFAR100, SVHN

    for name, cls in (("cifar10", CIFAR10), ("cifar100", CIFAR100)):
        fs = FETCH_SETS[name]
        assert (fs.downloads[0].url, fs.downloads[0].md5) == (cls.url, cls.tgz_md5)
        listed = [*cls.train_list, *cls.test_list, [cls.meta["filename"], cls.meta["md5"]]]
        assert fs.files == {f"{cls.base_folder}/{f}": md5 for f, md5 in listed}
    svhn = {d.file: (d.url, d.md5) for d in FETCH_SETS["svhn"].downloads}
    for split in ("train", "test"):
        url, file, md5 = SVHN.split_list[split]
        assert svhn[file] == (url, md5)


def test_every_set_the_studies_read_is_in_the_table() -> None:
    from calibtune.study import load_study

    read: set[str] = set()
    for path in sorted((ROOT / "studies").glob("*.yaml")):
        data = load_study(path).base_config().data
        read.update(sets_read_by(data.name, data.ood, data.shift))
    assert {"cifar10", "svhn", "cifar10c"} <= read <= set(FETCH_SETS)
    for name in ("cifar100", "tiny_imagenet"):  # datasets without a study file yet
        assert set(sets_read_by(name)) <= set(FETCH_SETS)


# --- fetch ----------------------------------------------------------------------------------


def test_fetch_writes_the_layout_the_loaders_read(
    table: dict[str, FetchSet], server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "data"
    rc, out, err = _cli(
        capsys, "fetch", "cifar10", "svhn", "cifar10c", "tiny_imagenet", "--root", str(root)
    )
    assert (rc, err) == (0, [])
    assert [line.split(":")[:2] for line in out.splitlines()] == [
        [n, " fetched"] for n in ("cifar10", "svhn", "cifar10c", "tiny_imagenet")
    ]
    assert len(load_splits("cifar10", root=root).test) == 20
    assert len(load_ood("svhn", root=root).dataset) == 30
    assert load_ood("cifar10c", root=root, severity=2).dataset.images[0, 0, 0, 0] == 20
    assert len(load_splits("tiny_imagenet", root=root).test) == 2
    # nothing left behind but the stamps, the lock and Tiny-ImageNet's decoded cache (issue
    # 40); archives removed after unpacking
    state = sorted(
        p.relative_to(root / STATE_DIR).as_posix()
        for p in (root / STATE_DIR).rglob("*")
        if p.is_file()
    )
    assert state[0].startswith("decoded/tiny_imagenet-") and state[0].endswith(".npy")
    assert state[1:] == ["lock"] + [
        f"stamps/{n}.json" for n in sorted(("cifar10", "svhn", "cifar10c", "tiny_imagenet"))
    ]
    # fetched again: nothing downloaded
    before = len(server.log)
    rc, out, _ = _cli(capsys, "fetch", "cifar10", "tiny_imagenet", "--root", str(root))
    assert rc == 0 and len(server.log) == before
    assert all(": present: " in line for line in out.splitlines())
    rc, out, _ = _cli(
        capsys, "verify", "cifar10", "svhn", "cifar10c", "tiny_imagenet", "--root", str(root)
    )
    assert rc == 0 and [line.split(": ")[1] for line in out.splitlines()] == ["ok"] * 4


def test_a_mirror_replaces_the_hosts_and_checksums_still_apply(
    table: dict[str, FetchSet],
    server: _Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for d in table["svhn"].downloads:  # the lab mirror: same file names, another path
        server.files[f"/lab/{d.file}"] = server.files.pop(f"/official/{d.file}")
    monkeypatch.setenv("CALIBTUNE_DATA_MIRROR", f"{server.url}/lab/")
    rc, out, _ = _cli(capsys, "fetch", "svhn", "--root", str(tmp_path / "a"))
    assert rc == 0 and f"from {server.url}/lab/" in out
    assert {p for p, _ in server.log} == {"/lab/train_32x32.mat", "/lab/test_32x32.mat"}
    # --mirror wins over the variable; a mirror serving another file is refused by its MD5
    server.files["/other/test_32x32.mat"] = b"not the file"
    server.files["/other/train_32x32.mat"] = b"not the file"
    rc, _, err = _cli(
        capsys, "fetch", "svhn", "--root", str(tmp_path / "b"), "--mirror", f"{server.url}/other"
    )
    assert rc == 2 and len(err) == 1 and "expected md5" in err[0]
    rc, _, err = _cli(
        capsys, "fetch", "svhn", "--root", str(tmp_path / "b"), "--mirror", "ftp://lab"
    )
    assert rc == 2 and err == [
        "calibtune data: error: --mirror: expected an http://, https:// or file:// URL, got 'ftp://lab'"
    ]


def test_a_wrong_checksum_is_refused_and_the_partial_file_removed(
    table: dict[str, FetchSet], server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.files["/official/cifar-10-python.tar.gz"] += b"tampered"
    root = tmp_path / "data"
    rc, out, err = _cli(capsys, "fetch", "cifar10", "--root", str(root))
    assert rc == 2 and out == "" and len(err) == 1
    assert re.match(
        r"calibtune data: error: cifar10: http://\S+/cifar-10-python.tar.gz: "
        r"expected md5 [0-9a-f]{32}, got [0-9a-f]{32}",
        err[0],
    )
    assert not list((root / STATE_DIR / "downloads").iterdir())  # the partial file is gone
    assert not (root / "cifar-10-batches-py").exists()
    assert verify_set("cifar10", root).status == "missing"


def test_a_connection_closed_half_way_is_resumed_with_range(
    table: dict[str, FetchSet], server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "/official/CIFAR-10-C.tar"
    server.cut[path] = 1
    rc, _, err = _cli(capsys, "fetch", "cifar10c", "--root", str(tmp_path))
    assert (rc, err) == (0, [])
    size = len(server.files[path])
    assert [r for p, r in server.log if p == path] == [None, f"bytes={size // 2}-"]
    assert verify_set("cifar10c", tmp_path).status == "ok"


def test_a_server_without_range_that_keeps_closing_is_refused_cleanly(
    table: dict[str, FetchSet], server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = "/official/CIFAR-10-C.tar"
    server.cut[path] = 99
    server.no_range.add(path)
    rc, _, err = _cli(capsys, "fetch", "cifar10c", "--root", str(tmp_path))
    assert rc == 2 and len(err) == 1
    assert "the connection closed 3 times before the end" in err[0] and "to resume" in err[0]
    assert server.gets(path) == 3
    # the partial file stays for a resume, outside the layout: nothing passes verification
    assert (tmp_path / STATE_DIR / "downloads" / "CIFAR-10-C.tar.part").is_file()
    assert not (tmp_path / "CIFAR-10-C").exists()
    assert verify_set("cifar10c", tmp_path).status == "missing"
    server.cut[path] = 0
    rc, _, _ = _cli(capsys, "fetch", "cifar10c", "--root", str(tmp_path))
    assert rc == 0 and verify_set("cifar10c", tmp_path).status == "ok"


@pytest.mark.parametrize(
    ("member", "why"),
    [("../x", "a path with '..'"), ("/tmp/abs_x", "an absolute path"), ("link", "a link")],
)
def test_an_archive_member_outside_the_root_is_refused(
    table: dict[str, FetchSet],
    server: _Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    member: str,
    why: str,
) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        info = tarfile.TarInfo("cifar-10-batches-py/ok")
        info.size = 2
        t.addfile(info, io.BytesIO(b"ok"))
        info = tarfile.TarInfo(member)
        if member == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "../../etc/passwd"
        else:
            info.size = 3
        t.addfile(info, io.BytesIO(b"bad"))
    data = buf.getvalue()
    server.files["/official/cifar-10-python.tar.gz"] = data
    row = table["cifar10"]
    d = row.downloads[0]
    patched = FetchSet(
        "cifar10", row.title, (Download(d.file, d.url, _md5(data), True),), row.folder, row.files
    )
    FETCH_SETS["cifar10"] = patched
    root = tmp_path / "data"
    rc, _, err = _cli(capsys, "fetch", "cifar10", "--root", str(root))
    assert rc == 2 and len(err) == 1
    assert (
        f"cifar-10-python.tar.gz: expected members inside the data root, got {why}: {member!r}"
        in err[0]
    )
    assert not (tmp_path / "x").exists() and not Path("/tmp/abs_x").exists()
    assert not (root / "cifar-10-batches-py").exists()  # nothing extracted


# --- a shared root ----------------------------------------------------------------------------


def _fetch_in_child(root: Path, out: Path) -> None:
    """A forked process (it inherits the test's table): ``calibtune data fetch cifar10 svhn``
    with stdout and stderr in ``out``."""
    with open(out, "w") as f:
        sys.stdout = sys.stderr = f  # pytest's capture objects are not the child's to use
        code = main(["data", "fetch", "cifar10", "svhn", "--root", str(root)])
    os._exit(code)


def test_two_concurrent_fetches_download_each_file_once(
    table: dict[str, FetchSet], server: _Server, tmp_path: Path
) -> None:
    logs = [tmp_path / f"out{i}.txt" for i in range(2)]
    # the first download is answered only once the other process waits on the root's lock
    server.hold = lambda: any(
        "waiting for another fetch into" in log.read_text() for log in logs if log.exists()
    )
    root = tmp_path / "shared"
    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=_fetch_in_child, args=(root, log)) for log in logs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    outs = [log.read_text() for log in logs]
    assert [p.exitcode for p in procs] == [0, 0], outs
    assert Counter(p for p, _ in server.log) == {
        "/official/cifar-10-python.tar.gz": 1,
        "/official/train_32x32.mat": 1,
        "/official/test_32x32.mat": 1,
    }
    lines = [line.split(": ")[:2] for out in outs for line in out.splitlines()]
    for name in ("cifar10", "svhn"):  # one process fetched it, the other found it there
        assert sorted(a for n, *a in lines if n == name) == [["fetched"], ["present"]], outs
    assert any("waiting for another fetch into" in out for out in outs)  # the lock held
    assert verify_set("cifar10", root).status == verify_set("svhn", root).status == "ok"


# --- verification -----------------------------------------------------------------------------


def test_a_changed_file_is_refused_before_training(
    table: dict[str, FetchSet], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "data"
    assert _cli(capsys, "fetch", "cifar10", "--root", str(root))[0] == 0
    batch = root / "cifar-10-batches-py" / "data_batch_1"
    batch.write_bytes(batch.read_bytes()[:-1] + b"\x00")  # same size, new content and mtime
    with pytest.raises(DataVerificationError) as info:
        load_splits("cifar10", root=root)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(
        f"cifar10: {batch} changed since it was fetched (md5 "
    )
    assert f"run `calibtune data fetch cifar10 --root {root}`" in msg
    rc, out, _ = _cli(capsys, "verify", "cifar10", "--root", str(root))
    assert rc == 2 and out.startswith(f"cifar10: failed: {batch}: md5 ")
    # `calibtune train` refuses it in one line before Ray starts, even with workers
    cfg = tmp_path / "t.yaml"
    cfg.write_text(
        yaml.safe_dump({"data": {"name": "cifar10", "root": str(root), "ood": [], "shift": []}})
    )
    rc = main(["train", str(cfg), "--num-workers", "1", "--storage-path", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "changed since it was fetched" in err[0]
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    assert not (tmp_path / "runs").exists()
    # and so does `calibtune run`, before Ray, MLflow or the study folder
    study = {
        "name": "s",
        "storage": str(tmp_path / "runs"),
        "trial": {"data": {"name": "cifar10", "root": str(root), "ood": [], "shift": []}},
        "losses": ["cross_entropy"],
        "search": {"num_samples": 1, "objectives": [{"metric": "val/ece", "mode": "min"}]},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(study))
    rc = main(["run", str(tmp_path / "s.yaml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "changed since it was fetched" in err[0], err
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    assert not (tmp_path / "runs").exists()
    # truncation is caught by size alone; fetching again repairs the set
    batch.write_bytes(b"short")
    with pytest.raises(DataVerificationError, match=r"\(5 bytes, \d+ when fetched\)"):
        check_fetched("cifar10", root, ood=[], shift=[])
    rc, out, _ = _cli(capsys, "fetch", "cifar10", "--root", str(root))
    assert rc == 0 and ": fetched: " in out
    assert len(load_splits("cifar10", root=root).train) == 90


def test_files_placed_by_hand_are_verified_against_published_checksums(
    table: dict[str, FetchSet], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_cifar10(tmp_path)  # identical bytes to the served archive's files: they pass
    write_svhn(tmp_path)  # the test file only: svhn's train file is missing
    rc, out, _ = _cli(capsys, "verify", "--root", str(tmp_path))
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert lines["cifar10"].startswith("ok: 7 files match the published checksums")
    assert lines["svhn"].startswith("failed: missing ")
    assert lines["cifar10c"].startswith("missing: ")
    assert rc == 2
    assert (tmp_path / STATE_DIR / "stamps" / "cifar10.json").is_file()  # now checked by runs
    stamp = json.loads((tmp_path / STATE_DIR / "stamps" / "cifar10.json").read_text())
    assert sorted(stamp["files"]) == sorted(table["cifar10"].files)
    # a hand-placed file differing from its published checksum
    write_tiny_imagenet(tmp_path)
    assert verify_set("tiny_imagenet", tmp_path).status == "unverified"
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"x")
    (tmp_path / STATE_DIR / "stamps" / "cifar10.json").unlink()
    check = verify_set("cifar10", tmp_path)
    assert check.status == "failed" and "test_batch: md5 " in check.detail
    assert "expected " + table["cifar10"].files["cifar-10-batches-py/test_batch"] in check.detail


def test_missing_data_names_the_fetch_command(tmp_path: Path) -> None:
    from calibtune.data import DatasetNotFoundError

    for call, command in (
        (lambda: load_splits("cifar10", root=tmp_path), "cifar10"),
        (lambda: load_splits("tiny_imagenet", root=tmp_path), "tiny_imagenet"),
        (lambda: load_ood("svhn", root=tmp_path), "svhn"),
        (lambda: load_ood("cifar10c", root=tmp_path), "cifar10c"),
    ):
        with pytest.raises(
            DatasetNotFoundError,
            match=re.escape(f"run `calibtune data fetch {command} --root {tmp_path}`"),
        ):
            call()
    assert fetch_argv("cifar10", "/shared/data") == [
        "calibtune",
        "data",
        "fetch",
        "cifar10",
        "svhn",
        "cifar10c",
        "--root",
        "/shared/data",
    ]
    assert fetch_argv("digits", "/shared/data") == []


def test_the_generated_set_is_recorded_under_its_own_name(tmp_path: Path) -> None:
    from calibtune.data import data_inputs

    write_cifar10(tmp_path)
    names = [d.name for d in data_inputs("cifar10", tmp_path, 1, 0.1, ("cifar10c_generated",), ())]
    assert names[3:] == [f"ood/cifar10c_generated/s{s}" for s in range(1, 6)]
    assert sets_read_by("cifar10", ["cifar10c_generated"], []) == ["cifar10"]  # its source


def test_an_unwritable_root_is_refused_in_one_line(
    table: dict[str, FetchSet], server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("")
    root = tmp_path / "afile" / "data"
    rc, out, err = _cli(capsys, "fetch", "svhn", "--root", str(root))
    assert rc == 2 and out == "" and len(err) == 1 and server.log == []
    assert err[0].startswith("calibtune data: error: svhn: ")
    assert "expected a writable data root, got Not a directory" in err[0]
    rc, _, err = _cli(capsys, "fetch", "mnist", "--root", str(tmp_path))
    assert rc == 2 and err == [
        f"calibtune data: error: NAME: expected one of {', '.join(DATA_SETS)}, got 'mnist'"
    ]


def test_progress_is_drawn_on_a_terminal_only() -> None:
    from calibtune.data._fetch import _Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Terminal(), io.StringIO()
    for stream in (tty, pipe):
        p = _Progress("f.tar", 4 << 20, 0, stream)
        p.t0 -= 1.0  # one second into the download
        p.last -= 1.0
        p.update(1 << 20)
        p.close()
    assert re.fullmatch(r"\rf\.tar  1\.0/4\.0 MiB  1\.0 MiB/s  ETA 0:00:0[23] *\n", tty.getvalue())
    assert pipe.getvalue() == ""
