"""Rendering scenes with numpy: textured low-contrast backgrounds and antialiased shapes.

Every shape is an indicator function on its own coordinates, stretched so that it touches
all four sides of its ``px x px`` box (so the box is tight). Alpha masks are supersampled
4x4 once per (shape, px) and cached; a scene costs one background plus one alpha blend per
object. Background textures and the per-pixel grain are random crops of banks made once
from a fixed seed (in memory, not files), so a background costs a slice and a multiply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from otviz.world.draws import integers
from otviz.world.types import SceneObject, WorldConfig
from otviz.world.vocab import COLOUR_RGB

_SUPERSAMPLE = 4
_NOISE_TILE = 256
_BANK = 48
_BANK_SEED = 20240601


def _star_polygon(points: int = 5, inner: float = 0.5) -> np.ndarray:
    angles = -np.pi / 2 + np.arange(2 * points) * np.pi / points
    radii = np.where(np.arange(2 * points) % 2 == 0, 1.0, inner)
    return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)


def _inside_polygon(x: np.ndarray, y: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """Even-odd rule point-in-polygon test, vectorised over points."""
    inside = np.zeros(x.shape, dtype=bool)
    for (xa, ya), (xb, yb) in zip(poly, np.roll(poly, -1, axis=0), strict=True):
        crosses = (ya > y) != (yb > y)
        x_at = xa + (y - ya) * (xb - xa) / np.where(yb == ya, 1.0, yb - ya)
        inside ^= crosses & (x < x_at)
    return inside


_STAR = _star_polygon()
_RGB = {name: np.asarray(rgb, dtype=np.float32)[:, None, None] for name, rgb in COLOUR_RGB.items()}

# Indicators on native coordinates (y downwards) and their tight extents (x0, x1, y0, y1).
_SHAPES: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], tuple[float, ...]]] = {
    "circle": (lambda x, y: x * x + y * y <= 1.0, (-1, 1, -1, 1)),
    "square": (lambda x, y: (np.abs(x) <= 1.0) & (np.abs(y) <= 1.0), (-1, 1, -1, 1)),
    "triangle": (lambda x, y: np.abs(x) <= (y + 1.0) / 2.0, (-1, 1, -1, 1)),
    "diamond": (lambda x, y: np.abs(x) + np.abs(y) <= 1.0, (-1, 1, -1, 1)),
    "star": (
        lambda x, y: _inside_polygon(x, y, _STAR),
        (_STAR[:, 0].min(), _STAR[:, 0].max(), _STAR[:, 1].min(), _STAR[:, 1].max()),
    ),
    "cross": (lambda x, y: (np.abs(x) <= 0.34) | (np.abs(y) <= 0.34), (-1, 1, -1, 1)),
    # (x^2 + y^2 - 1)^3 <= x^2 y^3 with y upwards; extents measured on a fine grid
    "heart": (
        lambda x, y: (x * x + y * y - 1.0) ** 3 <= x * x * (-y) ** 3,
        (-1.1394, 1.1394, -1.2361, 1.0),
    ),
    "ring": (lambda x, y: (x * x + y * y <= 1.0) & (x * x + y * y >= 0.3), (-1, 1, -1, 1)),
}


@cache
def shape_alpha(shape: str, px: int) -> np.ndarray:
    """Coverage ``[px, px]`` in [0, 1] of ``shape`` drawn in a ``px x px`` box."""
    inside, (x0, x1, y0, y1) = _SHAPES[shape]
    n = px * _SUPERSAMPLE
    t = (np.arange(n) + 0.5) / n
    x, y = np.meshgrid(x0 + t * (x1 - x0), y0 + t * (y1 - y0))
    cover = inside(x, y).reshape(px, _SUPERSAMPLE, px, _SUPERSAMPLE).mean(axis=(1, 3))
    alpha = cover.astype(np.float32)
    alpha.setflags(write=False)
    return alpha


@cache
def _noise_tile() -> np.ndarray:
    tile = np.random.default_rng(_BANK_SEED).uniform(-1, 1, (1, _NOISE_TILE, _NOISE_TILE))
    return tile.astype(np.float32)


def _upsampler(size: int, cells: int) -> np.ndarray:
    """``[size, cells]`` linear interpolation matrix from a coarse grid to ``size`` pixels."""
    pos = (np.arange(size) + 0.5) / size * (cells - 1)
    lo = np.minimum(pos.astype(int), cells - 2)
    frac = pos - lo
    m = np.zeros((size, cells), dtype=np.float32)
    m[np.arange(size), lo] = 1 - frac
    m[np.arange(size), lo + 1] = frac
    return m


def _texture(kind: int, rng: np.random.Generator, size: int) -> np.ndarray:
    """A ``[size, size]`` texture in about [-1, 1]: smooth noise (0), stripes (1), checks
    (2) or finer blobs (3)."""
    if kind in (0, 3):
        cells = size // 16 if kind == 0 else size // 7
        up = _upsampler(size, cells)
        return up @ rng.uniform(-1, 1, (cells, cells)).astype(np.float32) @ up.T
    c = np.arange(size, dtype=np.float32)
    x, y = np.meshgrid(c, c)
    if kind == 1:
        theta = rng.uniform(0, np.pi)
        freq = rng.uniform(0.3, 0.9)
        return np.sin(freq * (np.cos(theta) * x + np.sin(theta) * y))
    k = int(rng.integers(4, 11))
    return (((x // k + y // k) % 2) * 2 - 1).astype(np.float32)


@cache
def texture_bank(size: int) -> np.ndarray:
    """``[_BANK, 2 size, 2 size]`` textures, a quarter of each kind, made once from a fixed
    seed; a background is a random ``size x size`` crop of one of them."""
    rng = np.random.default_rng(_BANK_SEED)
    bank = np.stack([_texture(k % 4, rng, 2 * size) for k in range(_BANK)]).astype(np.float32)
    bank.setflags(write=False)
    return bank


def _background(rng: np.random.Generator, config: WorldConfig) -> np.ndarray:
    """A float32 ``[3, H, W]`` low-contrast textured background (mid-grey, lightly tinted)."""
    size = config.image_size
    k, oy, ox = (int(rng.integers(high)) for high in (_BANK, size, size))
    texture = texture_bank(size)[k, None, oy : oy + size, ox : ox + size]
    base = rng.uniform(70, 165) + rng.uniform(-18, 18, (3, 1, 1))
    tint = 1 + rng.uniform(-0.3, 0.3, (3, 1, 1))
    img = texture * (rng.uniform(0.35, 1.0) * config.texture_contrast * tint).astype(np.float32)
    img += base.astype(np.float32)
    return img


#: The coverage from which a pixel belongs to an object in :func:`object_labels`: the
#: antialiased edge's pixels go to whichever side holds most of them.
COVERED = 0.5


def object_labels(objects: Sequence[SceneObject], size: int, covered: float = COVERED
                  ) -> np.ndarray:
    """``int16 [size, size]``: ``k + 1`` on the pixels object ``k`` covers (its shape's
    supersampled coverage, :func:`shape_alpha`, at least ``covered``), 0 elsewhere: the
    scene's exact object masks, drawn on the boxes :func:`render_scene` paints (an object
    drawn later is on top, as there; the world's boxes do not overlap)."""
    labels = np.zeros((size, size), dtype=np.int16)
    for k, obj in enumerate(objects):
        x0, y0, x1, y1 = obj.box
        region = labels[y0:y1, x0:x1]
        region[shape_alpha(obj.shape, x1 - x0) >= covered] = k + 1
    return labels


def render_scene(
    objects: Sequence[SceneObject], rng: np.random.Generator, config: WorldConfig
) -> np.ndarray:
    """Draw ``objects`` over a fresh background; returns ``uint8 [H, W, 3]``.

    Works channel-first (numpy broadcasts far faster over a long last axis than over 3
    channels) and interleaves the channels at the end."""
    img = _background(rng, config)
    jitter = rng.integers(-config.colour_jitter, config.colour_jitter + 1, (len(objects), 3, 1, 1))
    for obj, dj in zip(objects, jitter, strict=True):
        x0, y0, x1, y1 = obj.box
        alpha = shape_alpha(obj.shape, x1 - x0)
        colour = _RGB[obj.colour] + dj
        region = img[:, y0:y1, x0:x1]
        region += alpha * (colour - region)
    size = config.image_size
    oy, ox = integers(rng, 0, _NOISE_TILE - size, 2)
    img += config.pixel_noise * _noise_tile()[:, oy : oy + size, ox : ox + size]
    img.clip(0, 255, out=img)
    planes = img.astype(np.uint8)
    out = np.empty((size, size, 3), dtype=np.uint8)
    for c in range(3):
        out[..., c] = planes[c]
    return out
