"""Mixed precision of a trial's forwards: autocast dtype, fp16's GradScaler, channels_last.

Only the model's forward runs under autocast; losses, metrics and post-hoc methods get float32
logits (`Precision.forward` upcasts) and compute in float32/float64 as everywhere else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["PRECISIONS", "Precision"]

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Precision:
    """``name``: ``fp32`` (no autocast), ``bf16`` or ``fp16`` (autocast to that dtype; fp16 scales
    the loss with a ``GradScaler``, whose state the trial checkpoints); ``channels_last``: the
    model and 4-D batches in NHWC memory format (convolutions on tensor cores want it).

    >>> p = Precision("bf16", torch.device("cpu"))
    >>> with p.autocast():
    ...     y = torch.nn.Linear(2, 2)(torch.ones(1, 2))
    >>> y.dtype
    torch.bfloat16
    """

    name: str = "fp32"
    device: torch.device | str = "cpu"
    channels_last: bool = False

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise ValueError(
                f"train.precision: expected one of {', '.join(PRECISIONS)}, got {self.name!r}"
            )
        self.device = torch.device(self.device)
        self.scaler: Any = None
        if self.name == "fp16":
            self.scaler = torch.amp.GradScaler(self.device.type)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The autocast region of a forward (none for fp32)."""
        dtype = PRECISIONS[self.name]
        if dtype is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=dtype):
            yield

    def prepare(self, model: nn.Module) -> nn.Module:
        """``model`` in the memory format the batches will have (in place; returned)."""
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        return model

    def forward(self, model: nn.Module, x: Tensor) -> Tensor:
        """``model(x)`` under autocast, as float32 logits."""
        if self.name == "fp32":  # per step: no context manager at all
            return model(x).float()
        with self.autocast():
            out = model(x)
        return out.float()

    def step(
        self,
        loss: Tensor,
        optimizer: torch.optim.Optimizer,
        params: Any,
        grad_clip: float | None,
    ) -> None:
        """Backward, optional gradient-norm clip (on unscaled gradients) and optimizer step.

        With fp16 the scaler skips a step whose gradients overflowed (and lowers its scale); that
        check reads one flag from the device per step (GradScaler's design)."""
        optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            if grad_clip is not None:
                nn.utils.clip_grad_norm_(params, grad_clip)
            optimizer.step()
            return
        self.scaler.scale(loss).backward()
        if grad_clip is not None:
            self.scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(params, grad_clip)
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        return {} if self.scaler is None else dict(self.scaler.state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
