"""An S3-compatible server on 127.0.0.1 for the object-storage tests: moto's server mode, the
way its users start it (``moto.server.ThreadedMotoServer``; ``moto_server -p PORT`` is the same
server as a command), with the standard AWS environment variables that point clients at it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from calibtune.study._ui import free_port


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


def start_s3() -> S3Server:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return S3Server(server, f"http://127.0.0.1:{port}")
