"""The study driver: a study file searched with Ray Tune's `OptunaSearch` over the trial engine
(`run_study`), an interrupted one restored (`resume_study`): search, scheduling, the trainable
each trial runs, progress and the live display, extension with more trials, the full-disk stop.

The study file itself is `calibtune.studyfile`, the readers `calibtune.readers`, the cluster
`calibtune.cluster`, what is recorded `calibtune.record`; the names below keep their old homes
importable.
"""

from calibtune._lazy import lazy_exports

# Lazy (PEP 562): importing the package must not pay for Ray and torch, which `_search` pulls in.
_EXPORTS = {
    **dict.fromkeys(
        [
            "SIGNAL_EXIT",
            "STORAGE_FULL_EXIT",
            "StudyOutcome",
            "resume_study",
            "run_study",
        ],
        "._search",
    ),
    "train_progress": "._display",
    **dict.fromkeys(
        [
            "LossSpace",
            "Objective",
            "SearchConfig",
            "Space",
            "SpaceError",
            "StudyConfig",
            "StudyDir",
            "StudyDirError",
            "StudyError",
            "StudyLockedError",
            "load_loss_space",
            "load_study",
            "parse_loss_space",
            "parse_study",
        ],
        "calibtune.studyfile",
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
        "calibtune.readers",
    ),
    **dict.fromkeys(
        ["default_tracking_uri", "mlflow_metric_name", "optuna_storage_url"], "calibtune.record"
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
