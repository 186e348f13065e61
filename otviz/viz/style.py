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


def new_figure(width: float, height: float) -> Figure:
    """A figure not registered with pyplot's global state (safe in a multi-user server)."""
    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def figure_png(fig: Figure) -> bytes:
    """Render ``fig`` to PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


__all__ = ["DIVERGING_CMAP", "HEAT_CMAP", "SIMILARITY_CMAP", "figure_png", "new_figure", "plt"]
