"""Ray Tune's `OptunaSearch` for a study with ``search.constraints``: before an ended trial is
told to Optuna, its constraint values are set on it with `optuna.trial.Trial.set_constraint`
(`calibtune.study._optuna.constraint_values`), where TPE, NSGA-II and GP read them. Without
constraints it is `OptunaSearch` unchanged. Imports Ray: imported by the study driver only."""

from __future__ import annotations

from typing import Any

from ray.tune.search.optuna import OptunaSearch

from calibtune.study._constraints import Constraint
from calibtune.study._optuna import METRICS_ATTR, constraint_values

__all__ = ["ConstrainedOptunaSearch"]


class ConstrainedOptunaSearch(OptunaSearch):
    """`OptunaSearch` plus ``constraints`` (picklable: Tune saves searchers with the study)."""

    def __init__(self, *args: Any, constraints: tuple[Constraint, ...] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.constraints = tuple(constraints)

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        ended = trial_id in self._completed_trials
        constraints = getattr(self, "constraints", ())  # absent in searchers saved before
        if constraints and ot_trial is not None and result and not error and not ended:
            trials = self._ot_study.get_trials(deepcopy=False)
            label = ot_trial.params.get("loss")
            metrics, values = constraint_values(constraints, label, result, trials)
            ot_trial.set_user_attr(METRICS_ATTR, metrics)
            for name, value in values.items():
                ot_trial.set_constraint(name, value)
        super().on_trial_complete(trial_id, result, error)
