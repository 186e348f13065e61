"""The Browse view's page: one row per (image, phrase) query with the image and its gold box,
then each chosen method's phrase heatmap with its box, peak and hit/miss mark (a raster
composed with :func:`otviz.viz.panels.overlay`, a few milliseconds per panel), and the
page's table."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from otviz.eval.browse import BrowseTable, method_label
from otviz.patch_grid.tokens import TokenGeometry
from otviz.viz.mass import displayable_mass
from otviz.viz.panels import (
    BACKGROUND,
    BOX_COLOUR,
    GAP_PX,
    TEXT_COLOUR,
    _clip_text,
    _fit,
    _font,
    overlay,
)

GOLD_COLOUR = (40, 220, 60)
HIT_COLOUR, MISS_COLOUR = (20, 130, 40), (200, 30, 30)
HEADER_PX, TITLE_PX = 20, 18
#: The page's width at the app's 1400 px: panels shrink to fit it, up to ``MAX_PANEL_PX``.
PAGE_WIDTH_PX, MAX_PANEL_PX = 1360, 176


def hit_mark(table: BrowseTable, row: int, k: int) -> str:
    """``"✓ 0.62"`` / ``"✗ 0.10"`` (hit or miss, IoU) of method ``k`` on query ``row``;
    ``"—"`` without a gold box."""
    if table.hits is None or table.iou is None:
        return "—"
    return f"{'✓' if bool(table.hits[row, k]) else '✗'} {float(table.iou[row, k]):.2f}"


def _box(draw: ImageDraw.ImageDraw, box: Sequence[float], scale: tuple[float, float],
         origin: tuple[int, int], colour: tuple[int, int, int]) -> None:
    sx, sy = scale
    x0, y0, x1, y1 = (round(v) for v in (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy))
    ox, oy = origin
    draw.rectangle([ox + x0, oy + y0, ox + x1 - 1, oy + y1 - 1], outline=colour, width=2)


def _peak(draw: ImageDraw.ImageDraw, heat: np.ndarray, geometry: TokenGeometry,
          origin: tuple[int, int]) -> None:
    """A white cross where the hottest token looks (the pointing game's peak), on a panel
    whose token geometry is ``geometry``."""
    if float(heat.max()) == float(heat.min()):
        return
    cx, cy = geometry.centres()[int(np.argmax(heat))].tolist()
    x, y = origin[0] + cx, origin[1] + cy
    for dx, dy in ((4, 4), (4, -4)):
        draw.line([(x - dx, y - dy), (x + dx, y + dy)], fill=(255, 255, 255), width=2)


def browse_page_image(
    table: BrowseTable, rows: Sequence[int], methods: Sequence[str],
    width_px: int = PAGE_WIDTH_PX,
) -> np.ndarray:
    """The page as one uint8 ``[H, W, 3]`` raster: per query a header line (row number,
    phrase, kinds, caption), the image with the gold box (green), then per method its
    heatmap on its own colour scale (0 to its peak) with the heatmap box (cyan), the peak
    (white cross) and a title with the hit mark and IoU."""
    if not rows:
        raise ValueError("no rows to draw")
    ks = [table.method_index(m) for m in methods]
    panel = int(min(MAX_PANEL_PX, width_px // (len(ks) + 1) - GAP_PX))
    cell_w, row_h = panel + GAP_PX, HEADER_PX + TITLE_PX + panel + GAP_PX
    canvas = Image.new("RGB", (cell_w * (len(ks) + 1), row_h * len(rows)), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    small, bold = _font(11), _font(13)
    for r, q in enumerate(rows):
        item, y = table.items[q], r * row_h
        kinds = ", ".join(sorted(item.kinds)) or "no kind"
        header = f'#{q}  "{item.phrase}"  [{kinds}]  in: {item.caption}'
        draw.text((2, y + 3), _clip_text(draw, header, canvas.width - 4, bold), fill=TEXT_COLOUR,
                  font=bold)
        image = table.load_image(item.image)
        base = _fit(np.ascontiguousarray(image[..., :3]), panel)
        ph, pw = base.shape[:2]
        scale = (pw / image.shape[1], ph / image.shape[0])
        geometry = table.geometries[q].scaled(pw, ph)
        top = y + HEADER_PX + TITLE_PX
        canvas.paste(Image.fromarray(base), (0, top))
        draw.text((pw // 2, y + HEADER_PX + TITLE_PX // 2), "image, gold box", fill=TEXT_COLOUR,
                  font=small, anchor="mm")
        if table.gold is not None:
            _box(draw, table.gold[q].tolist(), scale, (0, top), GOLD_COLOUR)
        for col, k in enumerate(ks, start=1):
            x = col * cell_w
            heat, _ = displayable_mass(table.heatmaps[q, k].reshape(geometry.grid).numpy())
            peak = float(heat.max())
            canvas.paste(Image.fromarray(overlay(base, heat, geometry, 0.0,
                                                 peak if peak > 0 else 1.0)),
                         (x, top))
            _box(draw, table.boxes[q, k].tolist(), scale, (x, top), BOX_COLOUR)
            _peak(draw, heat, geometry, (x, top))
            colour = TEXT_COLOUR
            if table.hits is not None:
                colour = HIT_COLOUR if bool(table.hits[q, k]) else MISS_COLOUR
            title = f"{method_label(table.methods[k])} {hit_mark(table, q, k)}"
            draw.text((x + pw // 2, y + HEADER_PX + TITLE_PX // 2),
                      _clip_text(draw, title, pw, small), fill=colour, font=small, anchor="mm")
    return np.asarray(canvas)


def browse_frame(table: BrowseTable, rows: Sequence[int], methods: Sequence[str]) -> pd.DataFrame:
    """The page's table: row number, image, phrase, kinds, then per method its hit mark and
    IoU (:func:`hit_mark`)."""
    ks = [(m, table.method_index(m)) for m in methods]
    records = []
    for q in rows:
        item = table.items[q]
        record = {"#": q, "image": item.image, "phrase": item.phrase,
                  "kinds": ", ".join(sorted(item.kinds))}
        record.update({method_label(m): hit_mark(table, q, k) for m, k in ks})
        records.append(record)
    columns = ["#", "image", "phrase", "kinds"] + [method_label(m) for m, _ in ks]
    return pd.DataFrame(records, columns=columns)
