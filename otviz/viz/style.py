"""Shared figure style: perceptually uniform colour maps and PNG export."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

HEAT_CMAP = "magma"  # perceptually uniform, dark = no mass
SIMILARITY_CMAP = "viridis"
DIVERGING_CMAP = "RdBu_r"


#: Figures are drawn at this resolution, ...
DPI = 110
#: ... lowered so that neither side exceeds this many pixels (WebP, the page's figure
#: format, stops at 16383; a 400-word caption's parse tree is 460 inches wide).
MAX_FIGURE_SIDE_PX = 12_000


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


__all__ = ["DIVERGING_CMAP", "HEAT_CMAP", "SIMILARITY_CMAP", "figure_png", "new_figure", "plt"]
