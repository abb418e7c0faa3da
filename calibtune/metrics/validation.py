"""Input checks shared by metrics, post-hoc methods and the AdaFocal controller.

One place; every message names the argument and the rule (``labels: expected values in [0, 9]
for 10 classes, got range [0, 10]``). Public so that `calibtune.losses` and `calibtune.posthoc`
check their arrays exactly as `calibtune.metrics` does.

>>> p, y = check_probs_labels([[0.9, 0.1], [0.2, 0.8]], [0, 1])
>>> tuple(p.shape), y.dtype
((2, 2), torch.int64)
>>> check_n_bins(0)
Traceback (most recent call last):
...
ValueError: n_bins: expected an integer >= 1, got 0
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = [
    "ArrayLike",
    "as_tensor",
    "check_labels",
    "check_logits_labels",
    "check_matrix",
    "check_n_bins",
    "check_probs",
    "check_probs_labels",
    "logits_labels",
    "probs_labels",
    "scores_matrix",
]

ArrayLike = Any  # torch.Tensor | np.ndarray | nested sequences


def as_tensor(x: ArrayLike, name: str) -> torch.Tensor:
    """``x`` as a contiguous tensor (no copy when it is one already, on its own device).

    Every public metric, post-hoc method and the AdaFocal controller take their arrays through
    here, so they accept any layout — transposed views, ``probs[::2]``, numpy arrays with
    negative strides (which ``torch.as_tensor`` rejects) — and the code behind may use ``view``.
    """
    if isinstance(x, torch.Tensor):
        return x.detach().contiguous()
    try:
        arr = np.asarray(x)
        return torch.as_tensor(arr if arr.flags.c_contiguous else arr.copy(order="C"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: expected an array or tensor, got {type(x).__name__}") from exc


def check_n_bins(n_bins: Any) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins: expected an integer >= 1, got {n_bins!r}")
    return int(n_bins)


def _float(x: torch.Tensor, name: str) -> torch.Tensor:
    if not (x.is_floating_point()):
        if x.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
            x = x.to(torch.get_default_dtype())
        else:
            raise ValueError(f"{name}: expected a floating-point array, got dtype {x.dtype}")
    return x


def check_labels(labels: ArrayLike, n: int, k: int, device: torch.device) -> torch.Tensor:
    y = as_tensor(labels, "labels")
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"labels: expected shape ({n},) to match the scores, got {tuple(y.shape)}")
    if y.is_floating_point():
        if not torch.all(y == y.round()):
            raise ValueError("labels: expected integer class indices, got non-integer values")
    elif y.dtype == torch.bool:
        raise ValueError("labels: expected integer class indices, got booleans")
    y = y.to(device=device, dtype=torch.long)
    if n and (int(y.min()) < 0 or int(y.max()) >= k):
        raise ValueError(
            f"labels: expected values in [0, {k - 1}] for {k} classes, "
            f"got range [{int(y.min())}, {int(y.max())}]"
        )
    return y


def check_matrix(x: ArrayLike, name: str) -> torch.Tensor:
    """(N, K) finite floating-point scores with N >= 1 and K >= 2."""
    return _matrix(x, name)[0]


def _matrix(x: ArrayLike, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`check_matrix` that also returns the float64 row sums it computed (N,)."""
    t = _float(as_tensor(x, name), name)
    if t.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D (N, K) array, got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name}: expected at least one sample, got 0 rows")
    if t.shape[1] < 2:
        raise ValueError(f"{name}: expected K >= 2 classes, got shape {tuple(t.shape)}")
    # one reduction instead of an isfinite pass: NaN or ±inf anywhere makes the row sum non-finite
    row = t.sum(1, dtype=torch.float64)
    if not bool(torch.isfinite(row).all()):
        bad = int((~torch.isfinite(row)).nonzero()[0, 0])
        raise ValueError(f"{name}: expected finite values, got NaN/inf (first in row {bad})")
    return t, row


def check_probs(probs: ArrayLike, atol: float | None = None) -> torch.Tensor:
    """(N, K) probabilities: finite, in [0, 1], rows summing to 1 within ``atol``."""
    p, row = _matrix(probs, "probs")
    if atol is None:
        atol = 1e-3 if p.dtype in (torch.float16, torch.bfloat16) else 1e-4
    lo, hi = torch.aminmax(p)
    if bool(lo < 0) or bool(hi > 1):
        raise ValueError(
            f"probs: expected values in [0, 1], got range [{float(lo):.4g}, {float(hi):.4g}]"
            " (pass logits= if these are scores)"
        )
    dev = (row - 1).abs()
    if bool((dev > atol).any()):
        i = int(dev.argmax())
        raise ValueError(
            f"probs: expected rows summing to 1 (tolerance {atol:g}), got row {i} summing to "
            f"{float(p[i].sum(dtype=torch.float64)):.6g}"
        )
    return p


def check_probs_labels(
    probs: ArrayLike, labels: ArrayLike, n_bins: Any | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    if n_bins is not None:
        check_n_bins(n_bins)
    p = check_probs(probs)
    return p, check_labels(labels, p.shape[0], p.shape[1], p.device)


def check_logits_labels(logits: ArrayLike, labels: ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
    z = check_matrix(logits, "logits")
    return z, check_labels(labels, z.shape[0], z.shape[1], z.device)


# -- the same entry points with a switch: validate_args=False only converts ----------------------


def _labels_as(labels: ArrayLike, like: torch.Tensor) -> torch.Tensor:
    return as_tensor(labels, "labels").to(device=like.device, dtype=torch.long)


def probs_labels(
    probs: ArrayLike, labels: ArrayLike, n_bins: Any | None = None, *, validate_args: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """`check_probs_labels`, or with ``validate_args=False`` only the conversion to tensors
    (labels to int64 on the probabilities' device): no pass over the values, no device sync.

    For callers whose arrays were checked already (e.g. probabilities a fitted calibrator
    returned, scored by several metrics in turn).

    >>> p, y = probs_labels([[0.9, 0.1]], [0], validate_args=False)
    >>> p.dtype, y.dtype
    (torch.float64, torch.int64)
    """
    if validate_args:
        return check_probs_labels(probs, labels, n_bins)
    p = as_tensor(probs, "probs")
    return p, _labels_as(labels, p)


def logits_labels(
    logits: ArrayLike, labels: ArrayLike, *, validate_args: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """`check_logits_labels`, or with ``validate_args=False`` only the conversion to tensors."""
    if validate_args:
        return check_logits_labels(logits, labels)
    z = as_tensor(logits, "logits")
    return z, _labels_as(labels, z)


def scores_matrix(x: ArrayLike, name: str, *, validate_args: bool = True) -> torch.Tensor:
    """`check_probs` (``name="probs"``) or `check_matrix`, or only `as_tensor` when
    ``validate_args`` is False."""
    if not validate_args:
        return as_tensor(x, name)
    return check_probs(x) if name == "probs" else check_matrix(x, name)
