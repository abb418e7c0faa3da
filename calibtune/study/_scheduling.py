"""The study's Tune trial scheduler: FIFO or ASHA, and never a trial started before Tune's
experiment state on disk knows it.

Tune saves its experiment state (trials, searcher state) every 10 s or more, so a trial added
and started between two saves is unknown to a driver that was killed before the next one:
``Tuner.restore`` would sample a replacement, leaving the started trial's MLflow run and Optuna
trial orphaned (and its work lost). `DurableStarts` forces a save, synchronously, the first time
the scheduler is asked which trial to run after new trials were added; Tune starts a trial's
actor only after that call in the same step, and the trainable only once the actor has started.
The cost is one state save per batch of new trials. A save that hit a full disk (ENOSPC,
`calibtune.study._diskfull`) starts nothing: it ends Tune's run with `StorageFullError` (Tune
stops the running trials, as a killed driver would) and `resume` continues from the last save.
"""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from calibtune._failpoints import failpoint
from calibtune.study._config import StudyConfig
from calibtune.study._diskfull import StorageFullError, storage_full

# Imported by `_search` only when a study runs (this module loads Ray). The scheduler travels in
# Tune's pickled tuner state, so its classes live at module level.

__all__ = ["DurableASHAScheduler", "DurableFIFOScheduler", "DurableStarts", "make_scheduler"]


class DurableStarts:
    """Mixin for a Tune ``TrialScheduler``: `choose_trial_to_run` first saves Tune's experiment
    state (``checkpoint(force=True, wait=True)``) whenever the controller holds a trial no save
    has seen yet (Tune only appends to its trial list, so its length says so)."""

    _saved_trials = 0  # trials in the controller at the last forced save (0 after a restore)

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        known = len(tune_controller.get_trials())
        if known > self._saved_trials:
            # The scheduler only gets a facade of the controller; saving is not on its list.
            controller = getattr(tune_controller, "_tune_controller", tune_controller)
            failpoint("before_start_save")
            controller.checkpoint(force=True, wait=True)
            if storage_full(controller.experiment_path):
                # Tune starts every pending trial after this call whatever it returns; an error
                # ends the step (and the run: `calibtune.study._diskfull`) before any starts
                raise StorageFullError(controller.experiment_path)
            self._saved_trials = known
        return super().choose_trial_to_run(tune_controller)  # type: ignore[misc]


class DurableFIFOScheduler(DurableStarts, FIFOScheduler):
    """Tune's FIFO scheduler with `DurableStarts`."""


class DurableASHAScheduler(DurableStarts, ASHAScheduler):
    """Tune's ASHA scheduler with `DurableStarts`."""


def make_scheduler(study: StudyConfig) -> Any:
    """ASHA over ``training_iteration`` (= epochs) when ``search.scheduler: asha``, else FIFO;
    both with `DurableStarts`."""
    if study.search.scheduler != "asha":
        return DurableFIFOScheduler()
    epochs = study.base_config().train.epochs
    return DurableASHAScheduler(
        time_attr="training_iteration",
        max_t=epochs,
        grace_period=min(study.search.grace_period, epochs),
    )
