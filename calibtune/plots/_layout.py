"""Fixed figure margins shared by the trial figures (object API, no pyplot, no ``tight_layout``).

``tight_layout`` measures every tick label in a second text-layout pass, and pyplot registers
each figure globally until closed: both were most of a trial's figure time (issue 13;
bench/bench_trial_overhead.py). Margins in inches fit 10 pt tick labels, axis labels and titles.
"""

from __future__ import annotations

from matplotlib.figure import Figure

__all__ = ["TITLE_Y", "margins"]

# A title at a fixed height: matplotlib otherwise measures every tick label to place it
TITLE_Y = 1.0


def margins(
    fig: Figure, *, left: float, bottom: float, top: float, wspace: float = 0.2, **kw: float
) -> None:
    """Fixed margins in inches (room for tick labels, axis labels and titles at 10 pt);
    ``wspace``/``hspace`` (``kw``) are fractions of the mean axes width/height."""
    w, h = fig.get_size_inches()
    cols = fig.axes[0].get_gridspec().ncols if fig.axes else 1
    fig.subplots_adjust(
        left=left / w,
        right=1 - 0.15 / w,
        bottom=bottom / h,
        top=1 - top / h,
        wspace=wspace if cols > 1 else None,
        **kw,
    )
