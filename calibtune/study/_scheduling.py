"""The study's Tune trial scheduler: FIFO or ASHA, and never a trial started before Tune's
experiment state on disk knows it.

Tune saves its experiment state (trials, searcher state) every 10 s or more, so a trial added
and started between two saves is unknown to a driver that was killed before the next one:
``Tuner.restore`` would sample a replacement, leaving the started trial's MLflow run and Optuna
trial orphaned (and its work lost). `DurableStarts` forces a save, synchronously, the first time
the scheduler is asked which trial to run after new trials were added; Tune starts a trial's
actor only after that call in the same step, and the trainable only once the actor has started.
The cost is one state save per batch of new trials. A save that hit a full disk (ENOSPC,
`calibtune.studyfile._diskfull`) starts nothing: it ends Tune's run with `StorageFullError` (Tune
stops the running trials, as a killed driver would) and `resume` continues from the last save.

A trial whose process or node was lost (a preempted or drained node, a killed raylet, an
out-of-memory kill) is what Tune's ``max_failures`` retries, from the trial's last checkpoint; a
trial's own error (bad input, a non-finite loss, a bug in its code: `retryable`) would fail the
same way again, so `DurableStarts` ends it at once instead of letting Tune requeue it. A storage
or network hiccup inside the trial (`TRANSIENT`: an S3 SlowDown, a connection reset, an expired
token, an NFS stale handle; `calibtune.trial._errors.transient_io`) is retried the same way,
after a backoff; a full disk is not one (the study stops for it). Tune tells the searcher
(Optuna) and the callbacks only of the final outcome, after the retries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.exceptions import RayActorError
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from calibtune._failpoints import failpoint
from calibtune.record import register_running
from calibtune.storage import Storage
from calibtune.studyfile import StorageFullError, StudyConfig, storage_full

# The scheduler travels in Tune's pickled tuner state, so its classes live at module level.

__all__ = [
    "STARTS",
    "TRANSIENT",
    "DurableASHAScheduler",
    "DurableFIFOScheduler",
    "DurableStarts",
    "compact_metadata",
    "first_waiting",
    "make_scheduler",
    "retryable",
]

#: a lost process or node, in the text of a trial's error (Ray's wording, the remote traceback's
#: exception names): retried even when the trial's own code raised after it (a DDP rank whose
#: peer's node died fails its collective)
LOST = (
    "RayActorError",
    "ActorDiedError",
    "ActorUnavailableError",
    "NodeDiedError",
    "WorkerCrashedError",
    "OwnerDiedError",
    "ObjectLostError",
    "was preempted",
    "node was terminated",
    "The actor died unexpectedly",
)
#: a storage or network hiccup inside a trial (`calibtune.trial._errors.TransientIOError`, raised
#: after its backoff): retried from the trial's last checkpoint like a lost node
TRANSIENT = ("TransientIOError",)
#: the trial's own errors (`calibtune.trial._errors.failure`, `calibtune.trial._driver`): bad
#: input, divergence, an unexpected error inside the training loop; deterministic, not retried
OWN = (
    "NonFiniteLossError",
    "non-finite loss at epoch",
    "TrialStepError",
    "DatasetNotFoundError",
    "ValueError: ",
    "No space left on device",  # the study stops for a full disk (`_diskfull`), then resumes
)


def retryable(error: BaseException | str | None) -> bool:
    """Whether a trial that failed with ``error`` (Tune's pickled error, else the text of its
    error file) should be retried: yes for a lost process or node (`LOST`: Ray's actor and node
    errors), a storage hiccup (`TRANSIENT`) and an error of unknown kind, no for the trial's own
    errors (`OWN`).

    >>> retryable("ray.exceptions.ActorDiedError: The actor died unexpectedly")
    True
    >>> retryable("TrialFailedError: non-finite loss at epoch 1, step 3")
    False
    >>> retryable("calibtune.trial._errors.TransientIOError: OSError: AWS Error SLOW_DOWN ...")
    True
    >>> retryable(None)
    True
    """
    if isinstance(error, RayActorError):
        return True
    text = "" if error is None else str(error)
    if any(marker in text for marker in LOST + TRANSIENT):
        return True
    return not any(marker in text for marker in OWN)


def last_error(trial: Any) -> BaseException | str | None:
    """The trial's latest error, from the files Tune has just written in the trial's local
    folder (the storage's copy comes later): Tune's pickle of it, else the last entry of its
    error text."""
    import cloudpickle

    try:
        if trial.pickled_error_file and Path(trial.pickled_error_file).is_file():
            return cloudpickle.loads(Path(trial.pickled_error_file).read_bytes())
        if trial.error_file and Path(trial.error_file).is_file():
            return Path(trial.error_file).read_text().split("Failure # ")[-1]
    except Exception:  # an unreadable error file (a full disk): treat the error as unknown
        pass
    return None


def error_line(error: BaseException | str | None) -> str:
    r"""One line of a trial's error for the progress output.

    >>> error_line("Failure # 1\nTraceback ...\nray.exceptions.ActorDiedError: The actor died")
    'ray.exceptions.ActorDiedError: The actor died'
    """
    if error is None:
        return "no details"
    lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(error).__name__)[:200]


class DurableStarts:
    """Mixin for a Tune ``TrialScheduler``: no trial starts before a resume could find it, at a
    cost per start that does not grow with the study (issue 29).

    `choose_trial_to_run` (Tune starts a trial only after it, in the same step) first writes
    each trial the controller holds that no record has seen yet to `STARTS`
    (``<round>/<trial id>.json``: Tune's own JSON state of the trial, a few kB, atomically) — an
    append-only record, where Tune's experiment state (every trial, the searcher's whole
    study) would be rewritten at every start. Tune's full save is forced once per session, at
    its first start (a study killed before Tune's first periodic save must have a state to
    resume from). After a restore, the first call adds back every recorded trial that the
    restored state lacks (started after Tune's last save), under its own id and config: it
    continues its MLflow run and checkpoints (`replay`)."""

    _saved_trials = 0  # trials in the controller at the last record (0 after a restore)
    _recorded: set[str] | None = None  # trial ids with a start record (None: not read yet)
    _doomed: dict[str, Any] | None = None  # requeued trials whose error was their own
    #: metrics whose running summary a finished trial keeps (`compact_metadata`); None (a
    #: scheduler pickled before it existed): every metric's, as Tune keeps them
    kept_metrics: frozenset[str] | None = None

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict) -> None:
        super().on_trial_complete(tune_controller, trial, result)  # type: ignore[misc]
        if self.kept_metrics is not None:
            compact_metadata(trial, self.kept_metrics)
            controller = getattr(tune_controller, "_tune_controller", tune_controller)
            mark = getattr(controller, "_mark_trial_to_checkpoint", None)
            if mark is not None:  # Tune's cached JSON of the trial is rebuilt at its next save
                mark(trial)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        # Tune calls this when it gives a trial up (the trial still RUNNING) and, the trial
        # already stopped (ERROR), just before it requeues the trial for a retry
        if trial.status == "ERROR":
            error = last_error(trial)
            if not retryable(error):
                self._doomed = {**(self._doomed or {}), trial.trial_id: error}
        super().on_trial_error(tune_controller, trial)  # type: ignore[misc]

    def _fail_own_errors(self, controller: Any) -> None:
        """End the requeued trials whose error was their own before anything starts them: as
        Tune ends a trial out of retries (the searcher, the scheduler, the callbacks told)."""
        doomed, self._doomed = self._doomed or {}, None
        for trial in controller.get_trials():
            if trial.trial_id in doomed and trial.status == "PENDING":
                error = doomed[trial.trial_id]
                exc = error if isinstance(error, BaseException) else RuntimeError(error)
                controller._process_trial_failure(trial, exception=exc)

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        # The scheduler only gets a facade of the controller; saving is not on its list.
        controller = getattr(tune_controller, "_tune_controller", tune_controller)
        if self._doomed:
            self._fail_own_errors(controller)
        if self._recorded is None:  # the session's first call: after a restore, or the first
            self._recorded = replay(controller, starts_folder(controller))
            controller.checkpoint(force=True, wait=True)
            self._check_full(controller)
        trials = controller.get_trials()
        if len(trials) > self._saved_trials:
            failpoint("before_start_save")
            folder = starts_folder(controller)
            try:  # Tune appends new trials (a retried one moves to the end, recorded already)
                for trial in trials[self._saved_trials :]:
                    if trial.trial_id not in self._recorded:
                        record_start(folder, trial)
                        self._recorded.add(trial.trial_id)
            except OSError:
                self._check_full(controller)  # a full disk (noted by the write): StorageFullError
                raise
            self._check_full(controller)
            self._saved_trials = len(trials)
        return first_waiting(controller, super().choose_trial_to_run, tune_controller)

    @staticmethod
    def _check_full(controller: Any) -> None:
        if storage_full(controller.experiment_path):
            # Tune starts every pending trial after this call whatever it returns; an error
            # ends the step (and the run: `calibtune.studyfile._diskfull`) before any starts
            raise StorageFullError(controller.experiment_path)


def first_waiting(controller: Any, fallback: Any, facade: Any) -> Any:
    """The trial Tune's FIFO choice (`FIFOScheduler.choose_trial_to_run`, ASHA's too) returns —
    the first PENDING trial in the controller's order, else the first PAUSED — found among the
    controller's pending and paused trials instead of a pass over every trial at every step of
    the event loop; ``fallback(facade)`` (Tune's own) on a controller without those sets."""
    pending = getattr(controller, "_pending_trials", None)
    paused = getattr(controller, "_paused_trials", None)
    if pending is None or paused is None:
        return fallback(facade)
    trials = controller.get_trials()
    for waiting, status in ((pending, "PENDING"), (paused, "PAUSED")):
        found = [t for t in waiting if t.status == status]
        if found:  # ``list.index`` compares by identity first: a C loop, not a Python one
            return min(found, key=trials.index)
    return None


def compact_metadata(trial: Any, keep: frozenset[str]) -> None:
    """Drop a finished trial's running summaries (Tune's ``metric_analysis``: min, max, mean and
    the last-5/10 means of every reported metric, with their windows) except ``keep``'s. Tune
    writes every trial's into its experiment state at each save; with the ≈ 200 metrics a trial
    reports they were 127 of a finished trial's 146 kB, so that each save and its upload grew by
    that much per trial already run (issue 29, bench/README.md). Its last result
    (what `ResultGrid` reports) stays, so do the kept metrics' summaries (`get_best_result` of
    an objective)."""
    meta = trial.run_metadata
    meta.metric_analysis = {k: v for k, v in meta.metric_analysis.items() if k in keep}
    meta.metric_n_steps = {k: v for k, v in meta.metric_n_steps.items() if k in keep}


#: the study folder's record of trial starts: ``<round>/<trial id>.json`` per trial
STARTS = "trial_starts"


def starts_folder(controller: Any) -> Any:
    """``STARTS/<round>`` in the experiment folder, as a `calibtune.storage.Storage` on Tune's
    storage file system. ``<round>``: the timestamp Tune gives a run and restores with it (an
    extension's new round in the same folder, `calibtune.study._extend`, has its own, so its
    resume never replays the ended trials of the rounds before)."""
    fs, path = controller._storage.storage_filesystem, controller.experiment_path
    scheme = "" if Path(path).is_absolute() and Path(path).is_dir() else fs.type_name
    return Storage(fs, path, scheme) / STARTS / str(controller._storage._timestamp)


def record_start(folder: Any, trial: Any) -> None:
    """Write ``trial``'s start record (Tune's JSON state of it), atomically."""
    state, _ = trial.get_json_state()
    (folder / f"{trial.trial_id}.json").write_text(state)


def replay(controller: Any, folder: Any) -> set[str]:
    """Add back the recorded trials that the controller's (restored) state lacks, as Tune
    restores a trial (`TuneController._restore_trials`), pending, registered with the searcher
    under their own id and config; returns every recorded trial id and the controller's."""
    import copy

    import ray
    from ray.tune.experiment import Trial

    present = {t.trial_id for t in controller.get_trials()}
    names = folder.listdir() if folder.exists() else []
    recorded = {name[: -len(".json")] for name in names if name.endswith(".json")}
    for trial_id in sorted(recorded - present):
        trial = Trial.from_json_state((folder / f"{trial_id}.json").read_text())
        storage = copy.copy(trial.storage)
        storage.storage_filesystem = controller._storage.storage_filesystem
        storage.storage_fs_path = controller._storage.storage_fs_path
        storage.experiment_dir_name = controller._storage.experiment_dir_name
        trial.set_storage(storage)
        if not ray.util.client.ray.is_connected():
            trial.init_local_path()
        trial.set_status("PENDING")
        _register(controller._search_alg, trial)
        controller.add_trial(trial)
    if recorded - present and hasattr(controller._search_alg, "_counter"):
        # every trial of the round is one sample of its searcher, however old or new the
        # searcher's saved state is against the trial list's (a full disk can stop a save
        # between the two files): counting the replayed ones on top would end the round early
        controller._search_alg._counter = len(controller.get_trials())
    return recorded | present


def _register(search_alg: Any, trial: Any) -> None:
    """Tell the searcher of a replayed trial what its restored state lacks: live in the
    `ConcurrencyLimiter`, a running Optuna trial with its parameters
    (`calibtune.record._optuna.register_running`) unless the searcher's state, saved after the
    trial started, already maps it (a second Optuna trial would be left RUNNING for good)."""
    limiter = getattr(search_alg, "searcher", None)
    inner = getattr(limiter, "searcher", limiter)
    if hasattr(limiter, "live_trials"):
        limiter.live_trials.add(trial.trial_id)
    known = getattr(inner, "_ot_trials", None)
    if known is not None and trial.trial_id not in known:
        register_running(inner, trial.trial_id, trial.config)


class DurableFIFOScheduler(DurableStarts, FIFOScheduler):
    """Tune's FIFO scheduler with `DurableStarts`."""


class DurableASHAScheduler(DurableStarts, ASHAScheduler):
    """Tune's ASHA scheduler with `DurableStarts`."""


def make_scheduler(study: StudyConfig) -> Any:
    """ASHA over ``training_iteration`` (= epochs) when ``search.scheduler: asha``, else FIFO;
    both with `DurableStarts`, a finished trial keeping the objectives' summaries only."""
    scheduler: DurableStarts
    if study.search.scheduler != "asha":
        scheduler = DurableFIFOScheduler()
    else:
        epochs = study.base_config().train.epochs
        scheduler = DurableASHAScheduler(
            time_attr="training_iteration",
            max_t=epochs,
            grace_period=min(study.search.grace_period, epochs),
        )
    scheduler.kept_metrics = frozenset(o.metric for o in study.search.objectives)
    return scheduler
