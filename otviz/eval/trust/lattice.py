"""The patches a region perturbation removes, laid on the tokens' cells.

Quantus' ``RegionPerturbation`` (deletion, insertion) cuts its input into square blocks of
``patch_size`` pixels on a lattice that starts at pixel 0 (after its own centred padding to a
multiple of the side), ranks the blocks by their summed relevance and replaces them one by one.
A token's cell (:meth:`otviz.patch_grid.tokens.TokenGeometry.cells`: the pixels closer to where
it looks than to where any other token looks) starts at pixel 0 only when the tokens are
centred on an even split of the input (a ViT). otviz's convolutional stem centres token
``(i, j)`` at ``(8 j + 0.5, 8 i + 0.5)``: its cells are pixels ``[8 k - 4, 8 k + 4)``, and a
lattice from pixel 0 would cut every removed block across four tokens.

:class:`PatchLattice` pads the input (edge values) so that Quantus' lattice, on the padded
input, has its block borders on the cells' interior borders (the padding holds each image's
mean value, so Quantus' ``"mean"`` baseline stays the image's), and :class:`CroppedScorer`
crops the padding off before the model sees the pixels. Then every block lies inside one
token's cell and every interior token's cell is exactly one block. Quantus' blocks are all
one size, so the outer cells, which reach the input's edge, can differ: an outer cell
narrower than the stride is one block that is partly padding (only its pixels change the
model's input), a wider one is two blocks (the stem's bottom and right cells: 12 px, a block
of 8 and one of 4 real pixels), removed as Quantus ranks them (summed relevance). This is as
close as Quantus' API allows: it has no per-region masks for region perturbation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from torch import Tensor, nn

from otviz.patch_grid.tokens import TokenGeometry


@dataclass(frozen=True)
class PatchLattice:
    """Quantus' perturbation blocks on a padded input.

    Attributes:
        patch: the blocks' side in pixels.
        pad: ``((top, bottom), (left, right))`` pixels added around the input.
    """

    patch: int
    pad: tuple[tuple[int, int], tuple[int, int]]

    @classmethod
    def on_cells(cls, geometry: TokenGeometry, patch: int = 0) -> PatchLattice:
        """The lattice of ``patch``-px blocks (0: the tokens' stride, rounded) whose borders
        fall on the interior cell borders of ``geometry`` (a model-input geometry). Exact
        when ``patch`` is the stride and the stride is a whole number of pixels on both
        axes; otherwise the blocks start at the first interior cell border."""
        side = patch or max(1, round(sum(geometry.stride) / 2))
        pads = []
        for axis in (1, 0):  # rows (y) first, as the input's [H, W]
            size = geometry.size[axis]
            first = geometry.axis_edges(axis)[1].item() if geometry.grid[1 - axis] > 1 else 0.0
            in_first = math.ceil(first - 0.5)  # pixels whose centre lies in the first cell
            lead = (-in_first) % side
            pads.append((lead, (-(lead + size)) % side))
        return cls(side, (pads[0], pads[1]))

    def padded(self, x: np.ndarray) -> np.ndarray:
        """``[B, C, H, W]`` -> the padded input, the padding at 0."""
        (top, bottom), (left, right) = self.pad
        return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))


class CroppedScorer(nn.Module):
    """``model`` on the input with the lattice's padding cropped off (what Quantus runs
    on the padded input)."""

    def __init__(self, model: nn.Module, lattice: PatchLattice) -> None:
        super().__init__()
        self.model = model
        self.lattice = lattice
        self.train(model.training)

    def forward(self, pixels: Tensor) -> Tensor:
        (top, bottom), (left, right) = self.lattice.pad
        h, w = pixels.shape[-2:]
        return self.model(pixels[..., top : h - bottom, left : w - right])
