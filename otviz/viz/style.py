"""Shared figure style: perceptually uniform colour maps and PNG export."""

from __future__ import annotations

import io
from functools import lru_cache

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ft2font import FT2Font  # noqa: E402

HEAT_CMAP = "magma"  # perceptually uniform, dark = no mass
SIMILARITY_CMAP = "viridis"
DIVERGING_CMAP = "RdBu_r"


#: Figures are drawn at this resolution, ...
DPI = 110
#: ... lowered so that neither side exceeds this many pixels (WebP, the page's figure
#: format, stops at 16383; a 400-word caption's parse tree is 460 inches wide).
MAX_FIGURE_SIDE_PX = 12_000


#: The font every raster and matplotlib figure draws text with.
FONT_FAMILY = "DejaVu Sans"


@lru_cache(maxsize=1)
def _font_codepoints() -> frozenset[int]:
    return frozenset(FT2Font(font_manager.findfont(FONT_FAMILY)).get_charmap())


def drawable(text: str) -> str:
    """``text`` with every character the figure font has no glyph for (emoji, most CJK)
    written as its codepoint, ``U+1F600``, instead of an empty box."""
    have = _font_codepoints()
    return "".join(c if ord(c) in have or c in "\n\t" else f"U+{ord(c):04X}" for c in text)


def new_figure(width: float, height: float) -> Figure:
    """A figure not registered with pyplot's global state (safe in a multi-user server),
    at :data:`DPI` or, for a very large one, at the resolution that keeps its longer side
    within :data:`MAX_FIGURE_SIDE_PX`."""
    dpi = min(DPI, MAX_FIGURE_SIDE_PX / max(width, height))
    return Figure(figsize=(width, height), dpi=dpi, layout="constrained")


def figure_png(fig: Figure) -> bytes:
    """Render ``fig`` to PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


__all__ = [
    "DIVERGING_CMAP", "FONT_FAMILY", "HEAT_CMAP", "SIMILARITY_CMAP", "drawable", "figure_png",
    "new_figure", "plt",
]
