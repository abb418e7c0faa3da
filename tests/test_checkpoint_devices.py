"""A checkpoint's CUDA RNG state belongs to the trial's device, not to every visible GPU.

No GPU here: ``torch.cuda`` is monkeypatched with N CPU generators standing in for N devices'
default generators (`torch.cuda.random` reads ``torch.cuda.default_generators[index]``), so
the real ``torch.cuda.get_rng_state``/``set_rng_state`` code paths run. Before issue 27 a
checkpoint held ``get_rng_state_all()`` and a resume with fewer visible GPUs raised IndexError;
under Ray's shared ``CUDA_VISIBLE_DEVICES`` a restarted rank could take another device's state.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.cuda.random as cuda_random

from calibtune.trial._checkpoint import capture_rng, load_state, restore_rng, save_state


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch):
    """``fake_gpus(n)``: n visible "GPUs", each a CPU generator seeded with its index + 100."""

    def visible(n: int) -> tuple[torch.Generator, ...]:
        gens = tuple(torch.Generator().manual_seed(100 + i) for i in range(n))
        monkeypatch.setattr(torch.cuda, "default_generators", gens)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(cuda_random, "is_initialized", lambda: True, raising=False)
        monkeypatch.setattr(cuda_random, "_lazy_init", lambda: None)
        monkeypatch.setattr(cuda_random, "device_count", lambda: n)
        monkeypatch.setattr(cuda_random, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        return gens

    return visible


def _save(tmp_path: Path, device: torch.device) -> Path:
    net = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    return save_state(
        tmp_path / "ckpt",
        model=net,
        optimizer=opt,
        loss_fn=torch.nn.Identity(),
        epoch=1,
        history=[],
        rngs=[capture_rng(device)],
    ).parent


def _draw(gen: torch.Generator) -> torch.Tensor:
    return torch.rand(4, generator=gen)


def test_checkpoint_from_more_gpus_restores_on_fewer(fake_gpus, tmp_path: Path) -> None:
    gens = fake_gpus(4)
    _draw(gens[3])  # the trial's device (cuda:3) has drawn; the others have not
    ckpt = _save(tmp_path, torch.device("cuda", 3))
    expected = _draw(gens[3])  # what the uninterrupted trial draws next
    gens = fake_gpus(1)  # resumed where one GPU is visible: cuda:0
    restore_rng(load_state(ckpt)["rngs"][0], torch.device("cuda", 0))
    assert torch.equal(_draw(gens[0]), expected)


def test_restore_touches_only_the_trial_device(fake_gpus, tmp_path: Path) -> None:
    gens = fake_gpus(2)
    ckpt = _save(tmp_path, torch.device("cuda", 0))
    saved, other = gens[0].get_state(), gens[1].get_state()
    _draw(gens[0])
    moved = gens[0].get_state()
    restore_rng(load_state(ckpt)["rngs"][0], torch.device("cuda", 1))  # another index
    assert torch.equal(gens[1].get_state(), saved) and not torch.equal(saved, other)
    assert torch.equal(gens[0].get_state(), moved)  # cuda:0 is not the trial's device now


def test_gpu_checkpoint_resumes_on_the_cpu(fake_gpus, tmp_path: Path) -> None:
    fake_gpus(2)
    torch.manual_seed(7)
    random.seed(7)
    ckpt = _save(tmp_path, torch.device("cuda", 1))
    expected = (torch.rand(3), random.random())
    state = load_state(ckpt)["rngs"][0]
    assert state["cuda"].dtype == torch.uint8  # one device's state, not a list
    torch.cuda.is_available = torch.cuda.is_initialized = lambda: False  # a CPU-only machine
    torch.manual_seed(0)
    restore_rng(state, torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_older_checkpoints_with_every_device_state_still_restore(fake_gpus) -> None:
    gens = fake_gpus(2)
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "cuda": [g.get_state() for g in gens],  # calibtune before issue 27
    }
    _draw(gens[1])
    assert not torch.equal(gens[1].get_state(), state["cuda"][1])
    restore_rng(state, torch.device("cuda", 1))
    assert torch.equal(gens[1].get_state(), state["cuda"][1])
    fake_gpus(1)
    restore_rng(state, torch.device("cuda", 3))  # no such entry: the CUDA state is skipped
