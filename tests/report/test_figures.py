"""The report's figures: in the grounding grid a method whose map is flat by construction
(Global+Patch) says why in its panel, in the words the app's views use, instead of an empty
map; the grouped bars keep their title, legend and bars inside the figure and apart."""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg

from otviz.patch_grid.tokens import TokenGeometry
from otviz.report.figures import grounding_grid_figure, grouped_bars_figure
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


def test_grouped_bars_keep_a_long_title_and_legend_inside_the_figure():
    series = {f"series {s}, a long legend label (Eq. {s})": [1.0, 0.98, 0.5] for s in range(5)}
    spans = {k: [[v - 0.02, min(v + 0.02, 1.0)] for v in vals] for k, vals in series.items()}
    title = "A table title long enough to run past the figure's right edge; " * 3
    fig = grouped_bars_figure(["a", "b", "c"], series, title, "%", intervals=spans)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    figure_box = fig.bbox
    for artist in (ax.title, ax.get_legend()):
        box = artist.get_window_extent(renderer)
        assert box.x0 >= figure_box.x0 - 1 and box.x1 <= figure_box.x1 + 1
    legend = ax.get_legend().get_window_extent(renderer)
    top_of_bars = ax.transData.transform((0, 102))[1]  # the bars and whiskers end at 100 %
    assert legend.y0 >= top_of_bars
