"""The study service: YAML studies and search spaces, Ray Tune + Optuna search, MLflow runs.

`load_study` validates a study file into a frozen `StudyConfig`; `run_study` searches it with
Ray Tune's `OptunaSearch` over the trial engine; `resume_study` restores an interrupted study;
`calibtune.study._results` reads studies back from MLflow (compare, report, export).
"""

from calibtune._lazy import lazy_exports

# Lazy (PEP 562): `calibtune --help` and compare/report/export import submodules of this package
# and must not pay for Ray and torch, which `_search` and `_config` pull in.
_EXPORTS = {
    **dict.fromkeys(
        ["Objective", "SearchConfig", "StudyConfig", "StudyError", "load_study", "parse_study"],
        "._config",
    ),
    **dict.fromkeys(
        [
            "StudyNotFoundError",
            "compare_table",
            "export_best",
            "locate_study",
            "report_table",
            "trials_frame",
        ],
        "._results",
    ),
    **dict.fromkeys(["StudyOutcome", "resume_study", "run_study"], "._search"),
    **dict.fromkeys(
        ["LossSpace", "Space", "SpaceError", "load_loss_space", "parse_loss_space"], "._spaces"
    ),
    **dict.fromkeys(["StudyDir", "StudyDirError", "StudyLockedError"], "._studydir"),
    **dict.fromkeys(["default_tracking_uri", "mlflow_metric_name"], "calibtune.record._tracking"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
