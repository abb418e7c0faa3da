"""Shared, general fixtures: one small Ray instance per test session (only if a test asks)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Ray Train polls its workers every 1 s by default; 0.2 s cuts ~10 s off each worker start-up.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")


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
