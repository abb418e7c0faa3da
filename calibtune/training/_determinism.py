"""Which ATen ops a forward/backward dispatches that have no deterministic CUDA kernel.

``train.deterministic`` runs a trial under ``torch.use_deterministic_algorithms(True)``, where
such an op raises and stops the trial. On the CPU those ops run without complaint, so a model
that uses one (``nn.AdaptiveAvgPool2d(2)``'s backward) passes every CPU test and fails only on
the first deterministic GPU run. `cuda_nondeterministic_ops` records the ops a callable
dispatches (a ``TorchDispatchMode``; it works on the ``meta`` device, so a ResNet-50 costs no
arithmetic) and returns those of `NONDETERMINISTIC_CUDA_OPS`.

Reference: the list of ops that "throw a RuntimeError when mode=True" in
``torch.use_deterministic_algorithms``' documentation (torch 2.4 to 2.14), by ATen name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["NONDETERMINISTIC_CUDA_OPS", "cuda_nondeterministic_ops"]

#: ATen overload packets whose CUDA kernel refuses deterministic mode (torch's documented list:
#: the backward of adaptive/3-D/fractional pools, interpolation and reflection padding, max
#: unpooling, 2-D NLL, CTC, max-EmbeddingBag, put_, histc, weighted bincount, median with
#: indices, grid_sample, scatter_reduce with prod)
NONDETERMINISTIC_CUDA_OPS = frozenset(
    {
        "avg_pool3d_backward",
        "_adaptive_avg_pool2d_backward",
        "adaptive_avg_pool2d_backward",
        "_adaptive_avg_pool3d_backward",
        "adaptive_avg_pool3d_backward",
        "adaptive_max_pool2d_backward",
        "fractional_max_pool2d_backward",
        "fractional_max_pool3d_backward",
        "max_unpool2d",
        "max_unpool3d",
        "upsample_linear1d_backward",
        "upsample_bilinear2d_backward",
        "_upsample_bilinear2d_aa_backward",
        "upsample_bicubic2d_backward",
        "_upsample_bicubic2d_aa_backward",
        "upsample_trilinear3d_backward",
        "reflection_pad1d_backward",
        "reflection_pad2d_backward",
        "reflection_pad3d_backward",
        "nll_loss2d_forward",
        "_ctc_loss_backward",
        "_embedding_bag_backward",
        "_embedding_bag_dense_backward",
        "put_",
        "put",
        "histc",
        "bincount",
        "median",
        "nanmedian",
        "grid_sampler_2d_backward",
        "grid_sampler_3d_backward",
        "scatter_reduce",
        "scatter_reduce_",
    }
)


def _arg(args: Any, kwargs: Any, index: int, name: str) -> Any:
    return kwargs.get(name) if name in kwargs else (args[index] if len(args) > index else None)


#: ops of the list that refuse only in some calls (torch's wording): bincount with weights,
#: median/nanmedian with indices (the ``dim`` overloads), scatter_reduce with ``prod``
_ONLY_WHEN = {
    "bincount": lambda f, a, k: _arg(a, k, 1, "weights") is not None,
    "median": lambda f, a, k: f._overloadname.startswith("dim"),
    "nanmedian": lambda f, a, k: f._overloadname.startswith("dim"),
    "scatter_reduce": lambda f, a, k: _arg(a, k, 4, "reduce") == "prod",
    "scatter_reduce_": lambda f, a, k: _arg(a, k, 4, "reduce") == "prod",
}


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func._overloadpacket.__name__
        if name in NONDETERMINISTIC_CUDA_OPS:
            when = _ONLY_WHEN.get(name)
            if when is None or when(func, args, kwargs):
                self.ops.add(name)
        return func(*args, **kwargs)


def cuda_nondeterministic_ops(fn: Callable[[], Any]) -> set[str]:
    """The ops of `NONDETERMINISTIC_CUDA_OPS` that ``fn()`` dispatches in a call that has no
    deterministic CUDA kernel (run it on ``meta`` or CPU tensors: the dispatch is the same as
    on CUDA): ``bincount`` only with weights, ``median`` only with indices, ``scatter_reduce``
    only with ``prod``.

    >>> import torch
    >>> x = torch.ones(1, 1, 8, 8, requires_grad=True)
    >>> sorted(cuda_nondeterministic_ops(
    ...     lambda: torch.nn.AdaptiveAvgPool2d(2)(x).sum().backward()))
    ['_adaptive_avg_pool2d_backward']
    >>> cuda_nondeterministic_ops(lambda: torch.nn.AvgPool2d(4)(x).sum().backward())
    set()
    >>> n = torch.tensor([0, 1, 1])
    >>> cuda_nondeterministic_ops(lambda: torch.bincount(n)), sorted(
    ...     cuda_nondeterministic_ops(lambda: torch.bincount(n, torch.ones(3))))
    (set(), ['bincount'])
    """
    with _Recorder() as rec:
        fn()
    return rec.ops
