"""A loss's per-step computation through ``torch.compile``, with the eager path as the fallback.

On CUDA a calibration loss's forward+backward is some 30-46 small ATen kernels against
`F.cross_entropy`'s 5, so it is launch-bound; inductor fuses the fused autograd functions'
bodies (`calibtune.losses._kernel`, `calibtune.losses._regularized`) into a few kernels. On CPU
the eager kernels are tuned already, so ``auto`` compiles on CUDA only. Whether that default
pays is decided by a trial, not by a kernel benchmark: `make gpu-check`'s ``loss.compile on vs
off`` step times the same 2-epoch trial both ways, compile time included, and if ``on`` is not
faster ``auto`` must become eager on CUDA too. Not yet measured: no GPU has run that step.

`compile_loss(loss, mode, device)` replaces the module's ``forward`` (the per-step kernel) on
that instance; everything else — AdaFocal's ``update`` and γ buffers (read by the compiled code,
updated in place, so no recompile), the mixup family's ``batch_transform``, ``state_dict`` — is
the module's own. Shapes are static (``dynamic=False``): an epoch's last, smaller batch
compiles once more. The first call at each new (shape, dtype, grad) runs the compiled forward
and backward on a detached copy, so a compile failure (no C++ compiler or triton, an op
inductor cannot lower) surfaces there; it and any later failure of the compiled call switch the
instance to the eager path for good, with one warning naming the loss and the reason.
"""

from __future__ import annotations

import itertools
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from calibtune._validate import check_choice

#: ``loss.compile`` choices: ``auto`` compiles on CUDA only
COMPILE_MODES: tuple[str, ...] = ("auto", "on", "off")


def compile_mode(value: object, where: str = "compile") -> str:
    """``value`` as one of `COMPILE_MODES` (YAML 1.1 reads a bare ``on``/``off`` as a boolean:
    those mean ``on``/``off``); anything else raises a one-line ``ValueError`` naming ``where``
    (a trial's ``loss.compile``, a study arm's ``losses[i].compile``).

    >>> compile_mode(False), compile_mode("auto")
    ('off', 'auto')
    >>> compile_mode("yes")
    Traceback (most recent call last):
    ...
    calibtune._validate.ValidationError: compile: expected one of 'auto', 'on', 'off', got 'yes'
    """
    if isinstance(value, bool):
        value = "on" if value else "off"
    return check_choice(value, where, COMPILE_MODES)


def wants_compile(mode: str, device: torch.device | str) -> bool:
    """Whether ``mode`` compiles a loss on ``device``: ``on`` always, ``off`` never, ``auto`` on
    CUDA only (CPU keeps the tuned eager kernels).

    >>> wants_compile("auto", "cpu"), wants_compile("auto", "cuda:0"), wants_compile("on", "cpu")
    (False, True, True)
    """
    return mode == "on" or (mode == "auto" and torch.device(device).type == "cuda")


def compile_hook(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` through ``torch.compile`` (inductor, static shapes); the one place a loss compiles
    (tests replace it to simulate a failing compiler). Lazy: nothing compiles before a call.

    >>> callable(compile_hook(torch.sin))
    True
    """
    return torch.compile(fn, dynamic=False)


def _reason(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


class CompiledForward:
    """The compiled ``forward`` of one loss module with its eager ``forward`` as the fallback.

    ``compiled`` is None once the eager path has taken over (``reason`` says why).
    """

    def __init__(self, name: str, eager: Callable[..., torch.Tensor]) -> None:
        self.name, self.eager = name, eager
        self.reason: str | None = None
        self._seen: set[tuple[Any, ...]] = set()
        try:
            self.compiled: Callable[..., torch.Tensor] | None = compile_hook(eager)
        except Exception as exc:  # any compile failure means eager, never a failed trial
            self.compiled = None
            self._fall_back(exc)

    def _fall_back(self, exc: BaseException) -> None:
        self.compiled, self.reason = None, _reason(exc)
        warnings.warn(
            f"loss {self.name}: torch.compile failed ({self.reason}); using the eager path",
            RuntimeWarning,
            stacklevel=3,
        )

    def _probe(self, logits: torch.Tensor, targets: Any) -> None:
        """Compile forward and backward for this input signature on a detached copy (backward
        graphs compile lazily, at the first ``backward``, outside this wrapper otherwise)."""
        assert self.compiled is not None
        grad = torch.is_grad_enabled() and logits.requires_grad
        key = (tuple(logits.shape), logits.dtype, logits.device, grad)
        if key in self._seen:
            return
        z = logits.detach().clone().requires_grad_(grad)
        out = self.compiled(z, targets)
        if grad and out.requires_grad:
            torch.autograd.grad(out.sum(), z)
        self._seen.add(key)

    def __call__(self, logits: torch.Tensor, targets: Any) -> torch.Tensor:
        if self.compiled is not None:
            try:
                self._probe(logits, targets)
                return self.compiled(logits, targets)
            except Exception as exc:
                out = self.eager(logits, targets)  # an error of the inputs raises here, as eager
                self._fall_back(exc)
                return out
        return self.eager(logits, targets)


_instances = itertools.count()


def _own_forward(loss: nn.Module) -> Callable[..., torch.Tensor]:
    """``loss``'s class ``forward`` bound to it, on a copy of its code object: dynamo keeps its
    graphs and its recompile limit (8) per code object, which every `CalibrationLoss` sharing
    ``forward`` would otherwise share — the ninth loss of a process (a reused trial worker) would
    silently run eager."""
    fn = type(loss).forward
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(_instances)}")
    own = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    own.__kwdefaults__ = fn.__kwdefaults__
    return types.MethodType(own, loss)


def compile_loss(loss: nn.Module, mode: str = "auto", device: torch.device | str = "cpu") -> Any:
    """``loss`` with its ``forward`` compiled where ``mode`` wants it on ``device`` (in place;
    returned for chaining); ``mmce`` (an O(B²) batch kernel, not launch-bound) stays eager.

    >>> from calibtune.losses import build_loss
    >>> loss = compile_loss(build_loss("focal"), "auto", "cpu")  # auto: eager on CPU
    >>> isinstance(loss.forward, CompiledForward)
    False
    """
    mode = compile_mode(mode)
    name = getattr(loss, "name", type(loss).__name__)
    if not wants_compile(mode, device) or name == "mmce":
        return loss
    # an instance attribute: nn.Module.__call__ looks ``forward`` up on the instance first
    loss.forward = CompiledForward(name, _own_forward(loss))
    return loss
