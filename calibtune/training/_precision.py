"""Mixed precision of a trial's forwards: autocast dtype, fp16's GradScaler, channels_last.

Only the model's body runs under autocast. Its classifier — the last ``nn.Linear`` — runs with
autocast disabled on float32 features (`float32_head`), so every logit that feeds a loss
statistic (AdaFocal's bins), a metric, a post-hoc fit or an OOD score is computed in float32:
upcasting bf16 logits afterwards would keep their 8-bit mantissa (confidences off by up to
0.02, AdaECE by some 6 % on synthetic logits). Losses, metrics and post-hoc methods then
compute in float32/float64 as everywhere else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["PRECISIONS", "Precision", "float32_head", "tf32_enabled"]

#: autocast dtype per ``train.precision``; ``fp32`` is IEEE float32 throughout (TF32 off for
#: matmuls and cuDNN convolutions), ``tf32`` float32 tensors with TF32 tensor-core math on
#: Ampere and later (`tf32_enabled`), neither autocasts
PRECISIONS = {"fp32": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
_MARK = "_calibtune_float32_head"  # set on a model whose head `float32_head` converted


def tf32_enabled(precision: str) -> bool:
    """Whether ``train.precision`` allows TF32 (10-bit mantissa products, float32 accumulation)
    in CUDA matmuls and cuDNN convolutions: only ``tf32`` does, so ``fp32`` is float32 on every
    GPU (torch's default turns TF32 on for cuDNN convolutions from Ampere on) and autocast's
    float32 regions (the head) stay float32 too.

    >>> tf32_enabled("fp32"), tf32_enabled("tf32"), tf32_enabled("bf16")
    (False, True, False)
    """
    return precision == "tf32"


def _autocast_on(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cpu":
            return bool(torch.is_autocast_cpu_enabled())
        return device_type == "cuda" and bool(torch.is_autocast_enabled())
    except RuntimeError:  # a device type autocast does not know (meta): nothing to disable
        return False


class _Float32Head(nn.Linear):
    """An ``nn.Linear`` that computes ``x.float() @ Wᵀ + b`` in float32 whatever autocast is on
    (its gradient flows back to the body's low-precision features through the cast)."""

    def forward(self, x: Tensor) -> Tensor:
        device_type = x.device.type
        if not _autocast_on(device_type):
            return F.linear(x.float(), self.weight, self.bias)
        with torch.autocast(device_type, enabled=False):
            return F.linear(x.float(), self.weight, self.bias)


def float32_head(model: nn.Module) -> nn.Module:
    """``model`` with its classifier, the last ``nn.Linear`` it registers, computing in float32
    under autocast (in place, idempotent; returned). Parameters, ``state_dict`` keys and the
    fp32 forward are unchanged: only the head's class becomes a float32 ``nn.Linear``. Every
    model of `calibtune.models` ends in one (``fc``, ``classifier`` or ``net[-1]``).

    >>> m = float32_head(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)))
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     m[0](torch.ones(1, 3)).dtype, m(torch.ones(1, 3)).dtype
    (torch.bfloat16, torch.float32)
    """
    if getattr(model, _MARK, False):
        return model
    heads = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not heads or type(heads[-1]) not in (nn.Linear, _Float32Head):
        found = type(heads[-1]).__name__ if heads else "none"
        raise ValueError(
            "train.precision: expected a model whose last nn.Linear is its classifier "
            f"(a plain nn.Linear, run in float32 under autocast), got {found}"
        )
    heads[-1].__class__ = _Float32Head
    setattr(model, _MARK, True)
    return model


@dataclass
class Precision:
    """``name``: ``fp32`` or ``tf32`` (no autocast), ``bf16`` or ``fp16`` (autocast to that
    dtype; fp16 scales the loss with a ``GradScaler``, whose state the trial checkpoints);
    ``channels_last``: the model and 4-D batches in NHWC memory format (convolutions on tensor
    cores want it).

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
        """``model`` in the memory format the batches will have and, under autocast, with a
        float32 head (`float32_head`) (in place; returned)."""
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        if PRECISIONS[self.name] is not None:
            float32_head(model)
        return model

    def forward(self, model: nn.Module, x: Tensor) -> Tensor:
        """``model(x)``: the body under autocast, the head in float32 (float32 logits)."""
        if PRECISIONS[self.name] is None:  # per step: no context manager at all
            return model(x).float()
        if not getattr(model, _MARK, False):
            float32_head(model)
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
