"""The app's figure output: every matplotlib figure a view returns is encoded by otviz
(:func:`otviz.viz.style.figure_bytes`: its layout run once, WebP at the fastest method)
instead of by Gradio's ``gr.Plot`` (a second, invisible drawing for the layout, and WebP's
default method). The Probe's 9-panel figure: 0.56 s of CPU against 0.63 s (medians of 7 on
the 2-core machine; its constrained layout alone takes 0.30 s, its drawing 0.22 s). Plotly
figures go to ``gr.Plot`` unchanged."""

from __future__ import annotations

import base64
from typing import Any

import gradio as gr
from gradio.components.plot import PlotData
from matplotlib.figure import Figure

from otviz.ui.inputs import no_type_stub
from otviz.viz.style import figure_bytes


def figure_data_url(fig: Figure) -> str:
    """``fig`` as the ``data:image/webp`` URL the page's plot shows."""
    return "data:image/webp;base64," + base64.b64encode(figure_bytes(fig, "webp")).decode()


with no_type_stub():

    class FigurePlot(gr.Plot):
        """``gr.Plot`` whose matplotlib figures :func:`figure_data_url` encodes. A template
        of ``gr.Plot`` (shown by its frontend), like :class:`otviz.ui.inputs.CheckedImage`
        of ``gr.Image``."""

        is_template = True

        def postprocess(self, value: Any) -> PlotData | None:
            if isinstance(value, Figure):
                return PlotData(type="matplotlib", plot=figure_data_url(value))
            return super().postprocess(value)
