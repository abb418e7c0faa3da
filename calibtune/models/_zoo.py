"""The model registry: ``build_model(name, num_classes, input_shape, **params) -> nn.Module``.

Every model maps a float batch ``(B, *input_shape)`` to logits ``(B, num_classes)``; none has a
temperature or softmax inside (post-hoc methods and losses act on the logits).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from .._registry import Param, Registry
from ._init import INIT_SCHEMES, ModelInit, init_weights

__all__ = [
    "MODELS",
    "add_model",
    "build_model",
    "check_any_shape",
    "check_image_shape",
    "check_signal_shape",
    "common_params",
    "count_parameters",
    "list_models",
    "model_init",
]

MODELS: Registry[nn.Module] = Registry("model")
_INITS: dict[str, ModelInit] = {}
#: a builder that leaves PyTorch's per-layer defaults (the small models)
TORCH_DEFAULT = ModelInit("torch_default", "PyTorch's per-layer defaults", "torch_default")


def common_params(default_shape: tuple[int, ...]) -> list[Param]:
    """The two structural params every model declares (never searched)."""
    return [
        Param("num_classes", 10, kind="int", low=2, searchable=False, doc="number of classes K"),
        Param(
            "input_shape",
            default_shape,
            kind="any",
            searchable=False,
            doc="shape of one input without the batch axis: (C, H, W) or (C, L)",
        ),
    ]


def _as_shape(input_shape: Any, owner: str, expected: str, ndim: int | None) -> tuple[int, ...]:
    ok = isinstance(input_shape, Sequence) and not isinstance(input_shape, str)
    shape = tuple(input_shape) if ok else ()
    ok = ok and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape)
    ok = ok and (len(shape) == ndim if ndim is not None else len(shape) >= 1)
    if not ok:
        raise ValueError(f"{owner}: input_shape: expected {expected}, got {input_shape!r}")
    return shape


def check_image_shape(input_shape: Any, owner: str) -> tuple[int, int, int]:
    """``(C, H, W)`` with positive sizes, else ``ValueError``."""
    c, h, w = _as_shape(input_shape, owner, "(C, H, W) with positive sizes", 3)
    return c, h, w


def check_signal_shape(input_shape: Any, owner: str) -> tuple[int, int]:
    """``(C, L)`` with positive sizes, else ``ValueError``."""
    c, length = _as_shape(input_shape, owner, "(C, L) with positive sizes", 2)
    return c, length


def check_any_shape(input_shape: Any, owner: str) -> tuple[int, ...]:
    """Any non-empty tuple of positive sizes, else ``ValueError``."""
    return _as_shape(input_shape, owner, "a tuple of positive sizes", None)


def add_model(
    name: str,
    build: Callable[..., nn.Module],
    check: Callable[[Any, str], tuple[int, ...]],
    default_shape: tuple[int, ...],
    summary: str,
    tags: Sequence[str],
    extra: Sequence[Param] = (),
    init: ModelInit = TORCH_DEFAULT,
) -> None:
    """Register model ``name``: its factory checks ``input_shape`` with ``check`` (one of the
    ``check_*_shape`` functions; errors name the model), then returns ``build(shape,
    num_classes, **extra)``. ``extra`` declares the model's own params after `common_params`;
    ``init`` records the network's initialisation (`ModelInit`: its authors' scheme)."""
    if init.scheme not in INIT_SCHEMES:
        raise ValueError(f"{name}: init: expected one of {', '.join(INIT_SCHEMES)}, got {init}")
    _INITS[name] = init

    def factory(num_classes: int, input_shape: Sequence[int], **params: Any) -> nn.Module:
        return build(check(input_shape, name), num_classes, **params)

    params = [*common_params(default_shape), *extra]
    MODELS.add(name, factory, params=params, summary=summary, tags=tags)


def build_model(
    name: str, num_classes: int, input_shape: Sequence[int], init: str = "auto", **params: Any
) -> nn.Module:
    """Build the registered model ``name`` for ``num_classes`` classes and inputs of shape
    ``input_shape`` (no batch axis); ``params`` are the model's declared extras (e.g. ``hidden``
    for ``mlp``), validated against the registry. Unknown names raise ``ValueError`` listing the
    registered ones. ``init``: ``auto`` (the network's recorded scheme, `model_init`) or one of
    `INIT_SCHEMES` (``calibtune.models._init``); weights are drawn from torch's global
    generator, so seed it first for reproducible weights."""
    model = MODELS.build(name, num_classes=num_classes, input_shape=input_shape, **params)
    recorded = model_init(name)
    scheme = recorded.scheme if init == "auto" else init
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"init: expected auto or one of {', '.join(INIT_SCHEMES)}, got {init!r}")
    return model if scheme == recorded.built_with else init_weights(model, scheme)


def model_init(name: str) -> ModelInit:
    """The initialisation recorded for model ``name`` (its authors' scheme and where it is read
    from).

    >>> model_init("resnet110_bottleneck").scheme, model_init("wide_resnet26_10").scheme
    ('torch_default', 'kaiming_normal_fan_out')
    """
    MODELS.get(name)  # unknown names: the registry's message
    return _INITS[name]


def list_models() -> list[str]:
    """Registered model names, sorted."""
    return MODELS.names()


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
