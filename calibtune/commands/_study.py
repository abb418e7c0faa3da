"""The study-service subcommands of ``calibtune`` (argument parsing only).

run, submit, resume, status, logs, compare, report, export, ui, dashboard. Bad input (a malformed
study, an unknown study, a missing dataset) is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibtune._commands import Command, arg
from calibtune._usage import usage
from calibtune.cluster import (
    check_dir,
    check_out_file,
    check_tracking_uri,
    follow,
    job_client,
    preflight_resume,
    preflight_run,
    quiet_output,
    submission,
    submit_job,
)
from calibtune.readers import check_port_free, port_number, start_dashboard, start_ui, stop_ui
from calibtune.record import check_artifact_store, resolve_tracking_uri
from calibtune.studyfile import StudyDir

# Lazy: `_config` (Optuna), `_results` (pandas) and `_search` (Ray, torch) are imported by the
# subcommands that use them, so that `calibtune --help` and compare/report/export start fast
# (bench/bench_cli.py).

# ------------------------------------------------------------------------------- shared options

TRACKING = arg(
    "--tracking-uri",
    help="MLflow tracking URI (default: the study's tracking.uri, else sqlite:///<cwd>/mlflow.db)",
)
STORAGE = arg(
    "--storage",
    metavar="PATH",
    help="directory holding study state (default: the study's storage:, else ./runs/studies)",
)
RAY_ADDRESS = arg("--address", help="Ray cluster address (default: start a local Ray)")


def _wait_duration(text: str) -> float:
    """argparse type of ``--wait-for-resources``: seconds (`parse_duration`)."""
    from calibtune.cluster import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


WAIT_FOR_RESOURCES = arg(
    "--wait-for-resources",
    type=_wait_duration,
    metavar="DURATION",
    help="on a cluster that grows: wait up to DURATION (600, 90s, 10m, 1h30m, 10:00) for nodes "
    "that hold a trial before refusing (default: 10m when the cluster has an autoscaler, else "
    "none)",
)
DASHBOARD_ADDRESS = arg("--address", help="Ray dashboard address, e.g. http://HEAD:8265")
VERBOSITY = (
    arg(
        "--verbose",
        action="store_true",
        help="show Ray's own output (Tune's tables, Ray's logs, worker logs)",
    ),
    arg("--quiet", action="store_true", help="the default (kept for old scripts)"),
)
FORMAT = arg("--format", choices=("markdown", "csv"), default="markdown")
PORT = arg("--port", type=port_number, help="port 1-65535 (default: a free one)")
JOB_ID = arg("job_id", metavar="JOB_ID")


# ------------------------------------------------------------------------------- run


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
    from calibtune.readers import compare_table, format_table, locate_study

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
    from calibtune.study import SIGNAL_EXIT, STORAGE_FULL_EXIT

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


def _cmd_run(args: argparse.Namespace) -> int:
    from calibtune.study import run_study
    from calibtune.studyfile import load_study

    if not args.verbose:
        quiet_output()  # before the preflight opens the store (MLflow logs its migrations)
    with usage(args.study):
        if args.study_env:
            from calibtune.studyfile import study_from_text

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


def _trial_count(text: str) -> int:
    """argparse type of ``--more``: an integer >= 1."""
    n = int(text) if text.strip().isdigit() else 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (trials to add), got {text!r}")
    return n


# ------------------------------------------------------------------------------- resume


def _cmd_resume(args: argparse.Namespace) -> int:
    from calibtune.study import resume_study

    if not args.verbose:
        quiet_output()
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


# ------------------------------------------------------------------------------- tables


def _finished_study(args: argparse.Namespace) -> tuple[Any, Any]:
    """The `StudyRef` of compare/report/export and its trials (`trials_frame`, unfinished ones
    included: the command's one MLflow query): its tracking store checked (exists, answers) and
    holding at least one finished trial; else a one-line ValueError."""
    from calibtune.readers import locate_study, trials_frame

    if args.tracking_uri:
        uri = resolve_tracking_uri(args.tracking_uri)
        check_tracking_uri(uri, "--tracking-uri", must_exist=True)
    ref = locate_study(args.study, args.storage, args.tracking_uri)
    if not args.tracking_uri:
        check_tracking_uri(ref.tracking_uri, f"study {ref.name}: tracking_uri", must_exist=True)
    trials = trials_frame(ref, include_unfinished=True)
    counts = trials["status"].value_counts().to_dict() if not trials.empty else {}
    if not counts.get("finished"):
        seen = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no trials"
        raise ValueError(f"study {ref.name}: expected finished trials, found none yet ({seen})")
    return ref, trials


def _cmd_compare(args: argparse.Namespace) -> int:
    from calibtune.readers import compare_table, format_table

    with usage():
        ref, trials = _finished_study(args)
        metrics = [m.strip() for m in args.metrics.split(",")] if args.metrics else None
        table = compare_table(ref, metrics, args.sort, trials=trials)
    print(format_table(table, args.format), end="")
    _data_note(trials[trials["trial_id"].isin(table["trial_id"])])
    return 0


def _data_note(trials: Any) -> None:
    """Data lineage: one line on stderr when the table's trials saw different data."""
    from calibtune.record import data_note

    if note := data_note(trials.to_dict("records")):
        print(f"calibtune: {note}", file=sys.stderr)


def _cmd_report(args: argparse.Namespace) -> int:
    from calibtune.readers import format_table, report_table

    with usage():
        out = check_out_file(args.out, "--out") if args.out else None
        ref, trials = _finished_study(args)
        if args.baseline is not None:
            from calibtune.readers import paired_table

            table = paired_table(ref, args.baseline, trials=trials)
        else:
            table = report_table(ref, trials=trials)
        if table.empty:  # finished trials, but none reported the objective
            raise ValueError(
                f"study {ref.name}: expected a finished trial that reported "
                f"{ref.objectives[0][0]}, found none"
            )
        text = format_table(table, args.format)
    print(text, end="")
    _data_note(trials[trials["status"] == "finished"])
    if out is not None:
        with usage(out):
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(out)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from calibtune.readers import export_best

    with usage():
        if args.top < 1:
            raise ValueError(f"--top: expected an integer >= 1, got {args.top}")
        check_dir(args.out, "--out", min_free=0)
        ref, trials = _finished_study(args)
        paths = export_best(ref, args.out, args.top, args.metric, trials=trials)
    for path in paths:
        print(path)
    return 0


# ------------------------------------------------------------------------------- cluster jobs


def _cmd_submit(args: argparse.Namespace) -> int:
    from calibtune.studyfile import load_study

    if not args.verbose:
        quiet_output()  # Ray's packaging and upload lines
    with usage(args.study):
        study = load_study(args.study)
        spec = submission(
            study,
            storage=args.storage,
            tracking_uri=args.tracking_uri,
            python=args.python,
            runtime_env_file=args.runtime_env,
            verbose=args.verbose,
            data_root=args.data_root,
            fetch=args.fetch,
            mirror=args.mirror,
            wait_for_resources=args.wait_for_resources,
            env_names=args.env,
        )
        client = job_client(args.address)
        job_id = submit_job(client, **spec)
    print(f"submitted study {study.name} as Ray job {job_id}")
    print(f"follow it: calibtune status {job_id} --address {args.address or ''}".rstrip())
    if args.wait:
        return follow(client, job_id, args.verbose)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    with usage():
        client = job_client(args.address)
        if args.job_id:
            try:
                info = client.get_job_info(args.job_id)
            except RuntimeError:
                raise ValueError(
                    f"JOB_ID: expected a job on this cluster, got {args.job_id!r}"
                ) from None
            jobs = [info]
        else:
            jobs = [j for j in client.list_jobs() if (j.metadata or {}).get("calibtune.study")]
    for j in jobs:
        study = (j.metadata or {}).get("calibtune.study", "-")
        print(f"{j.submission_id}\t{j.status}\t{study}\t{j.message or ''}")
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    with usage():
        client = job_client(args.address)
        try:
            logs = client.get_job_logs(args.job_id)
        except RuntimeError:
            raise ValueError(
                f"JOB_ID: expected a job on this cluster, got {args.job_id!r}"
            ) from None
    print(logs, end="")
    return 0


# ------------------------------------------------------------------------------- ui


def _cmd_ui(args: argparse.Namespace) -> int:
    with usage():
        uri = resolve_tracking_uri(args.tracking_uri)
        key = "--tracking-uri" if args.tracking_uri else "tracking store (default ./mlflow.db)"
        if uri.startswith(("http://", "https://")):
            raise ValueError(
                f"{key}: expected a store to serve (sqlite:///PATH, a database URL or a folder), "
                f"got the server {uri} (open it in a browser)"
            )
        check_tracking_uri(uri, key, must_exist=True)
        if args.port is not None:
            check_port_free(args.port)
    from calibtune.readers import ui_lines

    return _serve("ui", lambda url: ui_lines(uri, url), lambda: start_ui(uri, args.port))


# ------------------------------------------------------------------------------- dashboard


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from calibtune.study import optuna_storage_url
    from calibtune.studyfile import load_study

    with usage():
        p = Path(args.study)
        if p.is_file() and p.suffix in (".yaml", ".yml"):
            cfg = load_study(p)
            sd = StudyDir.find(cfg.name, args.storage or cfg.storage)
        else:
            sd = StudyDir.find(args.study, args.storage)
        storage = optuna_storage_url(sd.read_study(), sd)
        if storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///") :]).is_file():
            raise ValueError(
                f"{args.study}: expected the study's Optuna storage {storage}, found none yet "
                "(it is written when a trial ends)"
            )
        if args.port is not None:
            check_port_free(args.port)
    return _serve(
        "dashboard",
        lambda url: [f"optuna-dashboard for {storage}: {url}   (Ctrl-C to stop)"],
        lambda: start_dashboard(storage, args.port),
    )


def _serve(
    command: str, lines: Callable[[str], list[str]], start: Callable[[], tuple[Any, str]]
) -> int:
    """Start a server process (``start() -> (process, URL)``), print ``lines(URL)`` and wait
    for it; Ctrl-C stops it. Exit code 1, with the reason, when it does not come up."""
    try:
        proc, url = start()
    except RuntimeError as exc:
        print(f"calibtune {command}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
        return 1
    try:
        with _stop_signals_interrupt():  # before the URL is out: a reader may stop us at once
            print("\n".join(lines(url)), flush=True)
            proc.wait()
    except KeyboardInterrupt:
        stop_ui(proc)
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _stop_signals_interrupt() -> Any:
    """SIGTERM and SIGHUP stop the server like Ctrl-C: it runs in its own session (so that a
    Ctrl-C reaches only us), and would otherwise outlive a `kill` of this command or a closed
    terminal."""
    if threading.current_thread() is not threading.main_thread():  # no handlers off the main one
        yield
        return
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


# ------------------------------------------------------------------------------- the table

COMMANDS: dict[str, Command] = {
    "run": Command(
        "run a study (Ray Tune + Optuna), logging every trial to MLflow",
        _cmd_run,
        (
            arg("study", metavar="STUDY.yaml", nargs="?"),
            RAY_ADDRESS,
            WAIT_FOR_RESOURCES,
            TRACKING,
            STORAGE,
            *VERBOSITY,
            arg(
                "--more",
                type=_trial_count,
                metavar="N",
                help="add N trials to the finished study (same Optuna history and parent run)",
            ),
            # `calibtune submit` passes the study's self-contained YAML in this variable
            arg("--study-env", help=argparse.SUPPRESS),
        ),
        "Validate STUDY.yaml, start (or connect to) Ray, search with Optuna through Ray Tune and "
        "log one MLflow parent run per study and one child run per trial. Running a study whose "
        "storage already holds it continues it (like `calibtune resume`). Prints progress, then "
        "the comparison table.",
    ),
    "submit": Command(
        "submit a study to a Ray cluster as a Ray Job",
        _cmd_submit,
        (
            arg("study", metavar="STUDY.yaml"),
            DASHBOARD_ADDRESS,
            TRACKING,
            STORAGE,
            arg(
                "--python",
                default="python",
                help="interpreter with calibtune installed on the cluster's nodes (default: the "
                "nodes' python on PATH, the runtime env's where it installs one)",
            ),
            arg(
                "--runtime-env",
                metavar="FILE",
                help="Ray runtime_env (YAML/JSON): pip or uv (with constraints.txt), image_uri, "
                "env_vars, excludes",
            ),
            arg(
                "--data-root",
                metavar="DIR",
                help="absolute folder of the data sets on the cluster's nodes (replaces the "
                "study's trial.data.root in the submitted copy)",
            ),
            arg(
                "--fetch",
                action="store_true",
                help="the job first fetches the sets the study reads into the data root "
                "(calibtune data fetch: one download per shared root)",
            ),
            arg(
                "--mirror",
                metavar="URL",
                help="with --fetch: a lab mirror instead of the official hosts "
                "($CALIBTUNE_DATA_MIRROR is forwarded too)",
            ),
            arg(
                "--env",
                action="append",
                default=[],
                metavar="NAME",
                help="also send variable NAME from this shell (repeatable), e.g. a credential "
                "the nodes have no other way to get; anyone who can read the job sees it",
            ),
            arg("--wait", action="store_true", help="follow the job's logs until it ends"),
            WAIT_FOR_RESOURCES,
            *VERBOSITY,
        ),
        "Submit `python -m calibtune run STUDY.yaml --address auto` as a Ray Job with the "
        "project as working directory (.gitignore, tests and docs left out). Storage and the "
        "tracking URI must be given and reachable from every node (s3://BUCKET/PREFIX or a "
        "shared absolute path; an MLflow server); endpoint, region and MLflow client "
        "variables, RAY_TRAIN_* and CALIBTUNE_* are forwarded, credentials only when named "
        "with --env. The data root must be absolute (--data-root DIR); with --fetch "
        "the job first fetches the sets the study reads there. Before the first trial, the job "
        "checks that every node runs the driver's calibtune, torch, ray, mlflow and optuna.",
    ),
    "resume": Command(
        "restore an interrupted study and finish its unfinished and errored trials",
        _cmd_resume,
        (
            arg("study", metavar="STUDY_NAME|PATH"),
            RAY_ADDRESS,
            STORAGE,
            *VERBOSITY,
            WAIT_FOR_RESOURCES,
        ),
        "Tuner.restore a study from its storage directory (or its name under --storage), "
        "finishing unfinished and errored trials; MLflow logging continues in the same parent "
        "and child runs.",
    ),
    "status": Command(
        "status of submitted study jobs (all, or one JOB_ID)",
        _cmd_status,
        (arg("job_id", nargs="?", metavar="JOB_ID"), DASHBOARD_ADDRESS),
        "List calibtune jobs on the cluster with their status, or one job's status.",
    ),
    "logs": Command("print a submitted study job's logs", _cmd_logs, (JOB_ID, DASHBOARD_ADDRESS)),
    "compare": Command(
        "table of a study's trials: parameters and chosen metrics",
        _cmd_compare,
        (
            arg("study", metavar="STUDY", help="study YAML, storage directory or name"),
            arg("--metrics", help="comma-separated metric names (default: objectives + main)"),
            arg("--sort", help="column to sort by (default: the first objective, best first)"),
            FORMAT,
            STORAGE,
            TRACKING,
        ),
        "One row per finished trial: its loss, hyperparameters and metrics.",
        one_shot=True,
    ),
    "report": Command(
        "the papers' table: per loss, error and ECE pre/post TS, focal TS, OOD AUROC",
        _cmd_report,
        (
            arg("study", metavar="STUDY"),
            FORMAT,
            arg("--out", metavar="FILE", help="also write the table to FILE"),
            arg(
                "--baseline",
                metavar="LOSS",
                help="instead: each loss vs this one (ECE, AdaECE, error differences, paired "
                "bootstrap)",
            ),
            STORAGE,
            TRACKING,
        ),
        "Per loss (its best trial by the study objective, on validation): test error, ECE, "
        "AdaECE and classwise ECE before and after temperature scaling (optimal T in "
        "brackets), ECE after focal temperature scaling and OOD AUROC; values in %.",
        one_shot=True,
    ),
    "export": Command(
        "write the best trials' configs as trial-config YAML for `calibtune train`",
        _cmd_export,
        (
            arg("study", metavar="STUDY"),
            arg("--top", type=int, default=1, metavar="K"),
            arg("--metric", help="validation metric to rank by (default: the objective)"),
            arg("--out", default="exported", metavar="DIR"),
            STORAGE,
            TRACKING,
        ),
        "Rank finished trials by a validation metric (default: the study objective) and write "
        "the top K resolved trial configs; `calibtune train FILE` re-runs one unchanged.",
        one_shot=True,
    ),
    "ui": Command(
        "start the MLflow UI on 127.0.0.1 and print its URL",
        _cmd_ui,
        (TRACKING, PORT),
        "Serve the tracking store with `mlflow ui` on 127.0.0.1; Ctrl-C stops it.",
    ),
    "dashboard": Command(
        "start optuna-dashboard on a study's Optuna storage (127.0.0.1) and print its URL",
        _cmd_dashboard,
        (arg("study", help="study YAML, study folder, or study name"), STORAGE, PORT),
        "Serve the study's Optuna storage (search.optuna_storage, default <study folder>/"
        "optuna.db) with optuna-dashboard on 127.0.0.1; Ctrl-C stops it.",
    ),
}
