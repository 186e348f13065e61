"""Where each image token looks, in pixels: the token-geometry contract.

An image tower turns an input of ``W x H`` pixels into a grid of ``gh x gw`` tokens. Token
``(i, j)`` is centred on the pixel point ``origin + (j * stride_x, i * stride_y)``: its
receptive field's centre, derived from the tower's architecture
(:mod:`otviz.towers.geometry`). A ViT's patch embedding centres token ``(i, j)`` on its cell
(``origin = stride / 2``); a stack of 3x3 stride-2 convolutions with padding 1 (otviz's
convolutional stem, open_clip's ModifiedResNet stem, timm's FastViT) centres it up-left of
the cell (``origin = 0.5`` px for three such layers: 3.5 px from the cell centre at stride 8).

Coordinates are continuous pixels: pixel ``k`` spans ``[k, k + 1)``, its centre is
``k + 0.5``. Every place that puts a token on an image asks a :class:`TokenGeometry`:
pointing (:meth:`TokenGeometry.centres`), the pixels a token owns (:meth:`~TokenGeometry.cells`,
:meth:`~TokenGeometry.owner`: the cells of the centre lattice, so a perturbation removes
what the token sees), heatmap boxes (:meth:`~TokenGeometry.envelope`) and drawing
(:meth:`~TokenGeometry.upsample`: bilinear between token centres). A geometry on a model
input is carried onto the picture a person uploaded by :func:`input_frame` (the
preprocessing's resize, crop or pad) and :meth:`TokenGeometry.on_image`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Pair = tuple[float, float]
Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class TokenGeometry:
    """The token lattice of an image tower on a pixel frame.

    Attributes:
        grid: ``(rows, cols)`` of tokens, row-major (token ``n = i * cols + j``).
        size: ``(width, height)`` of the pixel frame the coordinates are in.
        stride: ``(x, y)`` pixels between neighbouring token centres.
        origin: ``(x, y)`` centre of token ``(0, 0)``.
        window: ``(x0, y0, x1, y1)``: the part of the frame the tokens see (the whole frame
            by default; on an uploaded image, the part the preprocessing kept).
    """

    grid: tuple[int, int]
    size: tuple[int, int]
    stride: Pair
    origin: Pair
    window: Box | None = None

    def __post_init__(self) -> None:
        if min(self.grid) < 1 or min(self.size) < 1 or min(self.stride) <= 0:
            raise ValueError(f"a token geometry needs a grid, a frame and a positive stride: "
                             f"{self}")

    @classmethod
    def cell_centred(cls, grid: tuple[int, int], size: tuple[int, int]) -> TokenGeometry:
        """Tokens centred on the cells of an even split of the frame (a ViT whose patch
        embedding's stride is its patch size, on an input its patches tile)."""
        sx, sy = size[0] / grid[1], size[1] / grid[0]
        return cls(tuple(grid), tuple(size), (sx, sy), (sx / 2, sy / 2))  # type: ignore[arg-type]

    @property
    def n(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def seen(self) -> Box:
        """The window the tokens see, ``(x0, y0, x1, y1)``."""
        return self.window or (0.0, 0.0, float(self.size[0]), float(self.size[1]))

    # ------------------------------------------------------------------ placement
    def axis_centres(self, axis: int) -> Tensor:
        """float64 centres along ``axis`` (0: x over columns, 1: y over rows)."""
        count = self.grid[1 - axis]
        return self.origin[axis] + self.stride[axis] * torch.arange(count, dtype=torch.float64)

    def centres(self) -> Tensor:
        """``[N, 2]`` float64 ``(x, y)`` receptive-field centre of every token, row-major."""
        xs, ys = self.axis_centres(0), self.axis_centres(1)
        return torch.stack([xs.repeat(self.grid[0]), ys.repeat_interleave(self.grid[1])], dim=1)

    def axis_edges(self, axis: int) -> Tensor:
        """float64 ``[count + 1]`` cell borders along ``axis``: midway between neighbouring
        centres, the outer cells reaching the window's edges (every seen pixel has a token)."""
        c = self.axis_centres(axis)
        lo, hi = self.seen[axis], self.seen[axis + 2]
        mid = (c[1:] + c[:-1]) / 2
        return torch.cat([c.new_tensor([lo]), mid.clamp(lo, hi), c.new_tensor([hi])])

    def cells(self) -> Tensor:
        """``[N, 4]`` float64 ``(x0, y0, x1, y1)``: the pixels closer to each token's centre
        than to any other's (within the window), row-major."""
        ex, ey = self.axis_edges(0), self.axis_edges(1)
        rows, cols = self.grid
        x0, x1 = ex[:-1].repeat(rows), ex[1:].repeat(rows)
        y0, y1 = ey[:-1].repeat_interleave(cols), ey[1:].repeat_interleave(cols)
        return torch.stack([x0, y0, x1, y1], dim=1)

    def owner(self, width: int | None = None, height: int | None = None) -> Tensor:
        """``[height, width]`` long: the token whose cell holds each pixel's centre on a
        ``width x height`` raster of the frame (default: the frame's own pixels), ``-1``
        outside the window."""
        width, height = width or self.size[0], height or self.size[1]
        col = self._axis_owner(0, width)
        row = self._axis_owner(1, height)
        token = row[:, None] * self.grid[1] + col[None, :]
        return torch.where((row[:, None] < 0) | (col[None, :] < 0), -1, token)

    def _axis_owner(self, axis: int, pixels: int) -> Tensor:
        scale = self.size[axis] / pixels
        p = (torch.arange(pixels, dtype=torch.float64) + 0.5) * scale
        edges = self.axis_edges(axis)
        idx = torch.bucketize(p, edges[1:-1], right=True)
        inside = (p >= edges[0]) & (p < edges[-1])
        return torch.where(inside, idx, -1)

    def paint(self, values: Tensor, width: int | None = None,
              height: int | None = None) -> Tensor:
        """``[..., N]`` token values -> ``[..., height, width]``: each pixel takes the value of
        the token whose cell holds it (0 outside the window), so a token's value covers the
        pixels it looks at."""
        own = self.owner(width, height)
        flat = values.reshape(-1, self.n)
        padded = torch.cat([flat, flat.new_zeros(flat.shape[0], 1)], dim=1)  # -1: no token
        out = padded[:, own.reshape(-1)].reshape(-1, *own.shape)
        return out.reshape(*values.shape[:-1], *own.shape)

    def pixel_masks(self, token_masks: Tensor, width: int | None = None,
                    height: int | None = None) -> Tensor:
        """``[..., height, width]`` bool: the pixels owned by the tokens of each ``[..., N]``
        token mask (e.g. region masks, or the patches a perturbation removes)."""
        return self.paint(token_masks.to(torch.bool), width, height)

    def pool(self, pixels: Tensor) -> Tensor:
        """``[..., N]``: the mean of ``[..., height, width]`` pixel values over each token's
        cell (the raster spans the frame; a token with no pixel gets 0)."""
        height, width = pixels.shape[-2:]
        own = self.owner(width, height).reshape(-1)
        flat = pixels.reshape(-1, height * width)
        inside = own >= 0
        sums = flat.new_zeros(flat.shape[0], self.n).index_add_(1, own[inside], flat[:, inside])
        count = torch.bincount(own[inside], minlength=self.n).to(flat)
        return (sums / count.clamp_min(1)).reshape(*pixels.shape[:-2], self.n)

    def envelope(self, keep: Tensor) -> Tensor:
        """``[B, 4]`` float64 pixel box enclosing the cells of the kept tokens
        (``[B, N]`` bool); a row with no token kept gives the whole window."""
        cells = self.cells()
        keep = keep.to(torch.bool).cpu()
        inf = torch.tensor(math.inf, dtype=torch.float64)
        lo = torch.where(keep[..., None], cells[None, :, :2], inf).amin(dim=1)
        hi = torch.where(keep[..., None], cells[None, :, 2:], -inf).amax(dim=1)
        box = torch.cat([lo, hi], dim=1)
        whole = torch.tensor(self.seen, dtype=torch.float64).expand_as(box)
        return torch.where(keep.any(dim=1, keepdim=True), box, whole)

    # ------------------------------------------------------------------ drawing
    def axis_weights(self, axis: int, pixels: int) -> Tensor:
        """``[pixels, count]`` float64 bilinear weights: pixel ``p`` of a ``pixels``-long
        raster of the frame takes its value from the two token centres around it (the
        nearest one's alone beyond the outermost centres); pixels outside the window get
        no weight."""
        count = self.grid[1 - axis]
        scale = self.size[axis] / pixels
        p = (torch.arange(pixels, dtype=torch.float64) + 0.5) * scale
        u = ((p - self.origin[axis]) / self.stride[axis]).clamp(0, count - 1)
        lo = u.floor().long().clamp(max=count - 1)
        hi = (lo + 1).clamp(max=count - 1)
        frac = u - lo
        w = torch.zeros(pixels, count, dtype=torch.float64)
        w.scatter_add_(1, lo[:, None], (1 - frac)[:, None])
        w.scatter_add_(1, hi[:, None], frac[:, None])
        inside = (p >= self.seen[axis]) & (p < self.seen[axis + 2])
        return w * inside[:, None]

    def upsample(self, heat: Tensor, width: int | None = None,
                 height: int | None = None) -> Tensor:
        """``[..., N]`` (or ``[..., rows, cols]``) token values to ``[..., height, width]``
        pixels of the frame (default: its own size): bilinear between token centres, so
        each token's value peaks where the token looks; 0 outside the window."""
        width, height = width or self.size[0], height or self.size[1]
        on_grid = heat.dim() >= 2 and tuple(heat.shape[-2:]) == tuple(self.grid)
        maps = heat if on_grid else heat.reshape(*heat.shape[:-1], *self.grid)
        wx = self.axis_weights(0, width).to(maps)
        wy = self.axis_weights(1, height).to(maps)
        return wy @ maps @ wx.T

    # ------------------------------------------------------------------ frames
    def mapped(self, scale: Pair, offset: Pair, size: tuple[int, int],
               window: Box | None = None) -> TokenGeometry:
        """The same tokens on another frame, ``x' = x * scale + offset`` per axis."""
        sx, sy = scale
        ox, oy = offset
        x0, y0, x1, y1 = self.seen
        box = (x0 * sx + ox, y0 * sy + oy, x1 * sx + ox, y1 * sy + oy)
        if window is not None:
            box = (max(box[0], window[0]), max(box[1], window[1]),
                   min(box[2], window[2]), min(box[3], window[3]))
        full = (0.0, 0.0, float(size[0]), float(size[1]))
        return TokenGeometry(
            self.grid, tuple(size),  # type: ignore[arg-type]
            (self.stride[0] * sx, self.stride[1] * sy),
            (self.origin[0] * sx + ox, self.origin[1] * sy + oy),
            None if box == full else box,
        )

    def scaled(self, width: int, height: int) -> TokenGeometry:
        """The same geometry on a resized copy of the frame (``width x height``)."""
        sx, sy = width / self.size[0], height / self.size[1]
        return self.mapped((sx, sy), (0.0, 0.0), (width, height))

    def on_image(self, width: int, height: int,
                 preprocess: Mapping[str, Any] | None = None) -> TokenGeometry:
        """This model-input geometry on the ``width x height`` picture the preprocessing
        (open_clip's ``preprocess_cfg``: ``resize_mode`` ``shortest``, ``longest`` or
        ``squash``) turned into the model input; ``None``: the picture was squashed."""
        scale, offset = input_frame((width, height), self.size, preprocess)
        return self.mapped(scale, offset, (width, height), (0.0, 0.0, float(width), float(height)))


def input_frame(image_size: tuple[int, int], input_size: tuple[int, int],
                preprocess: Mapping[str, Any] | None = None) -> tuple[Pair, Pair]:
    """``(scale, offset)`` with ``x_image = x_input * scale + offset`` per axis: where a
    model-input pixel point lies on the picture open_clip's eval transform read it from.

    ``resize_mode`` (open_clip's ``PreprocessCfg``): ``"shortest"`` resizes the shorter side
    to the input (torchvision's ``Resize``) and crops the centre; ``"longest"`` resizes the
    longer side and pads (``CenterCropOrPad``); ``"squash"`` resizes each side apart.
    """
    w, h = image_size
    tw, th = input_size
    mode = (preprocess or {}).get("resize_mode", "squash")
    if mode == "squash":
        return (w / tw, h / th), (0.0, 0.0)
    if mode == "shortest" and tw == th:  # torchvision Resize(int): the long side floored
        short, long_ = (h, w) if h <= w else (w, h)
        new_long = int(tw * long_ / short)
        rh, rw = (tw, new_long) if h <= w else (new_long, tw)
    elif mode in ("shortest", "longest"):  # open_clip's ResizeKeepRatio
        pick = max if mode == "longest" else min
        ratio = pick(h / th, w / tw)
        rh, rw = round(h / ratio), round(w / ratio)
    else:
        raise ValueError(f"unknown resize_mode {mode!r}")
    offset = []
    for resized, target in ((rw, tw), (rh, th)):
        pad = (target - resized) // 2 if target > resized else 0
        padded = max(resized, target)
        crop = int(round((padded - target) / 2.0))
        offset.append(crop - pad)
    sx, sy = w / rw, h / rh
    return (sx, sy), (offset[0] * sx, offset[1] * sy)
