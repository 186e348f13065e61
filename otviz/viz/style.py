"""Shared figure style: perceptually uniform colour maps and PNG export."""

from __future__ import annotations

import io
from functools import lru_cache

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
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


#: WebP settings of the app's figures: PIL's fastest method (0) at its default quality. The
#: default method (4) took three times as long to encode a 9-panel bar figure (74 ms
#: against 22 ms) for a file 25 % smaller.
WEBP_OPTIONS = {"method": 0, "quality": 80}


def no_ticks(ax: Axes, *, x: bool = True, y: bool = True) -> None:
    """The panel's frame without ticks on ``x`` / ``y``: those axes' artists hidden (the
    spines stay). The pixels are those of empty ticks (``set_xticks([])``), and the layout
    and the drawing skip the hidden artists instead of measuring empty ones (a 16-panel
    heatmap grid: 0.80 -> 0.61 s of CPU; tests/ui/test_plots.py)."""
    if x:
        ax.xaxis.set_visible(False)
    if y:
        ax.yaxis.set_visible(False)


def settle_layout(fig: Figure) -> None:
    """Run ``fig``'s layout engine (constrained layout) once, keep its result and take the
    engine off the figure. ``savefig`` on a figure that has any layout engine (even the
    placeholder ``set_layout_engine("none")`` leaves) draws the whole figure twice: once
    without pixels for the layout, once for the pixels; after this it draws once (37 % less
    ``savefig`` CPU on an 8-panel heatmap grid). The pixels are the same
    (tests/ui/test_plots.py)."""
    engine = fig.get_layout_engine()
    if engine is None:
        return
    engine.execute(fig)
    # ``None`` takes the engine off unless the rcParams ask for one: they are set aside here
    with matplotlib.rc_context({"figure.autolayout": False,
                                "figure.constrained_layout.use": False}):
        fig.set_layout_engine(None)


def figure_bytes(fig: Figure, fmt: str = "png") -> bytes:
    """``fig`` rendered to ``fmt`` (``"png"`` or ``"webp"``, :data:`WEBP_OPTIONS`), its
    layout run once (:func:`settle_layout`)."""
    settle_layout(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, pil_kwargs=WEBP_OPTIONS if fmt == "webp" else None)
    return buf.getvalue()


def figure_png(fig: Figure) -> bytes:
    """Render ``fig`` to PNG bytes."""
    return figure_bytes(fig, "png")


__all__ = [
    "DIVERGING_CMAP", "FONT_FAMILY", "HEAT_CMAP", "SIMILARITY_CMAP", "WEBP_OPTIONS", "drawable",
    "figure_bytes", "figure_png", "new_figure", "no_ticks", "plt", "settle_layout",
]
