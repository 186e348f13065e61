"""The report's grounding grid: a method whose map is flat by construction (Global+Patch)
says why in its panel, in the words the app's views use, instead of an empty map."""

from __future__ import annotations

import textwrap

import numpy as np

from otviz.patch_grid.tokens import TokenGeometry
from otviz.report.figures import grounding_grid_figure
from otviz.suite import flat_map_reasons


def test_a_flat_column_says_why_in_each_row():
    geometry = TokenGeometry.cell_centred((4, 4), (32, 32))
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(2)]
    heats = [[np.full((4, 4), 1 / 16), rng.random((4, 4))] for _ in range(2)]
    reason = flat_map_reasons()["global_patch"]
    fig = grounding_grid_figure(images, heats, [[0, 0, 8, 8]] * 2, ['"a"', '"b"'],
                                ["Global+Patch", "FILIP"], geometry, notes=[reason, None])
    axes = np.asarray(fig.axes).reshape(2, -1)[:, :2]  # the colour bars, if any, come after
    for row in axes:
        assert [t.get_text() for t in row[0].texts] == [textwrap.fill(reason, 26)]
        assert len(row[1].texts) == 0
