"""The study-service subcommands of ``calibtune`` (argument parsing only).

run, submit, resume, status, logs, compare, report, export, ui, dashboard. Bad input (a malformed
study, an unknown study, a missing dataset) is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibtune._usage import usage
from calibtune.study._jobs import follow, job_client, project_root, submit_job
from calibtune.study._ui import check_port_free, port_number, start_dashboard, start_ui, stop_ui


def _common_tracking(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: the study's tracking.uri, else sqlite:///<cwd>/mlflow.db)",
    )


def _storage(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage",
        metavar="PATH",
        help="directory holding study state (default: the study's storage:, else ./runs/studies)",
    )


# ------------------------------------------------------------------------------- run


def _add_run(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a study (Ray Tune + Optuna), logging every trial to MLflow",
        description=(
            "Validate STUDY.yaml, start (or connect to) Ray, search with Optuna through Ray "
            "Tune and log one MLflow parent run per study and one child run per trial. Running "
            "a study whose storage already holds it continues it (like `calibtune resume`). "
            "Prints progress, then the comparison table."
        ),
    )
    p.add_argument("study", metavar="STUDY.yaml", nargs="?")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    _common_tracking(p)
    _storage(p)
    _verbosity(p)
    # `calibtune submit` passes the study's self-contained YAML in this environment variable
    p.add_argument("--study-env", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_run)


def _verbosity(p: Any) -> None:
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show Ray's own output (Tune's tables, Ray's logs, worker logs)",
    )
    p.add_argument("--quiet", action="store_true", help="the default (kept for old scripts)")


def _setup_line(study: Any, address: str | None, tracking_uri: str | None) -> None:
    s = study.search
    where = f"Ray at {address}" if address else "a local Ray"
    uri = tracking_uri or study.tracking.uri or "sqlite:///mlflow.db"
    print(
        f"[calibtune] study {study.name}: {s.num_samples} trials, {s.max_concurrent} at a time "
        f"on {where}; MLflow {uri}",
        flush=True,
    )


def _print_outcome(outcome: Any) -> None:
    from calibtune.study._results import compare_table, format_table, locate_study

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


def _exit_code(outcome: Any) -> int:
    """0 only when every trial ended (finished, failed with its reason, or stopped early by the
    scheduler) and at least one finished; 130/143 after SIGINT/SIGTERM (state saved)."""
    from calibtune.study._search import SIGNAL_EXIT

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
    if outcome.counts.get("unfinished", 0) > 0:
        print(
            f"calibtune: study {outcome.name}: expected {outcome.counts['unfinished']} more "
            f"trials to end, found them unfinished; continue with {resume}",
            file=sys.stderr,
        )
        return 1
    return 0 if outcome.counts.get("finished", 0) > 0 else 1


def _cmd_run(args: argparse.Namespace) -> int:
    from calibtune.study import load_study, run_study
    from calibtune.study._display import quiet_output
    from calibtune.study._preflight import preflight_run

    if not args.verbose:
        quiet_output()  # before the preflight opens the store (MLflow logs its migrations)
    with usage(args.study):
        if args.study_env:
            from calibtune.study._config import study_from_text

            study = study_from_text(os.environ[args.study_env], f"submitted {args.study_env}")
        elif args.study:
            study = load_study(args.study)
        else:
            raise ValueError("STUDY.yaml: expected a study file, got none")
        # bad paths, stores and addresses stop here, before Ray starts or anything is written
        preflight_run(
            study, address=args.address, tracking_uri=args.tracking_uri, storage=args.storage
        )
        _setup_line(study, args.address, args.tracking_uri)
        outcome = run_study(
            study,
            address=args.address,
            tracking_uri=args.tracking_uri,
            storage=args.storage,
            verbose=1 if args.verbose else 0,
        )
    _print_outcome(outcome)
    return _exit_code(outcome)


# ------------------------------------------------------------------------------- resume


def _add_resume(sub: Any) -> None:
    p = sub.add_parser(
        "resume",
        help="restore an interrupted study and finish its unfinished and errored trials",
        description=(
            "Tuner.restore a study from its storage directory (or its name under --storage), "
            "finishing unfinished and errored trials; MLflow logging continues in the same parent "
            "and child runs."
        ),
    )
    p.add_argument("study", metavar="STUDY_NAME|PATH")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    _storage(p)
    _verbosity(p)
    p.set_defaults(func=_cmd_resume)


def _cmd_resume(args: argparse.Namespace) -> int:
    from calibtune.study import resume_study
    from calibtune.study._display import quiet_output
    from calibtune.study._preflight import preflight_resume

    if not args.verbose:
        quiet_output()
    with usage():
        preflight_resume(args.study, address=args.address, storage=args.storage)
        outcome = resume_study(
            args.study, address=args.address, storage=args.storage, verbose=1 if args.verbose else 0
        )
    _print_outcome(outcome)
    return _exit_code(outcome)


# ------------------------------------------------------------------------------- tables


def _add_compare(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="table of a study's trials: parameters and chosen metrics",
        description="One row per finished trial: its loss, hyperparameters and metrics.",
    )
    p.add_argument("study", metavar="STUDY", help="study YAML, storage directory or name")
    p.add_argument("--metrics", help="comma-separated metric names (default: objectives + main)")
    p.add_argument("--sort", help="column to sort by (default: the first objective, best first)")
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown")
    _storage(p)
    _common_tracking(p)
    p.set_defaults(func=_cmd_compare)


def _finished_study(args: argparse.Namespace) -> Any:
    """The `StudyRef` of compare/report/export: its tracking store checked (exists, answers)
    and holding at least one finished trial; else a one-line ValueError."""
    from calibtune.study._preflight import check_tracking_uri
    from calibtune.study._results import locate_study, trials_frame
    from calibtune.study._tracking import resolve_tracking_uri

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
    return ref


def _cmd_compare(args: argparse.Namespace) -> int:
    from calibtune.study._results import compare_table, format_table

    with usage():
        ref = _finished_study(args)
        metrics = [m.strip() for m in args.metrics.split(",")] if args.metrics else None
        table = compare_table(ref, metrics, args.sort)
    print(format_table(table, args.format), end="")
    return 0


def _add_report(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="the papers' table: per loss, error and ECE pre/post TS, focal TS, OOD AUROC",
        description=(
            "Per loss (its best trial by the study objective, on validation): test error, ECE, "
            "AdaECE and classwise ECE before and after temperature scaling (optimal T in "
            "brackets), ECE after focal temperature scaling and OOD AUROC; values in %."
        ),
    )
    p.add_argument("study", metavar="STUDY")
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown")
    p.add_argument("--out", metavar="FILE", help="also write the table to FILE")
    p.add_argument(
        "--baseline",
        metavar="LOSS",
        help="instead: each loss vs this one (ECE, AdaECE, error differences, paired bootstrap)",
    )
    _storage(p)
    _common_tracking(p)
    p.set_defaults(func=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from calibtune.study._preflight import check_out_file
    from calibtune.study._results import format_table, report_table

    with usage():
        out = check_out_file(args.out, "--out") if args.out else None
        ref = _finished_study(args)
        if args.baseline is not None:
            from calibtune.study._paired import paired_table

            table = paired_table(ref, args.baseline)
        else:
            table = report_table(ref)
        if table.empty:  # finished trials, but none reported the objective
            raise ValueError(
                f"study {ref.name}: expected a finished trial that reported "
                f"{ref.objectives[0][0]}, found none"
            )
        text = format_table(table, args.format)
    print(text, end="")
    if out is not None:
        with usage(out):
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(out)
    return 0


def _add_export(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write the best trials' configs as trial-config YAML for `calibtune train`",
        description=(
            "Rank finished trials by a validation metric (default: the study objective) and write "
            "the top K resolved trial configs; `calibtune train FILE` re-runs one unchanged."
        ),
    )
    p.add_argument("study", metavar="STUDY")
    p.add_argument("--top", type=int, default=1, metavar="K")
    p.add_argument("--metric", help="validation metric to rank by (default: the objective)")
    p.add_argument("--out", default="exported", metavar="DIR")
    _storage(p)
    _common_tracking(p)
    p.set_defaults(func=_cmd_export)


def _cmd_export(args: argparse.Namespace) -> int:
    from calibtune.study._preflight import check_dir
    from calibtune.study._results import export_best

    with usage():
        if args.top < 1:
            raise ValueError(f"--top: expected an integer >= 1, got {args.top}")
        check_dir(args.out, "--out", min_free=0)
        paths = export_best(_finished_study(args), args.out, args.top, args.metric)
    for path in paths:
        print(path)
    return 0


# ------------------------------------------------------------------------------- cluster jobs


def _add_submit(sub: Any) -> None:
    p = sub.add_parser(
        "submit",
        help="submit a study to a Ray cluster as a Ray Job",
        description=(
            "Submit `calibtune run STUDY.yaml --address auto` as a Ray Job with the project as "
            "working directory. Storage and the tracking URI must be reachable from the cluster "
            "(shared paths, an MLflow server); relative paths are made absolute here."
        ),
    )
    p.add_argument("study", metavar="STUDY.yaml")
    p.add_argument("--address", help="Ray dashboard address, e.g. http://HEAD:8265")
    _common_tracking(p)
    _storage(p)
    p.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter with calibtune installed on the cluster (default: this one)",
    )
    p.add_argument("--wait", action="store_true", help="follow the job's logs until it ends")
    p.set_defaults(func=_cmd_submit)


def _cmd_submit(args: argparse.Namespace) -> int:
    from calibtune.study import load_study
    from calibtune.study._preflight import preflight_submit
    from calibtune.study._studydir import default_storage, self_contained
    from calibtune.study._tracking import resolve_tracking_uri

    with usage(args.study):
        study = load_study(args.study)
        preflight_submit(study, tracking_uri=args.tracking_uri, storage=args.storage)
        client = job_client(args.address)
        storage = Path(args.storage or study.storage or default_storage()).expanduser().resolve()
        uri = resolve_tracking_uri(args.tracking_uri or study.tracking.uri)
        root = project_root(Path(args.study))
        entry = (
            f"{args.python} -m calibtune run --study-env CALIBTUNE_STUDY_YAML --address auto "
            f"--storage {storage} --tracking-uri {uri} --quiet"
        )
        job_id = submit_job(
            client,
            entrypoint=entry,
            runtime_env={
                "working_dir": str(root),
                "excludes": [".venv", "runs", "mlflow.db", ".git", "exported", "*.pt", "data"],
                "env_vars": {
                    "CALIBTUNE_STUDY_YAML": self_contained(study),
                    **({"CALIBTUNE_DEBUG": "1"} if os.environ.get("CALIBTUNE_DEBUG") else {}),
                },
            },
            metadata={"calibtune.study": study.name},
        )
    print(f"submitted study {study.name} as Ray job {job_id}")
    print(f"follow it: calibtune status {job_id} --address {args.address or ''}".rstrip())
    if args.wait:
        return follow(client, job_id)
    return 0


def _add_status(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="status of submitted study jobs (all, or one JOB_ID)",
        description="List calibtune jobs on the cluster with their status, or one job's status.",
    )
    p.add_argument("job_id", nargs="?", metavar="JOB_ID")
    p.add_argument("--address", help="Ray dashboard address, e.g. http://HEAD:8265")
    p.set_defaults(func=_cmd_status)


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


def _add_logs(sub: Any) -> None:
    p = sub.add_parser("logs", help="print a submitted study job's logs")
    p.add_argument("job_id", metavar="JOB_ID")
    p.add_argument("--address", help="Ray dashboard address, e.g. http://HEAD:8265")
    p.set_defaults(func=_cmd_logs)


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


def _add_ui(sub: Any) -> None:
    p = sub.add_parser(
        "ui",
        help="start the MLflow UI on 127.0.0.1 and print its URL",
        description="Serve the tracking store with `mlflow ui` on 127.0.0.1; Ctrl-C stops it.",
    )
    _common_tracking(p)
    p.add_argument("--port", type=port_number, help="port 1-65535 (default: a free one)")
    p.set_defaults(func=_cmd_ui)


def _cmd_ui(args: argparse.Namespace) -> int:
    from calibtune.study._preflight import check_tracking_uri
    from calibtune.study._tracking import resolve_tracking_uri

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
    try:
        proc, url = start_ui(uri, args.port)
    except RuntimeError as exc:
        print(f"calibtune ui: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
        return 1
    from calibtune.study._ui import ui_lines

    print("\n".join(ui_lines(uri, url)), flush=True)
    try:
        proc.wait()
    except KeyboardInterrupt:
        stop_ui(proc)
    return 0


# ------------------------------------------------------------------------------- dashboard


def _add_dashboard(sub: Any) -> None:
    p = sub.add_parser(
        "dashboard",
        help="start optuna-dashboard on a study's Optuna storage (127.0.0.1) and print its URL",
        description="Serve the study's Optuna storage (search.optuna_storage, default "
        "<study folder>/optuna.db) with optuna-dashboard on 127.0.0.1; Ctrl-C stops it.",
    )
    p.add_argument("study", help="study YAML, study folder, or study name")
    _storage(p)
    p.add_argument("--port", type=port_number, help="port 1-65535 (default: a free one)")
    p.set_defaults(func=_cmd_dashboard)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from calibtune.study._config import load_study
    from calibtune.study._search import optuna_storage_url
    from calibtune.study._studydir import StudyDir

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
    try:
        proc, url = start_dashboard(storage, args.port)
    except RuntimeError as exc:
        print(f"calibtune dashboard: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
        return 1
    print(f"optuna-dashboard for {storage}: {url}   (Ctrl-C to stop)", flush=True)
    try:
        proc.wait()
    except KeyboardInterrupt:
        stop_ui(proc)
    return 0


COMMANDS: dict[str, Callable[[Any], None]] = {
    "run": _add_run,
    "submit": _add_submit,
    "resume": _add_resume,
    "status": _add_status,
    "logs": _add_logs,
    "compare": _add_compare,
    "report": _add_report,
    "export": _add_export,
    "ui": _add_ui,
    "dashboard": _add_dashboard,
}
