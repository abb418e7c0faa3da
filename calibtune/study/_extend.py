"""Extending a finished study with more trials (``calibtune run STUDY --more N``, or ``calibtune
run STUDY`` after raising ``search.num_samples`` in the study file: `added_samples`).

The extension is a new round of Ray Tune in the same study folder (a fresh ``Tuner`` under the
same name: its own ``experiment_state-*.json``, which `resume` restores as the newest, and its
own trial ids), so no finished trial is ever trained again. It continues the same record:
- Optuna: the sampler's in-memory study starts from every ended trial of the persisted Optuna
  study (`optuna_history`: values, ASHA-pruned trials' curves, constraints), and the new trials
  are appended to that persisted study;
- MLflow: the same parent run, reopened, with the new trials as its further children;
- the study copy in the folder: ``search.num_samples`` becomes the total (`extended_study`), so
  ``status``/counters compare the trials that ended with all that were asked for.
"""

from __future__ import annotations

from typing import Any

from calibtune._yaml import load_text
from calibtune.readers import load_optuna_study, rdb_storage
from calibtune.record import child_statuses
from calibtune.studyfile import (
    StudyConfig,
    StudyDir,
    StudyDirError,
    StudyState,
    self_contained,
    study_from_text,
)

__all__ = ["added_samples", "check_extendable", "extended_study", "optuna_history"]

ENDED = ("finished", "failed", "stopped")


def check_extendable(study: StudyConfig, sd: StudyDir, state: StudyState, more: int) -> None:
    """Refuse, in one line, an extension that cannot continue the study: ``more`` < 1, a grid
    (its points have all run), or a study whose trials have not all ended (resume it first)."""
    if more < 1:
        raise StudyDirError(f"--more: expected an integer >= 1 (trials to add), got {more}")
    if study.search.sampler == "grid":
        raise StudyDirError(
            f"study {study.name}: search.sampler: expected a sampler that can draw more trials, "
            "got 'grid' (every grid point has run); run a new study to search further"
        )
    statuses = child_statuses(state.tracking_uri, state.experiment_id, state.parent_run_id)
    ended = sum(s in ENDED for s in statuses.values())
    if ended < study.search.num_samples:
        raise StudyDirError(
            f"study {study.name}: expected all {study.search.num_samples} trials ended before "
            f"adding more, found {ended}; finish them with `calibtune resume {sd.path}` first"
        )


def added_samples(study: StudyConfig, saved: StudyConfig) -> int:
    """Trials a study file run again asks for beyond its saved copy ``saved`` (the study as it
    ran): its ``search.num_samples`` minus the copy's when it differs from the copy in nothing
    else (search spaces inlined, as saved); else 0 (the run continues the saved study)."""
    extra = study.search.num_samples - saved.search.num_samples
    if extra <= 0:
        return 0
    return extra if _without_count(self_contained(study)) == _without_count(saved.text) else 0


def _without_count(text: str) -> str:
    import yaml

    raw = load_text(text, "study")
    if isinstance(raw.get("search"), dict):
        raw["search"].pop("num_samples", None)
    return yaml.safe_dump(raw, sort_keys=True)


def extended_study(study: StudyConfig, more: int) -> StudyConfig:
    """``study`` (its self-contained copy, as it ran) with ``more`` trials added to
    ``search.num_samples``, re-validated like any study file."""
    raw = load_text(study.text, "study")
    raw.setdefault("search", {})["num_samples"] = study.search.num_samples + more
    import yaml

    return study_from_text(yaml.safe_dump(raw, sort_keys=False), f"study {study.name}")


def optuna_history(study: StudyConfig, storage_url: str) -> list[Any]:
    """Every ended trial of the study's persisted Optuna study (COMPLETE, PRUNED, FAIL), for the
    new round's sampler (`calibtune.study._constrained.ConstrainedOptunaSearch`)."""
    import optuna

    ot_study = load_optuna_study(study.name, rdb_storage(storage_url))
    if ot_study is None:
        return []
    states = (
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.PRUNED,
        optuna.trial.TrialState.FAIL,
    )
    return ot_study.get_trials(deepcopy=True, states=states)
