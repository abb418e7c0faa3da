"""Ray Tune's `OptunaSearch` for a study with ``search.constraints``: before an ended trial is
told to Optuna, its constraint values are set on it with `optuna.trial.Trial.set_constraint`
(`calibtune.record._optuna.constraint_values`), where TPE, NSGA-II and GP read them. Without
constraints it is `OptunaSearch` unchanged. ``history``: the Optuna trials of the study's earlier
rounds (`calibtune.study._extend`), added to its in-memory study before the first suggestion, so
that an extended study's sampler continues from them. Imports Ray: imported by the study driver
only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ray.tune.search.optuna import OptunaSearch

from calibtune.record import METRICS_ATTR, constraint_values
from calibtune.studyfile import Constraint

__all__ = ["ConstrainedOptunaSearch"]


class ConstrainedOptunaSearch(OptunaSearch):
    """`OptunaSearch` plus ``constraints`` (picklable: Tune saves searchers with the study)."""

    def __init__(
        self,
        *args: Any,
        constraints: tuple[Constraint, ...] = (),
        history: Sequence[Any] = (),
        **kwargs: Any,
    ):
        self._history = list(history)  # read by `_setup_study`, which `__init__` calls
        super().__init__(*args, **kwargs)
        self.constraints = tuple(constraints)

    def _setup_study(self, mode: Any) -> None:
        super()._setup_study(mode)
        history, self._history = getattr(self, "_history", []), []  # pickled empty
        self._ot_study.add_trials(history)

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
