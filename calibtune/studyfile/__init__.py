"""The study file and the study folder: what a study YAML says (`load_study` → a frozen
`StudyConfig`; the loss search spaces of search_spaces/; the constraints a feasible trial meets)
and where a study keeps its state (`StudyDir`: state file, lock, the study"s own copy, and the
stop a full disk or a lost lock asks the driver for).

Below the records, readers, cluster and driver that read it; above the trial engine, whose trial
config a study"s ``trial:`` section is.
"""

from calibtune._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        [
            "Objective",
            "SearchConfig",
            "StudyConfig",
            "StudyError",
            "head_from_text",
            "load_study",
            "parse_study",
            "study_from_text",
        ],
        "._config",
    ),
    **dict.fromkeys(
        ["LossSpace", "Space", "SpaceError", "decode", "load_loss_space", "parse_loss_space"],
        "._spaces",
    ),
    **dict.fromkeys(
        ["Constraint", "TAG_FEASIBLE", "baseline_values", "judge", "violations"], "._constraints"
    ),
    **dict.fromkeys(
        [
            "STATE_FILE",
            "STUDY_COPY",
            "StudyDir",
            "StudyDirError",
            "StudyLockedError",
            "StudyState",
            "default_storage",
            "new_study_id",
            "self_contained",
        ],
        "._studydir",
    ),
    **dict.fromkeys(
        [
            "StorageFullError",
            "full_message",
            "request_stop",
            "silence_disk_full_logs",
            "stop_reason",
            "storage_full",
            "tolerate_full_store",
            "trial_error_text",
        ],
        "._diskfull",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
