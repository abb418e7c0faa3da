"""γ* of Proposition 2 in Mukhoti et al. 2020, used to derive FLSD schedules."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import overload

from scipy.special import lambertw


def _gamma_star(p0: float) -> float:
    if isinstance(p0, bool) or not isinstance(p0, (int, float)) or not 0.0 < p0 < 1.0:
        raise ValueError(f"flsd_from_p0: p0: expected a number in (0, 1), got {p0!r}")
    if p0 >= 0.5:
        # g(p, γ) ≤ 1 already holds at γ = 0 for p ≥ 0.5 (γ*(0.5) = 0; the W₋₁ argument is −1/e)
        return 0.0
    a, b = 1.0 - p0, p0 * math.log(p0)
    arg = -(a ** (1.0 - a / b)) / b * math.log(a)
    # arg ∈ [−1/e, 0) in exact arithmetic; rounding can push it just below −1/e near p0 = 0.5
    arg = max(arg, -math.exp(-1.0))
    return max(0.0, a / b + float(lambertw(arg, k=-1).real) / math.log(a))


@overload
def flsd_from_p0(p0: float) -> float: ...
@overload
def flsd_from_p0(p0: Sequence[float]) -> tuple[float, ...]: ...


def flsd_from_p0(p0: float | Sequence[float]) -> float | tuple[float, ...]:
    """Smallest γ for which focal loss gives no larger gradient than CE for every p_y ≥ p0.

    Proposition 2 of Mukhoti et al. 2020: for p ≥ p0, g(p, γ) = (1−p)^γ − γ p (1−p)^(γ−1) log p ≤ 1
    for all γ ≥ γ* with::

        γ* = a/b + W₋₁(−a^(1 − a/b) · log(a) / b) / log(a),    a = 1 − p0,  b = p0 · log p0

    (W₋₁: the k = −1 branch of the Lambert W function). γ*(0.2) ≈ 4.85 and γ*(0.25) ≈ 3.07 give
    FLSD-53 (γ = 5 for p_y < 0.2, γ = 3 above): pass e.g. ``gammas=(round(flsd_from_p0(0.2)),
    round(flsd_from_p0(0.25)))`` to the ``flsd`` loss. γ* = 0 for p0 ≥ 0.5.

    Shapes: a float returns a float; a sequence returns a tuple of the same length.
    """
    if isinstance(p0, Sequence) and not isinstance(p0, str):
        return tuple(_gamma_star(v) for v in p0)
    return _gamma_star(p0)  # type: ignore[arg-type]
