"""An S3-compatible server on 127.0.0.1 for the object-storage tests: moto's server mode, the
way its users start it (``moto.server.ThreadedMotoServer``; ``moto_server -p PORT`` is the same
server as a command), with the standard AWS environment variables that point clients at it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibtune.readers._ui import free_port


@dataclass
class S3Server:
    server: Any
    endpoint: str

    def env(self) -> dict[str, str]:
        """What a process needs to reach the server (pyarrow, boto3, MLflow read these)."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
        }

    def client(self) -> Any:
        import boto3

        env = self.env()
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_REGION"],
        )

    def bucket(self, name: str) -> str:
        """Create bucket ``name`` (if new) and return it."""
        c = self.client()
        if name not in {b["Name"] for b in c.list_buckets().get("Buckets", [])}:
            c.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def stop(self) -> None:
        self.server.stop()


def start_s3(wrap: Callable[[Any], Any] | None = None) -> S3Server:
    """moto's server on a free port; ``wrap``: a WSGI layer put in front of moto's app (a
    request log, a policy, a server bug), below everything calibtune does."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    if wrap is not None:  # werkzeug's server reads ``.app`` at each request
        server._server.app = wrap(server._server.app)
    return S3Server(server, f"http://127.0.0.1:{port}")


def bucket_study(
    name: str,
    tmp: Path,
    storage: str = "s3://calib/studies",
    *,
    epochs: int = 2,
    samples: int = 2,
    optuna_in_tmp: bool = True,
) -> dict[str, Any]:
    """A small study of cross-entropy MLPs on digits stored in ``storage``, its MLflow (and,
    with ``optuna_in_tmp``, its Optuna) SQLite under ``tmp``."""
    search: dict[str, Any] = {
        "sampler": "random",
        "num_samples": samples,
        "max_concurrent": 1,
        "objectives": ["val/ece"],
    }
    if optuna_in_tmp:
        search["optuna_storage"] = f"sqlite:///{tmp / 'optuna.db'}"
    return {
        "name": name,
        "trial": {
            "data": {"name": "digits", "ood": []},
            "model": {"name": "mlp"},
            "optimizer": {"lr": 0.05},
            "train": {"epochs": epochs, "batch_size": 64, "checkpoint_every": 1},
            "eval": {"posthoc": ["ts"], "figures": False},
        },
        "losses": ["cross_entropy"],
        "search": search,
        "tracking": {"uri": f"sqlite:///{tmp / 'mlflow.db'}", "experiment": name},
        "storage": storage,
    }
