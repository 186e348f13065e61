"""Heatmaps over the token grid drawn on the image (matplotlib), each token's value placed
where the token looks (:class:`otviz.patch_grid.tokens.TokenGeometry`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from otviz.explain import Encoded
from otviz.patch_grid.tokens import TokenGeometry
from otviz.viz.panels import heat_fields
from otviz.viz.style import HEAT_CMAP, SIMILARITY_CMAP, new_figure, no_ticks

#: Longest side of the heat raster drawn under matplotlib (a pixel raster, not the tokens).
FIELD_PX = 512


def draw_heatmap(
    ax: Axes,
    image: np.ndarray,
    heat: np.ndarray,
    geometry: TokenGeometry,
    *,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = HEAT_CMAP,
    alpha: float = 0.6,
    box: Sequence[float] | None = None,
    title: str | None = None,
):
    """Draw ``image`` (``[H, W, 3]`` uint8) with ``heat`` (``[gh, gw]`` on the tokens of
    ``geometry``, the token geometry on ``image``) over it, bilinear between the points
    where the tokens look (:func:`otviz.viz.panels.heat_fields`, on a raster of at most
    :data:`FIELD_PX` a side spanning the image).

    ``box`` is an optional pixel box ``(x0, y0, x1, y1)`` (e.g. the weak-grounding box).
    Returns the heat ``AxesImage`` (for a colour bar).
    """
    height, width = image.shape[:2]
    scale = min(1.0, FIELD_PX / max(height, width))
    field = heat_fields(geometry, [heat], max(1, round(width * scale)),
                        max(1, round(height * scale)))[0]
    ax.imshow(image, extent=(0, width, height, 0), interpolation="nearest")
    mappable = ax.imshow(
        field,
        extent=(0, width, height, 0),
        cmap=cmap,
        alpha=alpha,
        vmin=vmin,
        vmax=vmax,
        interpolation="bilinear",
    )
    if box is not None:
        x0, y0, x1, y1 = box
        ax.add_patch(
            Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="#00e5ff", linewidth=2)
        )
    no_ticks(ax)
    if title:
        ax.set_title(title, fontsize=9)
    return mappable


def heatmap_grid_figure(
    image: np.ndarray,
    heats: Sequence[np.ndarray],
    titles: Sequence[str],
    *,
    geometry: TokenGeometry,
    shared_scale: bool = True,
    boxes: Sequence[Sequence[float] | None] | None = None,
    columns: int = 4,
    suptitle: str | None = None,
    colorbar_label: str = "transported mass",
    cmap: str = HEAT_CMAP,
    zero_floor: bool = True,
    panel_size: float = 2.6,
) -> Figure:
    """One panel per heatmap (``[gh, gw]`` on the tokens of ``geometry``, the token geometry
    on ``image``: ``encoded.geometry``), on one colour scale (``shared_scale``) or one
    scale each.

    ``zero_floor`` starts the shared scale at 0 (masses); otherwise at the smallest value
    (similarities, which can be negative)."""
    n = len(heats)
    cols = max(1, min(columns, n))
    rows = math.ceil(n / cols)
    fig = new_figure(panel_size * cols + 0.8, panel_size * rows + (0.4 if suptitle else 0.0))
    axes = fig.subplots(rows, cols, squeeze=False)
    vmax = max(float(np.max(h)) for h in heats) if shared_scale and n else None
    vmin = None
    if shared_scale and n:
        vmin = 0.0 if zero_floor else min(float(np.min(h)) for h in heats)
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.axis("off")
            continue
        mappable = draw_heatmap(
            ax,
            image,
            heats[k],
            geometry,
            vmin=vmin,
            vmax=vmax,
            cmap=cmap,
            box=None if boxes is None else boxes[k],
            title=titles[k],
        )
        if not shared_scale:
            fig.colorbar(mappable, ax=ax, shrink=0.8)
    if shared_scale and n:
        fig.colorbar(mappable, ax=axes, shrink=0.8, label=colorbar_label)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return fig


def word_similarity_figure(
    encoded: Encoded, maps, words: Sequence[int], suptitle: str | None = None
) -> Figure:
    """One panel per caption word in ``words``: its patch cosine map from
    ``Explainer.word_similarity`` (``maps``, ``[n_words, N]``), all on one colour scale."""
    return heatmap_grid_figure(
        encoded.image,
        [maps[k].numpy() for k in words],
        [encoded.words[k].text for k in words],
        geometry=encoded.geometry,
        cmap=SIMILARITY_CMAP,
        colorbar_label="cosine similarity",
        zero_floor=False,
        suptitle=suptitle,
    )
