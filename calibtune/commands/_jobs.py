"""`calibtune submit`, `status` and `logs`: a study as a Ray Job on a cluster (Ray's job client;
no local Ray, no torch).
"""

from __future__ import annotations

import argparse

from calibtune._usage import usage
from calibtune.cluster import follow, job_client, submission, submit_job
from calibtune.studyfile import load_study

__all__ = ["logs", "status", "submit"]


def submit(args: argparse.Namespace) -> int:
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


def status(args: argparse.Namespace) -> int:
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


def logs(args: argparse.Namespace) -> int:
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
