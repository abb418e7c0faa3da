"""Provenance of an exported trial config: what produced it and with which library versions.

`calibtune export` writes it as a comment block at the top of the YAML (the trial config itself
stays a plain trial config, which rejects unknown keys)::

    # provenance:
    #   calibtune: 0.1.0
    #   git_sha: 1a2b3c...
    #   versions: {torch: 2.9.0, ray: 2.60.0, optuna: 5.0.0, mlflow: 3.17.2}
    #   study: quickstart
    #   ...

`read_provenance` parses that block back; `calibtune train` compares its ``versions`` with the
installed ones (`version_drift`) and warns in one line when they differ.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Any

import yaml

__all__ = [
    "LIBRARIES",
    "installed_versions",
    "provenance_comment",
    "read_provenance",
    "version_drift",
]

LIBRARIES = ("calibtune", "torch", "ray", "optuna", "mlflow")
_HEAD = "# provenance:"
_INDENT = "#   "


def installed_versions(names: Iterable[str] = LIBRARIES) -> dict[str, str]:
    """``__version__`` of each of ``names`` as imported (as the study's parent run records
    them: ``torch`` with its local part, e.g. ``2.14.1+cu130``); ``"missing"`` if absent."""
    out = {}
    for name in names:
        try:
            out[name] = str(importlib.import_module(name).__version__)
        except ImportError:
            out[name] = "missing"
        except AttributeError:
            out[name] = metadata.version(name)
    return out


def provenance_comment(prov: Mapping[str, Any]) -> str:
    """The YAML comment block for ``prov`` (one mapping; ``read_provenance`` inverts it)."""
    body = yaml.safe_dump(dict(prov), sort_keys=False, default_flow_style=None, width=1000)
    return "\n".join([_HEAD, *(_INDENT + line for line in body.splitlines())]) + "\n"


def read_provenance(text: str) -> dict[str, Any] | None:
    """The provenance block of an exported config's text, or None when it has none (or the
    block is not a YAML mapping)."""
    lines = text.splitlines()
    try:
        start = lines.index(_HEAD) + 1
    except ValueError:
        return None
    block = []
    for line in lines[start:]:
        if not line.startswith(_INDENT):
            break
        block.append(line[len(_INDENT) :])
    try:
        prov = yaml.safe_load("\n".join(block))
    except yaml.YAMLError:
        return None
    return prov if isinstance(prov, dict) else None


def version_drift(recorded: Mapping[str, Any], installed: Mapping[str, str]) -> list[str]:
    """``name recorded -> installed`` for every library whose version differs."""
    return [
        f"{name} {recorded[name]} -> {installed.get(name, 'missing')}"
        for name in LIBRARIES
        if name in recorded and str(recorded[name]) != installed.get(name, "missing")
    ]
