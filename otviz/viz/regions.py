"""Region masks on the token grid drawn on the image (matplotlib): translucent fills in a
qualitative colour per region, outlines along the borders of the tokens' cells, region ids;
and a node's best-matching region subset (PowerCLIP Eq. 7 / Corollary 1, and the NLA's soft
version).

Masks are bool ``[R, N]`` on the token grid, row-major (:mod:`otviz.patch_grid.masks`). A token's
pixels are its cell on the image (:meth:`otviz.patch_grid.tokens.TokenGeometry.cells`: the
pixels closer to its receptive field's centre than to any other token's), so each region is
drawn as an RGBA layer painted token by token onto a pixel raster
(:meth:`~otviz.patch_grid.tokens.TokenGeometry.pixel_masks`): a pixel is coloured exactly when
the token that looks at it is in the mask.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import matplotlib
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from otviz.methods.powerclip import EMPTY_SUBSET
from otviz.patch_grid.tokens import TokenGeometry
from otviz.viz.heatmaps import FIELD_PX, draw_heatmap
from otviz.viz.style import HEAT_CMAP, drawable, new_figure, no_ticks

FILL_ALPHA = 0.35


def region_colours(n: int) -> np.ndarray:
    """``[n, 3]`` RGB in [0, 1]: ``tab10`` up to 10 regions, ``tab20`` beyond (cycled)."""
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return np.array([cmap(k % cmap.N)[:3] for k in range(n)])


def region_layer(mask: np.ndarray, geometry: TokenGeometry, colour, alpha: float) -> np.ndarray:
    """``[h, w, 4]`` RGBA layer on a pixel raster of the picture of ``geometry`` (at most
    :data:`~otviz.viz.heatmaps.FIELD_PX` a side): ``colour`` with opacity ``alpha`` on the
    cells of the mask's tokens, transparent elsewhere."""
    width, height = geometry.size
    scale = min(1.0, FIELD_PX / max(width, height))
    w, h = max(1, round(width * scale)), max(1, round(height * scale))
    cells = geometry.pixel_masks(torch.from_numpy(np.asarray(mask, dtype=bool)), w, h).numpy()
    layer = np.zeros((h, w, 4))
    layer[..., :3] = np.asarray(colour)[:3]
    layer[..., 3] = np.where(cells, alpha, 0.0)
    return layer


def mask_outline(mask: np.ndarray, geometry: TokenGeometry) -> list[list[tuple[float, float]]]:
    """Pixel-space segments of the boundary of a token mask: every side of the cell of a
    token in the mask whose neighbour across that side is not."""
    grid = geometry.grid
    cells = np.pad(np.asarray(mask, dtype=bool).reshape(grid), 1)
    boxes = geometry.cells().numpy()
    segments = []
    for y, x in zip(*np.nonzero(cells[1:-1, 1:-1]), strict=True):
        x0, y0, x1, y1 = (float(v) for v in boxes[y * grid[1] + x])
        if not cells[y, x + 1]:  # above
            segments.append([(x0, y0), (x1, y0)])
        if not cells[y + 2, x + 1]:  # below
            segments.append([(x0, y1), (x1, y1)])
        if not cells[y + 1, x]:  # left
            segments.append([(x0, y0), (x0, y1)])
        if not cells[y + 1, x + 2]:  # right
            segments.append([(x1, y0), (x1, y1)])
    return segments


def mask_centre(mask: np.ndarray, geometry: TokenGeometry) -> tuple[float, float] | None:
    """Pixel ``(x, y)``: the mean of the points where the mask's tokens look (``None`` when
    the mask is empty)."""
    keep = torch.from_numpy(np.asarray(mask, dtype=bool).reshape(-1))
    if not bool(keep.any()):
        return None
    x, y = geometry.centres()[keep].mean(0).tolist()
    return x, y


def draw_regions(
    ax: Axes,
    image: np.ndarray | None,
    masks: np.ndarray,
    geometry: TokenGeometry,
    *,
    shown: Sequence[int] | None = None,
    fill: bool = True,
    title: str | None = None,
) -> None:
    """Draw ``image`` (if given) and the ``shown`` regions (default all) of ``masks [R, N]``
    (on the tokens of ``geometry``, the token geometry on the image, whose frame is the
    drawing's): one RGBA layer per region in ``ax.images`` (after the image), its outline
    and its id at the mean of its tokens' centres."""
    masks = np.asarray(masks, dtype=bool)
    width, height = geometry.size
    extent = (0, width, height, 0)
    if image is not None:
        ax.imshow(image, extent=extent, interpolation="nearest")
    colours = region_colours(len(masks))
    for m in range(len(masks)) if shown is None else shown:
        if fill:
            ax.imshow(
                region_layer(masks[m], geometry, colours[m], FILL_ALPHA),
                extent=extent, interpolation="nearest",
            )
        outline = mask_outline(masks[m], geometry)
        ax.add_collection(LineCollection(outline, colors=[colours[m]], linewidths=1.8))
        centre = mask_centre(masks[m], geometry)
        if centre is not None:
            ax.text(
                *centre, str(m), ha="center", va="center", fontsize=8, color="white",
                bbox={"boxstyle": "circle,pad=0.15", "fc": colours[m], "ec": "none"},
            )
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    no_ticks(ax)
    if title:
        ax.set_title(title, fontsize=9)


def regions_figure(
    image: np.ndarray, masks: np.ndarray, geometry: TokenGeometry, title: str | None = None
) -> Figure:
    """All region masks on the image (``geometry``: the token geometry on it): translucent
    fills, outlines and ids."""
    fig = new_figure(4.4, 4.4)
    draw_regions(fig.subplots(), image, masks, geometry, title=title)
    return fig


def best_subset_figure(
    image: np.ndarray,
    masks: np.ndarray,
    geometry: TokenGeometry,
    exact_members: np.ndarray | None,
    soft_members: np.ndarray,
    cover: np.ndarray,
    phrase_map: np.ndarray,
    phrase: str,
    soft_label: str,
) -> Figure:
    """A node's best-matching region subset beside its phrase map: the exact ``A* =
    argmax_A Q_{A,B}`` as filled regions (``exact_members [R]`` bool; ``None`` when the
    powerset is too large to enumerate); the method's soft subset, ``cover [N]`` (the soft
    union of the regions, memberships ``soft_members [R]``) with the regions of membership
    > 0.5 outlined; and the phrase map ``phrase_map [N]`` (PowerCLIP Fig. 6's text-to-patch
    similarity weighted by that cover)."""
    fig = new_figure(12.8, 4.4)
    ax_exact, ax_soft, ax_map = fig.subplots(1, 3)
    height, width = image.shape[:2]
    if exact_members is None:
        ax_exact.imshow(image, extent=(0, width, height, 0))
        ax_exact.set_title("exact subset: too many regions to enumerate", fontsize=9)
        no_ticks(ax_exact)
    else:
        chosen = [int(m) for m in np.flatnonzero(exact_members)]
        ids = "{" + ", ".join(map(str, chosen)) + "}" if chosen else "∅ (no region scores > 0)"
        draw_regions(ax_exact, image, masks, geometry, shown=chosen,
                     title=textwrap.fill(f"exact A* = {ids}", 45))
    mappable = draw_heatmap(
        ax_soft, image, np.asarray(cover).reshape(geometry.grid), geometry, vmin=0.0,
        vmax=1.0, cmap=HEAT_CMAP, title=textwrap.fill(soft_label, 45),
    )
    likely = [int(m) for m in np.flatnonzero(np.asarray(soft_members) > 0.5)]
    draw_regions(ax_soft, None, masks, geometry, shown=likely, fill=False)
    fig.colorbar(mappable, ax=ax_soft, shrink=0.8, label="soft membership of the subset")
    empty = float(np.max(cover)) < EMPTY_SUBSET
    heat = draw_heatmap(
        ax_map, image, np.asarray(phrase_map).reshape(geometry.grid), geometry, vmin=0.0,
        cmap=HEAT_CMAP, title=textwrap.fill(
            "phrase map: Fig. 6 similarity (no region chosen: unweighted)" if empty else
            "phrase map: Fig. 6 similarity x the subset", 45),
    )
    fig.colorbar(heat, ax=ax_map, shrink=0.8, label="similarity - its minimum")
    # wrapped: a whole-caption phrase is wider than the figure
    fig.suptitle(textwrap.fill(f'Best-matching regions and map of "{drawable(phrase)}"', 120),
                 fontsize=10)
    return fig
