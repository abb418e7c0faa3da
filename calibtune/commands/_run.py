"""`calibtune run` and `calibtune resume`: a study searched (or restored) on Ray, then its
outcome as a table and an exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from calibtune._usage import usage
from calibtune.cluster import preflight_resume, preflight_run
from calibtune.readers import compare_table, format_table, locate_study
from calibtune.record import check_artifact_store, resolve_tracking_uri
from calibtune.study import SIGNAL_EXIT, STORAGE_FULL_EXIT, resume_study, run_study
from calibtune.studyfile import load_study, study_from_text

__all__ = ["TRIALS_FAILED_EXIT", "resume", "run"]


def _setup_line(
    study: Any, address: str | None, tracking_uri: str | None, more: int | None = None
) -> None:
    s = study.search
    where = f"Ray at {address}" if address else "a local Ray"
    uri = tracking_uri or study.tracking.uri or "sqlite:///mlflow.db"
    trials = f"{more} more trials" if more else f"{s.num_samples} trials"
    print(
        f"[calibtune] study {study.name}: {trials}, {_at_a_time(s.max_concurrent)} "
        f"on {where}; MLflow {uri}",
        flush=True,
    )


def _at_a_time(n: int | str) -> str:
    return "as many at a time as the cluster holds" if n == "auto" else f"{n} at a time"


def _print_outcome(outcome: Any) -> None:
    ref = locate_study(outcome.storage)
    table = compare_table(ref)
    c = outcome.counts
    print(
        f"\nstudy {outcome.name}: {c.get('finished', 0)} finished, {c.get('failed', 0)} failed, "
        f"{c.get('stopped', 0)} stopped early, {c.get('unfinished', 0)} not run (best first)"
    )
    if not table.empty:
        print(format_table(table, "markdown"))
    print(
        f"MLflow: {outcome.tracking_uri} (experiment id {outcome.experiment_id}, parent run "
        f"{outcome.parent_run_id})"
    )
    print(f"see them in the MLflow UI:  calibtune ui --tracking-uri {outcome.tracking_uri}")
    print(f"export the best config:     calibtune export {outcome.storage} --top 1")


#: `run`/`resume`: every trial ended and one finished, but some failed for good (their own
#: error, or a lost node or process past ``search.max_failures`` retries)
TRIALS_FAILED_EXIT = 3


def _exit_code(outcome: Any, command: str = "run") -> int:
    """0 only when every trial ended (finished, or stopped early by the scheduler) and at least
    one finished; 3 (`TRIALS_FAILED_EXIT`) when so but some trials failed for good; 1 when none
    finished or some are left unfinished; 130/143 after SIGINT/SIGTERM (state saved); 75 when
    the storage filled up (state saved: free space, then resume)."""
    if outcome.storage_full:
        print(f"calibtune {command}: {outcome.stopped_by}", file=sys.stderr)
        return STORAGE_FULL_EXIT
    resume = f"`calibtune resume {outcome.storage}`"
    if outcome.stopped_by in SIGNAL_EXIT:
        print(
            f"calibtune: study {outcome.name} stopped by {outcome.stopped_by}; its state is "
            f"saved: continue it with {resume}",
            file=sys.stderr,
        )
        return SIGNAL_EXIT[outcome.stopped_by]
    if outcome.stopped_by:
        print(f"calibtune: {outcome.stopped_by}", file=sys.stderr)
        return 1
    if outcome.budget_note:  # the budget the study file set: not a failure
        print(f"calibtune: {outcome.budget_note}", file=sys.stderr)
        return 0 if outcome.counts.get("finished", 0) > 0 else 1
    if outcome.counts.get("unfinished", 0) > 0:
        print(
            f"calibtune: study {outcome.name}: expected {outcome.counts['unfinished']} more "
            f"trials to end, found them unfinished; continue with {resume}",
            file=sys.stderr,
        )
        return 1
    if outcome.counts.get("finished", 0) == 0:
        return 1
    if (failed := outcome.counts.get("failed", 0)) > 0:
        print(
            f"calibtune: study {outcome.name}: expected every trial to finish, found {failed} "
            f"failed for good (reasons: `calibtune compare {outcome.storage}`)",
            file=sys.stderr,
        )
        return TRIALS_FAILED_EXIT
    return 0


def run(args: argparse.Namespace) -> int:
    with usage(args.study):
        if args.study_env:
            study = study_from_text(os.environ[args.study_env], f"submitted {args.study_env}")
        elif args.study:
            study = load_study(args.study)
        else:
            raise ValueError("STUDY.yaml: expected a study file, got none")
        # bad paths, stores and addresses stop here, before Ray starts or anything is written
        preflight_run(
            study, address=args.address, tracking_uri=args.tracking_uri, storage=args.storage
        )
        check_artifact_store(  # a server's artifact store: written once, before any trial
            resolve_tracking_uri(args.tracking_uri or study.tracking.uri),
            study.experiment,
            "--tracking-uri" if args.tracking_uri else "tracking.uri",
        )
        _setup_line(study, args.address, args.tracking_uri, args.more)
        outcome = run_study(
            study,
            address=args.address,
            tracking_uri=args.tracking_uri,
            storage=args.storage,
            verbose=1 if args.verbose else 0,
            more=args.more or 0,
            wait_for_resources=args.wait_for_resources,
        )
    _print_outcome(outcome)
    return _exit_code(outcome)


def resume(args: argparse.Namespace) -> int:
    with usage():
        preflight_resume(args.study, address=args.address, storage=args.storage)
        outcome = resume_study(
            args.study,
            address=args.address,
            storage=args.storage,
            verbose=1 if args.verbose else 0,
            wait_for_resources=args.wait_for_resources,
        )
    _print_outcome(outcome)
    return _exit_code(outcome, "resume")
