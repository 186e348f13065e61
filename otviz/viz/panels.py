"""Heatmap panels composed directly as one RGB raster (numpy + PIL), with colour bars.

The picture of :func:`otviz.viz.heatmaps.heatmap_grid_figure` (heat drawn bilinearly between
the points where its tokens look, :meth:`otviz.patch_grid.tokens.TokenGeometry.upsample`, a
perceptually uniform colour map, the weak-grounding box in cyan,
titles, one shared colour bar or one per panel), drawn in a few milliseconds instead of
the few hundred a matplotlib render takes: the interactive views redraw it on every phrase
change. Where the mass is, shows: the image is dimmed to grey and the colour's opacity
grows with the value (:func:`overlay`), so low-mass patches stay a dark backdrop and the
phrase's region glows in the colour map's bright end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import matplotlib
import numpy as np
import torch
from matplotlib import font_manager
from PIL import Image, ImageDraw, ImageFont

from otviz.patch_grid.tokens import TokenGeometry
from otviz.viz.style import FONT_FAMILY, HEAT_CMAP, drawable

BOX_COLOUR = (0, 229, 255)  # the cyan of draw_heatmap's grounding box
BACKGROUND = (255, 255, 255)
TEXT_COLOUR = (20, 20, 20)
#: Colour opacity at the bottom and at the top of the scale (it grows linearly between).
HEAT_ALPHA = (0.35, 0.9)
#: Brightness of the greyed image under the colour.
BACKDROP = 0.55
TITLE_PX = 20
GAP_PX = 6
BAR_PX = 12  # colour bar thickness
#: The shortest shared colour bar: a row of panels of a wide, thin image is lower than the
#: bar's five ticks need, and the figure grows to hold the bar instead.
MIN_BAR_PX = 80


@lru_cache(maxsize=8)
def colormap_lut(cmap: str) -> np.ndarray:
    """``[256, 3]`` uint8 lookup table of a matplotlib colour map."""
    colours = matplotlib.colormaps[cmap](np.linspace(0.0, 1.0, 256))[:, :3]
    return (colours * 255).round().astype(np.uint8)


@lru_cache(maxsize=4)
def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(font_manager.findfont(FONT_FAMILY), size)


#: A heatmap whose spread is below this share of its peak is flat: no place has more mass.
FLAT_SPREAD = 1e-3
#: On its own scale a flat heatmap sits at this level of the colour map (not at the top,
#: which would paint the whole panel as if everything were the peak).
FLAT_LEVEL = 0.2


def _scale_limits(
    heats: Sequence[np.ndarray], shared: bool, zero_floor: bool
) -> list[tuple[float, float]]:
    """``(vmin, vmax)`` per panel: one pair for all (``shared``) or one per heatmap (a flat
    one placed at :data:`FLAT_LEVEL` of its scale)."""

    def limits(values: Sequence[np.ndarray]) -> tuple[float, float]:
        lo = 0.0 if zero_floor else min(float(np.min(v)) for v in values)
        hi = max(float(np.max(v)) for v in values)
        return lo, hi if hi > lo else lo + 1e-12

    if shared:
        return [limits(heats)] * len(heats)
    out = []
    for h in heats:
        lo, hi = limits([h])
        peak = float(np.max(np.abs(h)))
        if float(np.ptp(h)) <= FLAT_SPREAD * peak and peak > 0:
            hi = lo + (hi - lo) / FLAT_LEVEL
        out.append((lo, hi))
    return out


def overlay(
    image: np.ndarray,
    heat: np.ndarray,
    geometry: TokenGeometry,
    vmin: float,
    vmax: float,
    cmap: str = HEAT_CMAP,
    alpha: tuple[float, float] = HEAT_ALPHA,
    backdrop: float = BACKDROP,
) -> np.ndarray:
    """``image`` (uint8 ``[h, w, 3]``) greyed and dimmed to ``backdrop``, with ``heat``
    (``[gh, gw]`` on the tokens of ``geometry``, the token geometry on ``image``) drawn
    bilinearly between the token centres (:func:`heat_fields`), colour-mapped on
    ``[vmin, vmax]`` and blended at an opacity growing linearly from ``alpha[0]`` (``vmin``)
    to ``alpha[1]`` (``vmax``)."""
    h, w = image.shape[:2]
    field = heat_fields(geometry, [heat], w, h)[0]
    return np.asarray(_blend(dimmed(image, backdrop), field, vmin, vmax, cmap, alpha))


def heat_fields(
    geometry: TokenGeometry, heats: Sequence[np.ndarray], width: int, height: int
) -> np.ndarray:
    """``[K, height, width]`` float32: each ``[gh, gw]`` (or ``[N]``) token map on a
    ``width x height`` raster of the picture of ``geometry``, bilinear between the points
    where the tokens look (:meth:`~otviz.patch_grid.tokens.TokenGeometry.upsample`), so a
    token's value peaks on its receptive field's centre; 0 where no token looks (outside
    the preprocessing's crop)."""
    maps = torch.from_numpy(np.stack([np.asarray(h, dtype=np.float64).reshape(geometry.grid)
                                      for h in heats]))
    return geometry.scaled(width, height).upsample(maps).numpy().astype(np.float32)


def dimmed(image: np.ndarray, backdrop: float = BACKDROP) -> Image.Image:
    """The image's luma scaled by ``backdrop``, as a grey RGB image (the backdrop of every
    heatmap panel)."""
    grey = image[..., :3].astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    return Image.fromarray((backdrop * grey).round().astype(np.uint8), "L").convert("RGB")


def _blend(
    grey: Image.Image, field: np.ndarray, vmin: float, vmax: float, cmap: str,
    alpha: tuple[float, float],
) -> Image.Image:
    """``field`` (a heat field on ``grey``'s pixels, :func:`heat_fields`), its level on
    ``[vmin, vmax]`` mapped to 0-255, coloured by ``cmap`` and composited over ``grey`` at
    the level's opacity; every step in Pillow's C code (a panel in about a millisecond)."""
    scale = 255.0 / (vmax - vmin)
    level = Image.fromarray(np.ascontiguousarray(field, dtype=np.float32), mode="F").point(
        lambda v: (v - vmin) * scale).convert("L")  # clipped to 0-255
    palette, opacity = _blend_tables(cmap, alpha)
    colour = level.copy()
    colour.putpalette(palette, "RGB")
    return Image.composite(colour.convert("RGB"), grey, level.point(opacity))


@lru_cache(maxsize=8)
def _blend_tables(cmap: str, alpha: tuple[float, float]) -> tuple[list[int], list[int]]:
    """The colour map as a 256-entry RGB palette, and the opacity of each level (linear from
    ``alpha[0]`` to ``alpha[1]``) in 0-255."""
    opacity = np.linspace(alpha[0], alpha[1], 256) * 255.0
    return colormap_lut(cmap).reshape(-1).tolist(), opacity.round().astype(int).tolist()


def _fit(image: np.ndarray, panel_px: int) -> np.ndarray:
    """The image scaled so its longer side is ``panel_px``."""
    h, w = image.shape[:2]
    s = panel_px / max(h, w)
    size = (max(1, round(w * s)), max(1, round(h * s)))
    return np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BILINEAR))


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def _clip_text(draw: ImageDraw.ImageDraw, text: str, width: int, font) -> str:
    """``text`` shortened with an ellipsis until it fits ``width`` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def _wrap_text(draw: ImageDraw.ImageDraw, text: str, width: int, font) -> str:
    """``text`` broken into lines of whole words that fit ``width`` pixels."""
    lines: list[str] = []
    for word in text.split():
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return "\n".join(lines)


def _vertical_bar(height: int, vmin: float, vmax: float, cmap: str, label: str) -> Image.Image:
    """A vertical colour bar with five ticks and a rotated label."""
    font = _font(10)
    ramp = colormap_lut(cmap)[np.linspace(255, 0, height).astype(np.uint8)]
    strip = np.repeat(ramp[:, None, :], BAR_PX, axis=1)
    ticks = [vmin + (vmax - vmin) * k / 4 for k in range(5)]
    text_w = max(
        int(ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(_fmt(t), font=font)) for t in ticks
    )
    bar = Image.new("RGB", (BAR_PX + 6 + text_w + 4 + 14, height + 10), BACKGROUND)
    bar.paste(Image.fromarray(strip), (0, 5))
    draw = ImageDraw.Draw(bar)
    for k, t in enumerate(ticks):
        y = 5 + round((height - 1) * (1 - k / 4))
        draw.line([(BAR_PX, y), (BAR_PX + 3, y)], fill=TEXT_COLOUR)
        draw.text((BAR_PX + 5, y), _fmt(t), fill=TEXT_COLOUR, font=font, anchor="lm")
    caption = Image.new("RGB", (height, 14), BACKGROUND)
    ImageDraw.Draw(caption).text(
        (height // 2, 7),
        _clip_text(draw, label, height, font),
        fill=TEXT_COLOUR,
        font=font,
        anchor="mm",
    )
    bar.paste(caption.rotate(90, expand=True), (BAR_PX + 6 + text_w + 4, 5))
    return bar


def _horizontal_bar(width: int, vmin: float, vmax: float, cmap: str) -> Image.Image:
    """A thin horizontal colour bar with its two end values (a per-panel scale)."""
    font = _font(10)
    ramp = colormap_lut(cmap)[np.linspace(0, 255, width).astype(np.uint8)]
    bar = Image.new("RGB", (width, BAR_PX // 2 + 12), BACKGROUND)
    bar.paste(Image.fromarray(np.repeat(ramp[None], BAR_PX // 2, axis=0)), (0, 0))
    draw = ImageDraw.Draw(bar)
    draw.text((0, BAR_PX // 2 + 1), _fmt(vmin), fill=TEXT_COLOUR, font=font)
    draw.text((width, BAR_PX // 2 + 1), _fmt(vmax), fill=TEXT_COLOUR, font=font, anchor="ra")
    return bar


def compose_heatmaps(
    image: np.ndarray,
    heats: Sequence[np.ndarray],
    titles: Sequence[str],
    *,
    geometry: TokenGeometry,
    boxes: Sequence[Sequence[float] | None] | None = None,
    shared_scale: bool = True,
    zero_floor: bool = True,
    cmap: str = HEAT_CMAP,
    columns: int = 4,
    panel_px: int = 168,
    colorbar_label: str = "transported mass",
    notes: Sequence[str | None] | None = None,
) -> np.ndarray:
    """One panel per heatmap in a ``columns``-wide grid, as a uint8 ``[H, W, 3]`` raster.

    Args:
        image: the RGB image (uint8 ``[h, w, 3]``) under every heatmap.
        heats: ``[gh, gw]`` heatmaps on the token grid of ``geometry``.
        titles: one title per panel.
        geometry: where each token looks on ``image`` (``encoded.geometry``): every map is
            drawn bilinearly between those points (:func:`heat_fields`).
        boxes: optional pixel boxes ``(x0, y0, x1, y1)`` in ``image`` coordinates (e.g.
            the weak-grounding box of ConceptOT Sec. 2.6), one per panel or ``None``.
        shared_scale: one colour scale for all panels (one bar at the right) or one scale
            per panel (a small bar under each).
        zero_floor: start scales at 0 (masses) rather than at the smallest value.
        notes: optional text per panel (or ``None``): a panel with a note shows that text
            instead of the image and its heatmap (a map that cannot be computed says why).
    """
    if len(heats) != len(titles):
        raise ValueError(f"{len(heats)} heatmaps but {len(titles)} titles")
    if not heats:
        raise ValueError("no heatmaps to draw")
    base = _fit(np.ascontiguousarray(image[..., :3]), panel_px)
    ph, pw = base.shape[:2]
    sx, sy = pw / image.shape[1], ph / image.shape[0]
    limits = _scale_limits(heats, shared_scale, zero_floor)
    fields = heat_fields(geometry, heats, pw, ph)
    grey = dimmed(base)
    cols = max(1, min(columns, len(heats)))
    rows = math.ceil(len(heats) / cols)
    under = 0 if shared_scale else BAR_PX // 2 + 14
    cell_w, cell_h = pw + GAP_PX, TITLE_PX + ph + under + GAP_PX
    canvas = Image.new("RGB", (cols * cell_w, rows * cell_h), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    font = _font(13)
    for k, (field, title) in enumerate(zip(fields, titles, strict=True)):
        x, y = (k % cols) * cell_w, (k // cols) * cell_h
        vmin, vmax = limits[k]
        note = None if notes is None else notes[k]
        if note is None:
            canvas.paste(_blend(grey, field, vmin, vmax, cmap, HEAT_ALPHA), (x, y + TITLE_PX))
        else:
            draw.multiline_text((x + pw // 2, y + TITLE_PX + ph // 2),
                                _wrap_text(draw, drawable(note), pw - 8, font),
                                fill=TEXT_COLOUR, font=font, anchor="mm", align="center")
        draw.text(
            (x + pw // 2, y + TITLE_PX // 2),
            _clip_text(draw, drawable(title), pw, font),
            fill=TEXT_COLOUR,
            font=font,
            anchor="mm",
        )
        box = None if boxes is None else boxes[k]
        if box is not None:
            x0, y0, x1, y1 = (
                round(v) for v in (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
            )
            top = y + TITLE_PX
            draw.rectangle(  # a box thinner than a pixel on a thin panel is a line
                [x + x0, top + y0, x + max(x0, x1 - 1), top + max(y0, y1 - 1)],
                outline=BOX_COLOUR, width=2,
            )
        if not shared_scale and note is None:
            canvas.paste(_horizontal_bar(pw, vmin, vmax, cmap), (x, y + TITLE_PX + ph + 2))
    if shared_scale:
        bar = _vertical_bar(
            max(MIN_BAR_PX, rows * cell_h - TITLE_PX - GAP_PX - 10), *limits[0], cmap,
            colorbar_label,
        )
        height = max(canvas.height, TITLE_PX - 5 + bar.height)
        full = Image.new("RGB", (canvas.width + bar.width, height), BACKGROUND)
        full.paste(canvas, (0, 0))
        full.paste(bar, (canvas.width, TITLE_PX - 5))
        canvas = full
    return np.asarray(canvas)
