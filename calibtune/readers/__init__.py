"""Reading finished and running studies back: `compare`, `report`, `export` (the trials of a
study as a table, the papers" table, the best configs), the seed-paired comparison of arms, the
parent run"s summary (objective curves, figures) and the dashboards (MLflow UI, Optuna).

Reads MLflow and the study folder; never starts Ray or imports torch at import time.
"""

from calibtune._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        [
            "StudyNotFoundError",
            "StudyRef",
            "compare_table",
            "export_best",
            "format_table",
            "grid_ends",
            "locate_study",
            "mark_feasibility",
            "report_table",
            "trials_frame",
        ],
        "._results",
    ),
    **dict.fromkeys(["paired_table"], "._paired"),
    **dict.fromkeys(["load_optuna_study", "rdb_storage", "refresh_summary"], "._summary"),
    **dict.fromkeys(
        ["check_port_free", "start_dashboard", "start_ui", "stop_ui", "ui_lines"],
        "._ui",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
