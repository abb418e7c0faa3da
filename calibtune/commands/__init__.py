"""The ``calibtune`` subcommands: what each one runs (argument parsing is `calibtune.cli`)."""

from calibtune._lazy import lazy_exports

_EXPORTS = {"COMMANDS": "._study"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
