"""Reading user-supplied YAML safely, and quoting user values safely in error messages.

Every study, search-space and trial-config file goes through `load_file` (or `load_text` for a
submitted study's text). Compared with ``yaml.safe_load`` it

* refuses files over `MAX_BYTES` (checked with ``stat`` before reading a byte),
* refuses data that is not UTF-8 text (NUL bytes — binary or UTF-16 — or invalid UTF-8),
* refuses aliases (``*name``): an "alias bomb" of nested aliases expands to billions of nodes
  when the value is later copied or printed; nothing calibtune reads needs them,
* refuses duplicate mapping keys (plain YAML keeps the last one silently),
* answers in one line ``FILE: line L, column C: not valid YAML (problem)``, never with a snippet
  of the file.

`excerpt` is the one way a user value is quoted in an error: its ``repr`` cut to ~60 characters.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

__all__ = [
    "MAX_BYTES",
    "YamlError",
    "YamlSyntaxError",
    "cut",
    "excerpt",
    "load_file",
    "load_text",
    "read_text",
]

#: the largest YAML file calibtune reads (the shipped studies are ~2 KiB)
MAX_BYTES = 1 << 20
EXCERPT_CHARS = 60


class YamlError(ValueError):
    """A file that is not acceptable YAML; the message is one line naming the file."""


class YamlSyntaxError(YamlError):
    """Text that does not parse as YAML; ``detail`` says where and why, without the text."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def cut(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters (the cut marked with ``…``)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` cut to at most ``limit`` characters (the cut marked with ``…``).

    >>> excerpt("x" * 100)[-5:]
    'xxxx…'
    >>> excerpt(3)
    '3'
    """
    try:
        text = repr(value)
    except RecursionError:  # a self-referencing structure
        text = f"<{type(value).__name__}>"
    return cut(text, limit)


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


LIMIT = f"{MAX_BYTES / (1 << 20):g} MiB"


# libyaml parses ~5x faster than the pure-Python parser (a 1 MiB file: seconds, not a minute);
# both compose aliases as shared nodes, without expanding them. libyaml's composer recurses in C
# and crashes the process on ~10^5 nested brackets, so deeply bracketed text takes the Python
# parser, whose recursion ends in a RecursionError instead.
_FAST_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
_MAX_FAST_DEPTH = 1000
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _bracket_depth(text: str) -> int:
    """An upper bound of the flow nesting depth (brackets inside strings count too)."""
    brackets = _NOT_BRACKET.sub("", text)
    if len(brackets) <= _MAX_FAST_DEPTH:
        return len(brackets)
    return max(itertools.accumulate(1 if c in "[{" else -1 for c in brackets))


def _key_text(node: Node) -> str:
    return str(node.value) if isinstance(node.value, str) else "<complex key>"


def _check_tree(root: Node) -> None:
    """Walk the composed node graph once, in document order, before anything is constructed:
    a node reached twice is an alias (refused: expanding a nested alias "bomb" takes gigabytes),
    a mapping with a repeated key is refused naming its key path and both lines."""
    seen: set[int] = set()
    stack: list[tuple[Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            raise YamlError(
                f"{cut(path or 'document', 100)}: expected YAML without aliases (*name), got an "
                f"alias of the value at line {node.start_mark.line + 1}"
            )
        seen.add(id(node))
        children: list[tuple[Node, str]] = []
        if isinstance(node, MappingNode):
            lines: dict[str, int] = {}
            for key, value in node.value:
                name = _key_text(key)
                where = f"{path}.{name}" if path else name
                line = key.start_mark.line + 1
                if name in lines:
                    raise YamlError(
                        f"{cut(where, 100)}: duplicate key (lines {lines[name]} and {line})"
                    )
                lines[name] = line
                children += [(key, where), (value, where)]
        elif isinstance(node, SequenceNode):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(node.value)]
        stack.extend(reversed(children))


def _parse(text: str) -> Any:
    deep = _bracket_depth(text) > _MAX_FAST_DEPTH
    loader = yaml.SafeLoader(text) if deep else _FAST_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_tree(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_text(text: str, label: str) -> Any:
    """Parse YAML ``text`` (errors prefixed with ``label``) under the rules of this module."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlError(f"{label}: expected YAML under {LIMIT}, got {_size(len(text))}")
    if "\x00" in text:
        raise YamlError(f"{label}: expected UTF-8 YAML text, got binary data")
    try:
        return _parse(text)
    except YamlError as exc:
        raise YamlError(f"{label}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        detail = f"{where}not valid YAML ({cut(exc.problem or exc.context or '', 100)})"
        raise YamlSyntaxError(f"{label}: {detail}", detail) from None
    except yaml.YAMLError as exc:
        detail = f"not valid YAML ({cut(str(exc), 100)})"
        raise YamlSyntaxError(f"{label}: {detail}", detail) from None
    except RecursionError:
        raise YamlError(f"{label}: expected YAML nested a few levels deep, got deeper") from None


def read_text(path: str | os.PathLike[str], what: str = "YAML file") -> str:
    """The text of ``path`` if it is a regular file of at most `MAX_BYTES` of UTF-8 (checked
    with ``stat`` before reading); else `YamlError`, one line starting with the path, ``what``
    naming the file (e.g. "study file")."""
    p = Path(path)
    if not p.exists():
        raise YamlError(f"{p}: expected a {what}, found nothing at that path")
    if not p.is_file():
        kind = "a directory" if p.is_dir() else "not a regular file"
        raise YamlError(f"{p}: expected a {what}, got {kind}")
    size = p.stat().st_size
    if size > MAX_BYTES:
        raise YamlError(f"{p}: expected a {what} under {LIMIT}, got {_size(size)}")
    try:
        with p.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise YamlError(f"{p}: expected a readable {what}, got {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:  # grew since stat
        raise YamlError(f"{p}: expected a {what} under {LIMIT}, got more")
    if b"\x00" in data:  # binary, or UTF-16/32 text
        raise YamlError(f"{p}: expected a UTF-8 YAML text file, got binary data")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise YamlError(
            f"{p}: expected a UTF-8 YAML text file, got binary data (byte {exc.start})"
        ) from None


def load_file(path: str | os.PathLike[str], what: str = "YAML file") -> Any:
    """Read (`read_text`) and parse (`load_text`) the YAML file ``path``."""
    return load_text(read_text(path, what), str(path))
