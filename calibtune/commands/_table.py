"""The command table: every ``calibtune`` subcommand with its help, its arguments and the
handler that runs it (``"module:function"`` in `calibtune.commands`, imported only when the
command runs: `calibtune._commands.handler`). Nothing here imports more than argparse types, so
``calibtune --help`` and every subcommand's ``--help`` start in a fraction of a second
(bench/bench_cli.py).
"""

from __future__ import annotations

import argparse

from calibtune._argtypes import port_number, trial_count, wait_duration
from calibtune._commands import Actions, Command, OneOf, arg

__all__ = ["COMMANDS", "DATA_SETS", "PREPARED_SETS"]

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


WAIT_FOR_RESOURCES = arg(
    "--wait-for-resources",
    type=wait_duration,
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

#: the names ``calibtune data`` takes, as in `calibtune.data.FETCH_SETS` (a test keeps them equal;
#: listed here so that parsing imports nothing heavy)
DATA_SETS = (
    "cifar10",
    "cifar100",
    "svhn",
    "cifar10c",
    "cifar100c",
    "tiny_imagenet",
    "sst",
    "glove6b",
    "20newsgroups",
)
#: sets the user prepares (`calibtune.data.PREPARED_SETS`): ``verify`` checks them by name only
PREPARED_SETS = ("imagenet",)


# ------------------------------------------------------------------------------- train

_TRAIN = Command(
    "run one trial (training, calibration, OOD evaluation) through Ray Train",
    "calibtune.commands._train:train",
    (
        arg("config", metavar="CONFIG.yaml", help="trial-config YAML file"),
        arg(
            "--num-workers",
            type=int,
            metavar="N",
            help="Ray Train workers (overrides scaling.num_workers; 0 = in-process local mode)",
        ),
        OneOf(
            (
                arg(
                    "--use-gpu",
                    dest="use_gpu",
                    action="store_true",
                    default=None,
                    help="one GPU per worker (overrides scaling.use_gpu)",
                ),
                arg(
                    "--no-use-gpu",
                    dest="use_gpu",
                    action="store_false",
                    help="CPU only (scaling.use_gpu=false)",
                ),
            )
        ),
        arg(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY.PATH=VALUE",
            help="override one config value, VALUE parsed as YAML (repeatable), "
            "e.g. --set train.epochs=5 --set loss.params.gamma=3",
        ),
        arg("--storage-path", help="directory for trial folders (overrides storage_path)"),
        arg("--name", help="trial name = its folder under the storage path (overrides name)"),
        arg(
            "--all-metrics",
            action="store_true",
            help="print every final metric (default: the main ones per method)",
        ),
        arg("--verbose", action="store_true", help="Ray's worker prefixes and logs"),
    ),
    "Run one trial described by a trial-config YAML file (format: docs/trial.md) through "
    "Ray Train, print the final metrics table and leave checkpoints and artifacts under "
    "<storage_path>/<name>/. Re-running the same config resumes from its latest checkpoint.",
)


# ------------------------------------------------------------------------------- data

_ROOT = arg("--root", metavar="DIR", help="data root (default: ./data, as a config's data.root)")
_SETS_HELP = f"data set: {', '.join(DATA_SETS)}"

_DATA = Command(
    "fetch and verify the data sets (CIFAR-10/100, SVHN, CIFAR-10-C/100-C, Tiny-ImageNet)",
    "",
    (
        Actions(
            {
                "fetch": Command(
                    "download, check and unpack data sets into the data root",
                    "calibtune.commands._data:fetch_sets",
                    (
                        arg("names", nargs="+", metavar="NAME", help=_SETS_HELP),
                        _ROOT,
                        arg(
                            "--mirror",
                            metavar="URL",
                            help="a lab mirror serving the official file names (default: "
                            "$CALIBTUNE_DATA_MIRROR, else the official hosts); checksums apply",
                        ),
                    ),
                    "Download each set from its official URL (or --mirror), check the "
                    "published MD5, unpack it safely into the layout calibtune reads and record "
                    "a stamp; a set already fetched is skipped, a partial download resumed, and "
                    "concurrent fetches into one root download each file once. See "
                    "docs/data.md.",
                ),
                "verify": Command(
                    "check data sets against their published checksums or fetch record",
                    "calibtune.commands._data:verify_sets",
                    (
                        arg(
                            "names",
                            nargs="*",
                            metavar="NAME",
                            help=f"{_SETS_HELP}, or {', '.join(PREPARED_SETS)} (a prepared "
                            "folder: its layout and file headers; by name only) (default: every "
                            "set above)",
                        ),
                        _ROOT,
                        arg(
                            "--quick",
                            action="store_true",
                            help="compare sizes and mtimes with the fetch record, re-hash only "
                            "changed files (what runs do)",
                        ),
                    ),
                    "One line per set: ok, missing, failed or unverified. Files with a fetch "
                    "record are re-hashed against it; files placed by hand are hashed against "
                    "the published checksums and, when they match, recorded. Exit code 2 if a "
                    "set fails (or a named set is missing).",
                ),
            }
        ),
    ),
    "Fetch the data sets the studies read, with pinned checksums (docs/data.md).",
)


# ------------------------------------------------------------------------------- the table

#: every subcommand, in ``calibtune --help`` order
COMMANDS: dict[str, Command] = {
    "train": _TRAIN,
    "run": Command(
        "run a study (Ray Tune + Optuna), logging every trial to MLflow",
        "calibtune.commands._run:run",
        (
            arg("study", metavar="STUDY.yaml", nargs="?"),
            RAY_ADDRESS,
            WAIT_FOR_RESOURCES,
            TRACKING,
            STORAGE,
            *VERBOSITY,
            arg(
                "--more",
                type=trial_count,
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
        "calibtune.commands._jobs:submit",
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
        "calibtune.commands._run:resume",
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
        "calibtune.commands._jobs:status",
        (arg("job_id", nargs="?", metavar="JOB_ID"), DASHBOARD_ADDRESS),
        "List calibtune jobs on the cluster with their status, or one job's status.",
    ),
    "logs": Command(
        "print a submitted study job's logs",
        "calibtune.commands._jobs:logs",
        (JOB_ID, DASHBOARD_ADDRESS),
    ),
    "compare": Command(
        "table of a study's trials: parameters and chosen metrics",
        "calibtune.commands._read:compare",
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
        "calibtune.commands._read:report",
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
        "calibtune.commands._read:export",
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
        "calibtune.commands._serve:ui",
        (TRACKING, PORT),
        "Serve the tracking store with `mlflow ui` on 127.0.0.1; Ctrl-C stops it.",
    ),
    "dashboard": Command(
        "start optuna-dashboard on a study's Optuna storage (127.0.0.1) and print its URL",
        "calibtune.commands._serve:dashboard",
        (arg("study", help="study YAML, study folder, or study name"), STORAGE, PORT),
        "Serve the study's Optuna storage (search.optuna_storage, default <study folder>/"
        "optuna.db) with optuna-dashboard on 127.0.0.1; Ctrl-C stops it.",
    ),
    "data": _DATA,
}
