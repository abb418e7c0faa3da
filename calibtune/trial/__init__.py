"""One trial: a validated config run through Ray Train, with reports, checkpoints and artifacts.

`run(config)` is what ``calibtune train`` and the study service call; `load_config` reads the
trial YAML format documented in ``docs/trial.md``.
"""

from calibtune.trial._checkpoint import load_state, save_state
from calibtune.trial._config import (
    DataConfig,
    EvalConfig,
    LossConfig,
    ModelConfig,
    OptimizerConfig,
    ScalingConfig,
    ScheduleConfig,
    TrainConfig,
    TrialConfig,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)
from calibtune.trial._driver import (
    TrialCallback,
    TrialFailedError,
    TrialResult,
    check_data_files,
    check_resources,
    run,
)
from calibtune.trial._placement import (
    TAG_WORKER_NODES,
    check_placement_on_cluster,
    worker_nodes_tag,
)

__all__ = [
    "TAG_WORKER_NODES",
    "DataConfig",
    "EvalConfig",
    "LossConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ScalingConfig",
    "ScheduleConfig",
    "TrainConfig",
    "TrialCallback",
    "TrialConfig",
    "TrialFailedError",
    "TrialResult",
    "apply_overrides",
    "check_data_files",
    "check_placement_on_cluster",
    "check_resources",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "load_state",
    "run",
    "save_config",
    "save_state",
    "worker_nodes_tag",
]
