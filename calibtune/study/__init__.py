"""The study service: YAML studies and search spaces, Ray Tune + Optuna search, MLflow runs.

`load_study` validates a study file into a frozen `StudyConfig`; `run_study` searches it with
Ray Tune's `OptunaSearch` over the trial engine; `resume_study` restores an interrupted study;
`calibtune.study._results` reads studies back from MLflow (compare, report, export).
"""

from ._config import Objective, SearchConfig, StudyConfig, StudyError, load_study, parse_study
from ._results import (
    StudyNotFoundError,
    compare_table,
    export_best,
    locate_study,
    report_table,
    trials_frame,
)
from ._search import StudyOutcome, resume_study, run_study
from ._spaces import LossSpace, Space, SpaceError, load_loss_space, parse_loss_space
from ._studydir import StudyDir, StudyDirError, StudyLockedError
from ._tracking import default_tracking_uri, mlflow_metric_name

__all__ = [
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
    "StudyNotFoundError",
    "StudyOutcome",
    "compare_table",
    "default_tracking_uri",
    "export_best",
    "load_loss_space",
    "load_study",
    "locate_study",
    "mlflow_metric_name",
    "parse_loss_space",
    "parse_study",
    "report_table",
    "resume_study",
    "run_study",
    "trials_frame",
]
