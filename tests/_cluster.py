"""A real multi-node Ray cluster on this machine, started the way users start one.

`ray start --head` plus `ray start --address …` per extra node, all on 127.0.0.1 with token auth,
each node with its own temp root (as on separate machines: two nodes sharing one would
garbage-collect each other's runtime-env working directories). Every node runs as a process group
of the test (`ray start --block`) and is torn down by it, never with `ray stop`, which would stop
every Ray on the machine. The cluster has its own auth token (``RAY_AUTH_TOKEN`` in `client_env`),
so nothing is read from or written to ``~/.ray``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from calibtune.readers._ui import free_port

RAY = str(Path(sys.executable).parent / "ray")

#: failed test phases of this pytest process so far (counted by `tests/conftest.py`): a cluster
#: stopped after one of its tests failed keeps its nodes' Ray logs
FAILURES = [0]
#: a killed node is declared dead after ~3 failed 0.5 s health checks instead of ~15 s
FAST_HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"}


def ray_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a node started from an activated virtualenv (its ``python`` first on
    PATH: what a submitted job's entrypoint runs), with token auth."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_AUTH_MODE": "token",
        "RAY_USAGE_STATS_ENABLED": "0",
        **(extra or {}),
    }


@dataclass
class Node:
    proc: subprocess.Popen
    temp_dir: str
    log: Path

    def raylet_pid(self) -> int:
        """The node's raylet: the `raylet` process whose session lives under this node's temp
        root (each node has its own, so this never finds another node's)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"/raylet") and self.temp_dir.encode() in b" ".join(argv):
                return int(entry.name)
        raise AssertionError(f"no raylet under {self.temp_dir}:\n{self.log.read_text()[-2000:]}")

    def stop(self, keep_logs: Path | None = None) -> None:
        """End the node's processes and remove its temp root; ``keep_logs``: copy the session's
        Ray logs (raylet, GCS, workers) there first."""
        # SIGTERM drains the node for up to 30 s; a test cluster has nothing worth waiting for
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        if keep_logs is not None:
            logs = Path(self.temp_dir) / "session_latest" / "logs"
            dest = keep_logs / f"ray-{Path(self.temp_dir).name}"
            shutil.copytree(logs, dest, ignore_dangling_symlinks=True, dirs_exist_ok=True)
            print(f"\nRay logs of node {self.temp_dir} kept in {dest}", file=sys.stderr)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@dataclass
class Cluster:
    """A head node and worker nodes; ``gcs`` for `ray.init`/``--address``, ``dashboard`` for
    Ray Jobs (``calibtune submit``)."""

    logs: Path
    num_cpus: int
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    nodes: list[Node] = field(default_factory=list)
    token: str = field(default_factory=lambda: secrets.token_hex(32))  # Ray's own token format
    failures_at_start: int = field(default_factory=lambda: FAILURES[0])
    #: custom resources of every node this cluster starts (``ray start --resources``)
    resources: dict[str, float] = field(default_factory=dict)

    def client_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a process that talks to this cluster (``ray``, ``calibtune``)."""
        return ray_env({**self.env, "RAY_AUTH_TOKEN": self.token, **(extra or {})})

    @property
    def gcs(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _start(self, args: list[str], prefix: str, private_mount: str | None = None) -> Node:
        tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: socket paths are limited
        log = self.logs / f"{Path(tmp).name}.log"
        common = ["--num-cpus", str(self.num_cpus), "--object-store-memory", str(150 * 1024**2)]
        # Ray's fixed default (52365) is taken by any other Ray on the machine (another node of
        # this cluster, a local study): its job agent would then never serve (no job can start)
        common += ["--dashboard-agent-listen-port", str(free_port())]
        if self.resources and "--resources" not in args:
            common += ["--resources", json.dumps(self.resources)]
        argv = [RAY, "start", "--block", "--disable-usage-stats", "--temp-dir", tmp, *common]
        argv = [*argv, "--node-ip-address", "127.0.0.1", *args]
        if private_mount:  # the node sees its own empty tmpfs there (as root: `unshare -m`)
            mount = 'mount -t tmpfs none "$0" && exec "$@"'
            argv = ["unshare", "-m", "sh", "-c", mount, private_mount, *argv]
        proc = subprocess.Popen(
            argv,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env=self.client_env(),
            start_new_session=True,
        )
        node = Node(proc, tmp, log)
        self.nodes.append(node)
        return node

    def start_head(self) -> Node:
        dash = ["--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port)]
        head = self._start(["--head", "--port", str(self.port), *dash], "rh")
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{self.dashboard}/api/version", timeout=2)
                return head
            except urllib.error.HTTPError:  # it answers (401 without the auth token): it is up
                return head
            except OSError:
                assert time.time() < deadline, head.log.read_text()[-3000:]
                assert head.proc.poll() is None, head.log.read_text()[-3000:]
                time.sleep(1)

    def add_node(self, expect: int, private_mount: str | None = None) -> Node:
        """Start a worker node and wait until ``expect`` nodes are alive; ``private_mount``: a
        folder (that exists) over which the node has a private empty tmpfs, as a node without
        the cluster's shared file system would (its own mount namespace: needs root)."""
        node = self._start(["--address", self.gcs], "rw", private_mount)
        self.wait_nodes(expect)
        return node

    def alive_nodes(self) -> int:
        out = subprocess.run(
            [RAY, "status", "--address", self.gcs],
            capture_output=True,
            text=True,
            env=self.client_env(),
        ).stdout
        active = out.split("Active:")[-1].split("Pending:")[0] if "Active:" in out else ""
        return active.count(" node_")

    def wait_nodes(self, n: int, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while self.alive_nodes() != n:
            assert time.time() < deadline, f"cluster did not reach {n} alive nodes"
            time.sleep(1)

    def stop(self) -> None:
        """Stop every node; when a test failed while the cluster ran, keep their Ray logs in
        ``logs`` (what an intermittent cluster failure is diagnosed from)."""
        keep = self.logs if FAILURES[0] > self.failures_at_start else None
        for node in reversed(self.nodes):
            node.stop(keep)
        self.nodes.clear()


def start_cluster(
    logs: Path,
    nodes: int,
    num_cpus: int,
    env: dict[str, str] | None = None,
    resources: dict[str, float] | None = None,
):
    """Head plus ``nodes - 1`` worker nodes, each with ``num_cpus`` CPUs and ``resources``
    (stop it with `Cluster.stop`, also when starting failed half-way)."""
    cluster = Cluster(logs, num_cpus, dict(env or {}), resources=dict(resources or {}))
    try:
        cluster.start_head()
        for n in range(2, nodes + 1):
            cluster.add_node(expect=n)
    except BaseException:
        cluster.stop()
        raise
    return cluster


class SharedCluster:
    """The `two_nodes` cluster of `tests/conftest.py`: two nodes of 2 CPUs and one ``node_slot``
    each (`FAST_HEALTH`), started by the first test that asks for it and stopped after the last
    test of its work unit, so that the tests of several files pay for one start-up."""

    def __init__(self) -> None:
        self.cluster: Cluster | None = None

    def get(self, logs: Path) -> Cluster:
        """The running cluster (started in ``logs`` if none runs); a worker node that a test
        killed (its ``ray start --block`` has exited) is replaced by a fresh one first."""
        if self.cluster is not None and self.cluster.nodes[0].proc.poll() is not None:
            self.stop()  # the head is gone: a fresh cluster
        if self.cluster is None:
            self.cluster = start_cluster(logs, 2, 2, FAST_HEALTH, {"node_slot": 1})
            return self.cluster
        for i, node in enumerate(list(self.cluster.nodes)):
            if i > 0 and node.proc.poll() is not None:
                self.cluster.nodes.remove(node)
                node.stop()
                fresh = self.cluster.add_node(expect=len(self.cluster.nodes) + 1)
                self.cluster.nodes.remove(fresh)
                self.cluster.nodes.insert(i, fresh)
        return self.cluster

    def stop(self) -> None:
        """Stop the cluster if one runs (`Cluster.stop`: its logs kept after a failure)."""
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


#: the one `SharedCluster` of this pytest process (`two_nodes` in `tests/conftest.py`)
SHARED = SharedCluster()
