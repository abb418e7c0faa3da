"""What a study records in MLflow: one parent run per study and a child run per trial (tags,
params, per-epoch metrics, artifacts), the client that resends what a dying server cut off and
the SQLite store made while Ray starts, the bulk readers of many runs, data lineage (each split
a dataset input with its digest), the training curves drawn from the runs, and the study's Optuna
storage (the searcher's record of every trial; a SQLite copy in the bucket for a bucket study).

Below the study driver and the readers, above the trial engine: nothing here starts Ray or
trains.
"""

from calibtune._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        [
            "ChildRun",
            "EXPERIMENT_TAGS",
            "MlflowTrialCallback",
            "PARENT",
            "TAG_ERROR",
            "TAG_HASH",
            "TAG_KIND",
            "TAG_LOSS",
            "TAG_REUSED",
            "TAG_STATUS",
            "TAG_TRIAL",
            "TAG_T_GRID_ENDS",
            "check_artifact_store",
            "child_statuses",
            "close_run",
            "default_tracking_uri",
            "finish_run",
            "git_sha",
            "log_metrics",
            "log_missing",
            "mlflow_metric_name",
            "open_study_run",
            "record_failure",
            "render_deferred_figures",
            "reopen_interrupted",
            "resolve_tracking_uri",
            "run_metrics",
            "set_tag",
            "versions",
        ],
        "._tracking",
    ),
    **dict.fromkeys(
        [
            "StoreFullError",
            "mlflow_client",
            "retries_note",
            "store_created_meanwhile",
            "store_full_errors",
            "watch_retries",
        ],
        "._mlflow_store",
    ),
    **dict.fromkeys(
        [
            "RunValues",
            "find_run_values",
            "find_runs",
        ],
        "._run_values",
    ),
    **dict.fromkeys(
        [
            "check_same_data",
            "data_columns",
            "data_note",
            "log_data_inputs",
            "trial_inputs",
        ],
        "._lineage",
    ),
    **dict.fromkeys(
        [
            "objective_curves",
        ],
        "._curves",
    ),
    **dict.fromkeys(
        [
            "FLAT_SAMPLERS",
            "METRICS_ATTR",
            "OPTUNA_FILE",
            "STUDY_ID_ATTR",
            "TUNE_TRIAL_ATTR",
            "bind_study",
            "conditional_grid",
            "constraint_values",
            "define_by_run",
            "distributions",
            "ended_state",
            "flat_params",
            "found_study",
            "make_sampler",
            "open_optuna_study",
            "optuna_copy_callbacks",
            "optuna_storage_url",
            "persist_ended",
            "pull_optuna_copy",
            "push_optuna_copy",
            "quiet_optuna",
            "record_trial",
            "recorded_ids",
            "register_running",
            "sqlite_url",
            "study_id_conflict",
        ],
        "._optuna",
    ),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
