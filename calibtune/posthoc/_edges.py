"""Where a fitted temperature sits in the range its fit searched.

A temperature chosen at either end of its search range (the grid's first or last value, or a
bound of the continuous NLL search) is not an estimate of the model's miscalibration: the
criterion may still fall beyond the range (e.g. digits' ``posthoc/ts/T`` = 0.1, the grid's
minimum, on trials with 2–6 test errors). Trials log it as ``posthoc/<method>/T_at_edge``
(1.0 or 0.0) so that tables, ``report`` and the results page can flag it (issue 31, item 5).
"""

from __future__ import annotations

import math
from typing import Any

from calibtune.metrics.keys import T_AT_EDGE

__all__ = ["T_AT_EDGE", "fitted_values", "t_at_edge", "t_range"]


def t_range(method: Any) -> tuple[float, float] | None:
    """``(lowest, highest)`` temperature the fit of ``method`` can choose, or None when the method
    has no bounded temperature search. Fitted or not.

    Grid fits (`TemperatureScaling` on any criterion but grid-less NLL, `FocalTemperatureScaling`):
    the grid's ends; the continuous NLL fit: its bounds ``(t_min, t_max)``.

    >>> from calibtune.posthoc import build_posthoc
    >>> t_range(build_posthoc("ts")), t_range(build_posthoc("ts_nll"))
    ((0.1, 10.0), (0.01, 100.0))
    >>> t_range(build_posthoc("isotonic")) is None
    True
    """
    if getattr(method, "on_grid", True) is False:
        return (float(method.t_min), float(method.t_max))
    temps = getattr(method, "temperatures", None)
    if temps is None or not len(temps):
        return None
    return (float(min(temps)), float(max(temps)))


def t_at_edge(method: Any) -> float | None:
    """1.0 when the fitted ``T`` of ``method`` is at an end of `t_range` (relative tolerance
    1e-6: a bounded continuous search stops within it of its bound), 0.0 when inside it, None
    when the method searches no bounded range.

    >>> import torch
    >>> from calibtune.posthoc import build_posthoc
    >>> y = torch.arange(200) % 4
    >>> sharp = 8.0 * torch.nn.functional.one_hot(y, 4).double()  # right and far too confident
    >>> flip = torch.arange(200) % 5 == 0
    >>> sharp[flip] = sharp[flip].roll(1, dims=1)  # 20 % wrong with the same confidence
    >>> fits = [build_posthoc("ts").fit(z, y) for z in (sharp, sharp / 80)]  # T* = 3.2, 0.03
    >>> [(m.T, t_at_edge(m)) for m in fits]
    [(3.2, 0.0), (0.1, 1.0)]
    """
    ends = t_range(method)
    t = getattr(method, "T", None)
    if ends is None or t is None or not math.isfinite(float(t)):
        return None
    return float(any(math.isclose(float(t), e, rel_tol=1e-6) for e in ends))


def fitted_values(method: Any) -> dict[str, float]:
    """What a trial logs of a fitted ``method`` as ``posthoc/<method>/<name>``: its ``params()``
    and, for a bounded temperature search, `T_AT_EDGE` (`t_at_edge`).

    >>> import torch
    >>> from calibtune.posthoc import build_posthoc
    >>> y = torch.arange(8) % 2
    >>> z = torch.nn.functional.one_hot(y, 2).double()
    >>> sorted(fitted_values(build_posthoc("ts").fit(z, y)))
    ['T', 'T_at_edge']
    """
    out = {k: float(v) for k, v in method.params().items()}
    edge = t_at_edge(method)
    if edge is not None:
        out[T_AT_EDGE] = edge
    return out
