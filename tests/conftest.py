"""Shared, general fixtures: one small Ray instance per test session (only if a test asks), and
how `make test` shares the suite out to pytest-xdist workers (`-n 3 --dist loadgroup`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

# Ray Train polls its workers every 1 s by default; 0.2 s cuts ~10 s off each worker start-up.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")

# xdist work units: a test file is one unit (its module fixtures run once), except files that
# share a unit here, and SPREAD files, whose independent slow tests are a unit each. The table is
# keyed by file because the scheduler sees node ids only (xdist's own `xdist_group` marks are lost
# on pytest >= 9.2: pytest-xdist#1386).
GROUPS = {
    # the `ray_session` users: one in-process Ray per unit, two units (one per worker, each
    # first there: `FIRST`) of about the same length
    **dict.fromkeys(
        [
            "tests/test_paired_report.py",
            "tests/test_placement.py",
            "tests/test_preemption.py",
            "tests/test_results_studies.py",
            "tests/test_scale.py",
            "tests/test_study_e2e.py",
            "tests/test_study_rounds.py",
        ],
        "ray_session",
    ),
    **dict.fromkeys(
        [
            "tests/test_constraints.py",
            "tests/test_parallel_seeds.py",
            "tests/test_text_study_report.py",
            "tests/test_trial_workers.py",
            "tests/test_ui_browser.py",
        ],
        "ray_session_2",
    ),
    # never two multi-node Ray clusters at once; one `two_nodes` cluster for the files using it
    "tests/test_autoscale.py": "cluster",
    "tests/test_cluster.py": "cluster",
    "tests/test_cluster_ddp.py": "cluster",
    "tests/test_cluster_storage.py": "cluster",
    "tests/test_submit_cluster.py": "cluster",
    "tests/test_readme_cluster.py": "cluster",
}
RAY_SESSION_UNITS = {"ray_session", "ray_session_2"}
SPREAD = {"tests/test_faults.py", "tests/test_terminal.py"}
# Wall-clock bounds a busy second worker could break: `make test` runs these alone, after the
# two-worker part (`-m serial`).
SERIAL = {
    "tests/test_bad_input_config.py::test_alias_bomb_is_refused_fast",
    "tests/test_data.py::test_digits_loads_fast_without_files",
    "tests/test_losses_adafocal.py::test_update_cost_is_vectorised",
}


# The longest units first, so that the workers end together: the two `ray_session` units
# (each must be the first on its worker: a `ray_down` test before it would have stopped the Ray
# its session fixture keeps), then by the durations of a loaded two-worker run (2026-12-02,
# seconds there, about twice an idle box's): the cluster unit ~690, the two `ray_session` units
# ~510 each, the fault tests 65-270 each, then the other files (40-180), the short rest last.
FIRST = [
    "ray_session",
    "ray_session_2",
    "cluster",
    "tests/test_faults.py",
    "tests/test_gpu_check.py",
    "tests/test_storage_s3_study.py",
    "tests/test_tracking_server.py",
    "tests/test_terminal.py",
    "tests/test_load_smoke.py",
    "tests/test_packing.py",
    "tests/test_study_messages.py",
    "tests/test_losses_compile.py",
    "tests/test_study_reuse.py",
    "tests/test_transient_io.py",
]


def _unit(nodeid: str) -> str:
    path = nodeid.split("::")[0]
    return nodeid if path in SPREAD else GROUPS.get(path, path)


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: no error where xdist is absent
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup` with the units above, in collection order (`--no-loadscope-reorder`)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return Units(config, log)


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::")[0]
    key = GROUPS.get(path, path)
    return FIRST.index(key) if key in FIRST else len(FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the longest units first (a stable sort: each file's tests stay together, so module
    fixtures run once); mark the SERIAL tests; refuse a `ray_session` user outside the
    `ray_session` units (it would start a Ray on a worker after its `ray_down` tests)."""
    items.sort(key=_rank)
    for item in items:
        path = item.nodeid.split("::")[0]
        if "ray_session" in getattr(item, "fixturenames", ()) and (
            GROUPS.get(path) not in RAY_SESSION_UNITS
        ):
            raise pytest.UsageError(f"{item.nodeid} uses ray_session: add {path} to GROUPS")
        if item.nodeid in SERIAL:
            item.add_marker(pytest.mark.serial)


@pytest.hookimpl(trylast=True)  # after the test's own fixtures ended (its drivers)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared `two_nodes` cluster once its work unit is done on this worker: idle Ray
    nodes would take CPU from every later test."""
    shared = _shared_cluster()
    if shared is not None and (nextitem is None or _unit(nextitem.nodeid) != _unit(item.nodeid)):
        shared.stop()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:  # a multi-node test cluster stopped after this keeps its Ray logs
        import _cluster

        _cluster.FAILURES[0] += 1


@pytest.fixture(scope="session", autouse=True)
def _stop_shared_cluster() -> Iterator[None]:
    """The `two_nodes` cluster ends with the session at the latest (an interrupted run)."""
    yield
    shared = _shared_cluster()
    if shared is not None:
        shared.stop()


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    """Tiny models and tensors on a 2-core machine: one intra-op thread per test process avoids
    oversubscription (two threads were many times slower under load)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A 2-CPU local Ray instance (small object store, no dashboard), shut down at the end."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(
            address="local",  # a fresh instance, never a cluster some other test started
            num_cpus=2,
            object_store_memory=200 * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=False,
        )
    yield
    if started:
        ray.shutdown()


def _shared_cluster():
    """`_cluster.SHARED` if a test of this process imported `_cluster` (imported lazily: it
    imports calibtune, which a run without cluster tests need not load here)."""
    mod = sys.modules.get("_cluster")
    return None if mod is None else mod.SHARED


@pytest.fixture
def two_nodes(tmp_path_factory: pytest.TempPathFactory):
    """A two-node Ray cluster on 127.0.0.1 shared by the `cluster` unit's tests that leave it
    running (`_cluster.SharedCluster`: one start-up instead of one per file): 2 CPUs and one
    ``node_slot`` per node, a killed node declared dead in ~2 s."""
    import _cluster

    return _cluster.SHARED.get(tmp_path_factory.mktemp("two_nodes_logs"))


@pytest.fixture
def ray_down() -> None:
    """No Ray in this process before the test, so that its ``not ray.is_initialized()`` proves
    the code under test started none: a `ray_session` unit, which runs first on its worker
    (`FIRST`), leaves its instance up until the session ends."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
