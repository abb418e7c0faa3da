"""Every rank reaches every collective, and DDP evaluation uses one model (issue 27, items 1, 4).

Two spawned processes in one gloo process group (`tests/_collective_ranks.py`) run the real
trial worker under each config branch and record the ``torch.distributed`` collectives each rank
enters: the sequences must be equal. A rank left waiting fails after gloo's 120 s timeout instead
of hanging, so a divergence shows as an error and unequal sequences. Before issue 27, with
``eval.select_epoch: best`` on a ``val_shift/`` metric only rank 0 (which alone computes those
keys) saw a new best epoch and entered the checkpoint's all-gather.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._collective_ranks import both

WORLD = 2


def _spawn(target: Any, tmp_path: Path, *args: Any, timeout: float = 420) -> None:
    ctx = mp.get_context("spawn")
    init = tmp_path / "pg_init"
    procs = [
        ctx.Process(target=target, args=(r, WORLD, str(init), str(tmp_path), *args))
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not any(p.is_alive() for p in procs)


def _base(**over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "seed": 3,
        "data": {"name": "digits", "ood": [], "shift": []},
        "model": {"name": "mlp"},
        "train": {"epochs": 3, "batch_size": 256, "checkpoint_every": 1},
        "eval": {"posthoc": [], "bootstrap": 0, "figures": False},
        "scaling": {"num_workers": WORLD},
    }
    for key, value in over.items():
        section, _, leaf = key.partition("__")
        cfg[section] = {**cfg.get(section, {}), leaf: value}
    return cfg


SHIFT = "val_shift/digits_noise/ece"
BRANCHES = {
    "last": _base(),
    "best_val_sparse_checkpoints": _base(
        train__checkpoint_every=5, eval__select_epoch="best", eval__select_metric="val/ece"
    ),
    # the issue's trial: the select metric exists on rank 0 only
    "best_shift_sparse_checkpoints": _base(
        data__shift=["digits_noise"],
        train__checkpoint_every=5,
        eval__epoch_shift=True,
        eval__select_epoch="best",
        eval__select_metric=SHIFT,
    ),
    # AdaFocal's per-epoch and every-N-batches updates, BatchNorm buffers, epoch post-hoc
    "adaptive_bn_posthoc": _base(
        model__name="small_cnn",
        loss__name="adafocal",
        train__checkpoint_every=2,
        eval__epoch_posthoc=["ts"],
        eval__epoch_selective=True,
        eval__test_every_epoch=False,
    ),
    "adaptive_every_batches_shift_last": _base(
        data__shift=["digits_noise"],
        loss__name="adafocal",
        loss__params={"update_every": 2},
        eval__epoch_shift=True,
    ),
}


@pytest.fixture(scope="module")
def ranks_ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both ranks' records: the BatchNorm step, then every branch (one spawn for both tests)."""
    out = tmp_path_factory.mktemp("ranks")
    _spawn(both, out, BRANCHES)
    return out


@pytest.mark.slow  # two spawned processes, five 3-epoch digits trials each: ~30 s
def test_every_rank_enters_the_same_collectives_under_every_branch(ranks_ran: Path) -> None:
    ranks = [json.loads((ranks_ran / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r, got in enumerate(ranks):
        assert got["error"] is None, f"rank {r}: {got['error']}"
    for name in BRANCHES:
        seqs = [got["calls"][name] for got in ranks]
        assert seqs[0] == seqs[1], name
        assert seqs[0].count("report") == 3, name  # one report per epoch
    issue = ranks[0]["calls"]["best_shift_sparse_checkpoints"]
    assert "all_gather_object" in issue  # epoch 1 is a new best: every rank checkpoints
    assert "broadcast" in ranks[0]["calls"]["adaptive_bn_posthoc"]  # BatchNorm buffers


@pytest.mark.slow  # the spawn above
def test_gathered_eval_logits_are_rank0_models_on_the_full_set(ranks_ran: Path) -> None:
    """After one DDP step each rank's BatchNorm running statistics include its own half-batch;
    the loop's gathered validation logits must still be rank 0's model's (the checkpoint's)."""
    got = torch.load(ranks_ran / "bn.pt", weights_only=True)
    assert got["gathered"].shape == got["rank0"].shape
    torch.testing.assert_close(got["gathered"], got["rank0"], rtol=1e-5, atol=1e-5)
