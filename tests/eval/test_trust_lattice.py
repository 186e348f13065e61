"""Region perturbation removes the tokens' cells: Quantus' block lattice, padded so its
borders fall on the cells' borders (:mod:`otviz.eval.trust.lattice`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from otviz.eval.trust.lattice import PatchLattice
from otviz.eval.trust.metrics import TrustSettings, trust_scores
from otviz.patch_grid.tokens import TokenGeometry
from tests.eval.test_trust_metrics import FixedMaps

#: otviz's convolutional stem (three 3x3 stride-2 convolutions, padding 1) on 32 px: token
#: (i, j) looks at (8 j + 0.5, 8 i + 0.5); its cells are pixels 0-3, 4-11, 12-19, 20-31.
STEM = TokenGeometry((4, 4), (32, 32), (8.0, 8.0), (0.5, 0.5))


def _blocks_owners(geometry: TokenGeometry, lattice: PatchLattice) -> list[set[int]]:
    """The tokens owning the real pixels of each of Quantus' blocks on the padded input."""
    own = geometry.owner().numpy()
    padded = np.pad(own, lattice.pad, constant_values=-1)
    p = lattice.patch
    return [set(np.unique(padded[i : i + p, j : j + p])) - {-1}
            for i in range(0, padded.shape[0], p) for j in range(0, padded.shape[1], p)]


@pytest.mark.parametrize(("geometry", "pad"), [
    (STEM, ((4, 4), (4, 4))),
    (TokenGeometry((10, 10), (80, 80), (8.0, 8.0), (0.5, 0.5)), ((4, 4), (4, 4))),
    (TokenGeometry.cell_centred((4, 4), (64, 64)), ((0, 0), (0, 0))),  # a ViT: as Quantus lays it
    (TokenGeometry((2, 3), (48, 32), (16.0, 16.0), (4.5, 4.5)), ((4, 12), (4, 12))),
])
def test_every_block_lies_in_one_tokens_cell(geometry, pad):
    lattice = PatchLattice.on_cells(geometry)
    assert lattice.patch == geometry.stride[0] and lattice.pad == pad
    owners = _blocks_owners(geometry, lattice)
    assert all(len(o) == 1 for o in owners)
    # each interior token's cell is exactly one block
    interior = [i * geometry.grid[1] + j for i in range(1, geometry.grid[0] - 1)
                for j in range(1, geometry.grid[1] - 1)]
    assert all(sum(o == {t} for o in owners) == 1 for t in interior)


def test_quantus_own_lattice_cuts_the_stem_cells():
    """The negative control: Quantus' blocks from pixel 0 straddle the stem's cells."""
    plain = PatchLattice(8, ((0, 0), (0, 0)))
    assert max(len(o) for o in _blocks_owners(STEM, plain)) == 4


class CellMean(nn.Module):
    """One class: the mean of the pixels of the stem's token (1, 1), x, y in 4..11."""

    geometry = STEM
    grid = STEM.grid

    def forward(self, pixels: Tensor) -> Tensor:
        return torch.as_tensor(pixels)[:, :, 4:12, 4:12].mean(dim=(1, 2, 3))[:, None]


def test_deleting_the_top_token_removes_exactly_its_cell():
    """A map peaking on token (1, 1): one deletion step to "black" (Quantus: each image's
    minimum) removes its whole cell, and the score drops by all of it (on Quantus' own
    lattice from pixel 0 the top block holds a quarter of the cell: a quarter of the drop)."""
    rng = np.random.default_rng(0)
    pixels = rng.uniform(0.2, 1.0, size=(2, 3, 32, 32)).astype(np.float32)
    maps = torch.zeros(2, 16, dtype=torch.float64)
    maps[:, 5] = 1.0
    maps[:, 6] = 0.5  # not flat elsewhere either: the second block is token (1, 2)'s
    model = CellMean().eval()
    scores = trust_scores(model, FixedMaps(maps), pixels, np.zeros(2, dtype=np.int64), None,
                          TrustSettings(regions=1, baseline="black"),
                          metrics=["deletion"])
    full = pixels[:, :, 4:12, 4:12].mean(axis=(1, 2, 3)) - pixels.min(axis=(1, 2, 3))
    np.testing.assert_allclose(scores.values["deletion"], full, rtol=1e-5)
