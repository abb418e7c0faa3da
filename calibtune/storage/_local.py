"""The local file system as calibtune writes it: atomic output streams, full disks noted.

`atomic_filesystem` is a ``pyarrow.fs.PyFileSystem`` over the local file system whose output
streams write a temp file beside the target, fsync it and rename it over the target on close;
after a failed write the temp file is removed and the last complete file stays. Ray Tune takes it
as ``storage_filesystem`` (its own ``pyarrow.fs.copy_files`` truncates each file and rewrites it
in place: a full disk left a truncated state that Tune could not restore, issue 24). The streams
are `calibtune.storage._atomic.AtomicWriter`, which notes every write a full disk failed for the
study's disk-full stop (`note_full`).
"""

from __future__ import annotations

import shutil
from typing import Any

from pyarrow import PythonFile
from pyarrow.fs import FileSystemHandler, LocalFileSystem, PyFileSystem

from calibtune.storage._atomic import AtomicWriter

__all__ = ["AtomicLocalHandler", "atomic_filesystem"]


def atomic_filesystem() -> Any:
    """The local file system with atomic output streams (a ``pyarrow.fs.PyFileSystem``)."""
    return PyFileSystem(AtomicLocalHandler())


class AtomicLocalHandler(FileSystemHandler):
    """``pyarrow.fs.LocalFileSystem`` with atomic `open_output_stream` and `copy_file`."""

    def __init__(self) -> None:
        self.fs = LocalFileSystem()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AtomicLocalHandler)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __reduce__(self) -> Any:  # travels to Ray workers (Tune's storage_filesystem)
        return (AtomicLocalHandler, ())

    def get_type_name(self) -> str:
        return "calibtune-atomic-local"

    def normalize_path(self, path: str) -> str:
        return self.fs.normalize_path(path)

    def get_file_info(self, paths: Any) -> Any:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self.fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("calibtune's storage file system never empties the root folder")

    def delete_file(self, path: str) -> None:
        self.fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        with open(src, "rb") as f, self.open_output_stream(dest, None) as out:
            shutil.copyfileobj(f, out)

    def open_input_stream(self, path: str) -> Any:
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return PythonFile(AtomicWriter(path), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_append_stream(path)
