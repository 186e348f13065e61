"""The app's figure output (``otviz.ui.plots``): a matplotlib figure is encoded once, with
its layout run once, to the pixels matplotlib's own ``savefig`` draws; plotly figures go
through ``gr.Plot`` unchanged."""

from __future__ import annotations

import base64
import io
import json

import matplotlib
import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from PIL import Image

from otviz.patch_grid.tokens import TokenGeometry
from otviz.ui.plots import FigurePlot, figure_data_url
from otviz.viz.heatmaps import heatmap_grid_figure
from otviz.viz.probe import probe_scores_figure
from otviz.viz.style import figure_bytes, settle_layout


def figures():
    """Figures with constrained layout, titles, a legend outside, colour bars."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (64, 48, 3), dtype=np.uint8)
    heats = [rng.random((4, 3)) for _ in range(5)]
    geometry = TokenGeometry.cell_centred((4, 3), (48, 64))
    return [
        probe_scores_figure(["FILIP", "Dense UOT", "ConceptOT", "Balanced OT"],
                            ["the caption", "an edit", "another edit"], rng.normal(size=(4, 3))),
        heatmap_grid_figure(image, heats, list("abcde"), geometry=geometry, shared_scale=False),
        heatmap_grid_figure(image, heats, list("abcde"), geometry=geometry,
                            suptitle="shared scale"),
    ]


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"))


def test_one_layout_pass_draws_what_savefig_draws():
    for made, again in zip(figures(), figures(), strict=True):
        reference = io.BytesIO()
        made.savefig(reference, format="png")  # matplotlib's path: a layout draw, then pixels
        np.testing.assert_array_equal(pixels(figure_bytes(again, "png")),
                                      pixels(reference.getvalue()))
        assert again.get_layout_engine() is None  # run, its result kept, the engine off


def test_a_settled_figure_is_drawn_once_whatever_the_rcparams(monkeypatch):
    """``savefig`` draws a figure with a layout engine (the placeholder ``"none"`` leaves
    too) twice; a settled one once, even where the rcParams ask every figure for a layout."""
    draws = []
    draw = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda fig, renderer: (draws.append(fig),
                                                               draw(fig, renderer))[1])
    for rc in ({}, {"figure.constrained_layout.use": True}, {"figure.autolayout": True}):
        with matplotlib.rc_context(rc):
            fig = figures()[1]
            assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)
            settle_layout(fig)
            assert fig.get_layout_engine() is None, rc
            draws.clear()
            figure_bytes(fig, "webp")
            assert len(draws) == 1, rc
            placeholder = figures()[1]
            placeholder.get_layout_engine().execute(placeholder)
            placeholder.set_layout_engine("none")
            draws.clear()
            placeholder.savefig(io.BytesIO(), format="webp")
            assert len(draws) == 2  # what settling saves


def test_a_figure_reaches_the_page_as_webp_of_its_size():
    plot = FigurePlot()
    for fig in figures():
        width, height = (fig.get_size_inches() * fig.dpi).round().astype(int)
        data = plot.postprocess(fig)
        assert data.type == "matplotlib"
        header, encoded = data.plot.split(",", 1)
        assert header == "data:image/webp;base64"
        assert Image.open(io.BytesIO(base64.b64decode(encoded))).size == (width, height)
    assert figure_data_url(figures()[0]).startswith("data:image/webp;base64,")


def test_plotly_figures_and_the_frontend_are_gradios():
    fig = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]))
    data = FigurePlot().postprocess(fig)
    assert data.type == "plotly"
    assert json.loads(data.plot)["data"][0]["z"] == [[1, 2], [3, 4]]
    assert FigurePlot().postprocess(None) is None
    assert FigurePlot().get_block_name() == "plot"  # the page draws it with gr.Plot's frontend


def test_hidden_tick_axes_draw_the_pixels_of_empty_ticks(monkeypatch):
    """:func:`~otviz.viz.style.no_ticks` hides the axis artists instead of emptying their
    ticks: the same pixels (heatmap panels with titles and colour bars, bars with a y axis
    only)."""
    import otviz.viz.style as style

    def empty_ticks(ax, *, x=True, y=True):
        if x:
            ax.set_xticks([])
        if y:
            ax.set_yticks([])

    hidden = [pixels(figure_bytes(fig, "png")) for fig in figures()]
    for module in ("heatmaps", "probe"):
        monkeypatch.setattr(f"otviz.viz.{module}.no_ticks", empty_ticks)
    assert style.no_ticks is not empty_ticks
    emptied = [pixels(figure_bytes(fig, "png")) for fig in figures()]
    for a, b in zip(hidden, emptied, strict=True):
        np.testing.assert_array_equal(a, b)
