"""The ``calibtune`` subcommands: the command table (`COMMANDS`: help, arguments and the handler
of each, parsed by `calibtune.cli`) and one handler module per group of commands — ``_train``
(train), ``_run`` (run, resume), ``_jobs`` (submit, status, logs), ``_read`` (compare, report,
export), ``_serve`` (ui, dashboard), ``_data`` (data fetch, data verify). A handler's module is
imported only when its command runs.
"""

from calibtune._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["COMMANDS", "DATA_SETS", "PREPARED_SETS"], "._table"),
    "format_metrics_table": "._train",
    "TRIALS_FAILED_EXIT": "._run",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
