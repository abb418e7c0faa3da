"""Shared, general fixtures: one small Ray instance per test session (only if a test asks), and
how `make test` splits the suite over two pytest-xdist workers (see the Makefile)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Ray Train polls its workers every 1 s by default; 0.2 s cuts ~10 s off each worker start-up.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")

# Wall-clock bounds a second busy xdist worker could break: `make test` runs these alone, after
# the parallel part (`-m serial`). A renamed test falls out of this set, so keep names in step.
SERIAL = {
    "tests/test_bad_input_config.py::test_alias_bomb_is_refused_fast",
    "tests/test_data.py::test_digits_loads_fast_without_files",
    "tests/test_losses_adafocal.py::test_update_cost_is_vectorised",
}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (`--dist loadgroup`)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of the in-process Ray (`ray_session`) on one xdist worker: one Ray start-up,
    and the modules' shared studies (module fixtures) are run once, not once per worker."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("ray_session"))
        if item.nodeid in SERIAL:
            item.add_marker(pytest.mark.serial)


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
