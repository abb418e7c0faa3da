"""One trial: a validated config run through Ray Train, with reports, checkpoints and artifacts.

`run(config)` is what ``calibtune train`` and the study service call; `load_config` reads the
trial YAML format documented in ``docs/trial.md``.
"""

from calibtune.trial import _config, _driver
from calibtune.trial._checkpoint import load_state, save_state

# the public names of the config and driver modules are their own __all__
from calibtune.trial._config import *  # noqa: F403
from calibtune.trial._driver import *  # noqa: F403
from calibtune.trial._placement import (
    TAG_WORKER_NODES,
    check_placement_on_cluster,
    worker_bundle,
    worker_nodes_tag,
)

__all__ = [
    "TAG_WORKER_NODES",
    "check_placement_on_cluster",
    "load_state",
    "save_state",
    "worker_bundle",
    "worker_nodes_tag",
]
__all__ += _config.__all__
__all__ += _driver.__all__
