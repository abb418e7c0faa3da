"""The GPU path's smaller items without a GPU: BatchNorm buffers reach the other ranks in one
flattened broadcast per dtype; ``train.precision: fp32`` is float32 (TF32 off) and ``tf32`` an
explicit choice, recorded with the trial's parameters."""

from __future__ import annotations

import torch
import torch.distributed as dist

from calibtune.models import build_model
from calibtune.study._trainable import TAG_PRECISION, trial_precision
from calibtune.training import _loop as loop
from calibtune.training import tf32_enabled
from calibtune.trial import config_from_dict
from calibtune.trial._worker import determinism


def test_batchnorm_buffers_are_one_flattened_broadcast_per_dtype(monkeypatch):
    """This process plays rank 1: the stubbed ``dist.broadcast`` (below `_sync_buffers`)
    fills each flat tensor with rank 0's values; every buffer must come out as rank 0's."""
    torch.manual_seed(0)
    rank0 = build_model("resnet50", 10, (3, 32, 32))
    mine = build_model("resnet50", 10, (3, 32, 32))
    for buf in rank0.buffers():
        buf.add_(torch.rand_like(buf.float()).to(buf.dtype) + 1)
    source = {b.dtype: [] for b in rank0.buffers()}
    for b in rank0.buffers():
        source[b.dtype].append(b)
    calls = []

    def broadcast(tensor, src):
        dtype = tensor.dtype
        calls.append((dtype, tensor.numel(), src))
        tensor.copy_(torch.cat([b.reshape(-1) for b in source[dtype]]))

    monkeypatch.setattr(dist, "broadcast", broadcast)
    n_buffers = len(list(mine.buffers()))
    assert n_buffers > 100  # ResNet-50: 53 BatchNorms × 3 buffers
    loop._sync_buffers(mine)
    assert [(d, s) for d, _, s in calls] == [(torch.float32, 0), (torch.int64, 0)]
    for a, b in zip(mine.buffers(), rank0.buffers(), strict=True):
        assert torch.equal(a, b)


def test_fp32_turns_tf32_off_and_tf32_turns_it_on():
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    before = (cudnn.allow_tf32, matmul.allow_tf32)
    cudnn.allow_tf32 = True  # torch's default for cuDNN
    try:
        for precision, on in (("fp32", False), ("bf16", False), ("tf32", True)):
            for deterministic in (False, True):
                with determinism(deterministic, True, tf32_enabled(precision)):
                    assert (cudnn.allow_tf32, matmul.allow_tf32) == (on, on), precision
            assert cudnn.allow_tf32 is True  # restored
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = before


def test_tf32_is_a_precision_of_the_config_and_tagged_on_the_trial_run():
    base = {"name": "t", "data": {"name": "digits"}, "model": {"name": "mlp"}}
    assert config_from_dict({**base, "train": {"precision": "tf32"}}).train.precision == "tf32"
    assert TAG_PRECISION == "calibtune.precision"
    assert trial_precision({"train": {"precision": "tf32"}}, {"loss": "focal"}) == "tf32"
    assert trial_precision({}, {"train.precision": "bf16"}) == "bf16"
