"""How the figures are drawn and written: the settings that make a figure cheap without changing
what it shows, shared by the trial figures (`save_trial_figures`) and the parent run's study
figures (`calibtune.readers._summary`).

A study's driver draws every trial's figures and the study's on one thread while two trials use
the two cores (issue 13); a cProfile of `save_trial_figures` (bench/README.md "Driver CPU per
trial in a study") showed two costs that are not the figures' content:

- **Font hinting**: matplotlib's default ``text.hinting`` runs FreeType's hinter for every glyph
  at every draw; ``no_hinting`` draws the same glyphs unhinted (sub-pixel differences in the
  text, same layout, same size).
- **The cyclic garbage collector**: a figure allocates ~10⁵ small objects (ticks, lines, texts),
  which trigger full collections that traverse the whole process — in the study's driver, with
  torch, Ray and MLflow loaded, several hundred thousand objects each time. The collector is
  paused while the figures are drawn (restored after, as it was); the figures' own cycles are
  freed by the next young-generation collection.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from pathlib import Path

import matplotlib as mpl
from matplotlib.figure import Figure

__all__ = ["DPI", "RC", "drawing", "save_png"]

DPI = 100  # the figures' resolution (unchanged)
RC = {"text.hinting": "no_hinting"}


@contextlib.contextmanager
def drawing() -> Iterator[None]:
    """Draw figures inside: `RC` applied (``matplotlib.rc_context``: the rcParams are global, so
    one thread draws at a time — the study's summary thread or `calibtune train`) and the cyclic
    garbage collector paused."""
    was = gc.isenabled()
    gc.disable()
    try:
        with mpl.rc_context(RC):
            yield
    finally:
        if was:
            gc.enable()


def save_png(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as PNG at `DPI` with zlib level 1 (a few % larger than the default level 6,
    several times faster to encode; lossless either way)."""
    fig.savefig(path, dpi=DPI, pil_kwargs={"compress_level": 1})
    return path
