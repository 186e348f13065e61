"""Interactive (plotly) views of method-head training: the loss curves of a run as it goes
(the training objective, ConceptOT Eq. 10 or the method's own local loss, and its local
term, per optimiser step) and the end-of-run comparison of each trained head with its
training-free configuration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from otviz.viz.plans import FONT, KEPT_COLOUR, REFERENCE_COLOUR

#: One colour per method (colour-blind safe, Okabe-Ito), in the order methods are given.
METHOD_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
                  "#F0E442", "#000000")
CURVES = (("loss", "training loss (Eq. 10)", "y"), ("local", "local term", "y2"))


def loss_curves_figure(
    histories: Mapping[str, Sequence[Mapping[str, float]]], labels: Mapping[str, str]
) -> go.Figure:
    """Two stacked panels sharing the step axis: the total loss and its local term per
    optimiser step, one line per method (``histories[method]`` are the per-step records of
    :class:`otviz.train.loop.TrainResult`; ``labels`` names the methods)."""
    data = []
    for k, (method, records) in enumerate(histories.items()):
        colour = METHOD_COLOURS[k % len(METHOD_COLOURS)]
        steps = [r["step"] for r in records]
        for key, title, axis in CURVES:
            data.append({
                "type": "scatter",
                # markers too: a run of one step is a single point, which a line never draws
                "mode": "lines+markers",
                "marker": {"color": colour, "size": 5},
                "x": steps,
                "y": [r[key] for r in records],
                "name": labels.get(method, method),
                "legendgroup": method,
                "showlegend": axis == "y",
                "line": {"color": colour, "width": 1.5},
                "yaxis": axis,
                "hovertemplate": f"{labels.get(method, method)} step %{{x}}: {title} "
                                 "%{y:.4f}<extra></extra>",
            })
    layout = {
        "height": 360,
        "margin": {"l": 60, "r": 20, "t": 30, "b": 40},
        "font": FONT,
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        "xaxis": {"title": {"text": "optimiser step"}, "anchor": "y2"},
        "yaxis": {"title": {"text": CURVES[0][1]}, "domain": [0.55, 1.0]},
        "yaxis2": {"title": {"text": CURVES[1][1]}, "domain": [0.0, 0.45]},
        "legend": {"orientation": "h", "y": 1.08},
        "uirevision": "keep",  # live updates keep the user's zoom
    }
    if not data:
        layout["annotations"] = [{"text": "no step yet", "showarrow": False,
                                  "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5}]
    return go.Figure({"data": data, "layout": layout})


def before_after_figure(
    labels: Sequence[str], before: Sequence[float], after: Sequence[float], title: str,
    axis: str,
) -> go.Figure:
    """Grouped bars: per method, a value of the training-free configuration (grey) next to
    the trained head's (magenta), values written on the bars."""
    data = [
        {"type": "bar", "name": name, "x": list(labels), "y": list(values),
         "marker": {"color": colour}, "text": [f"{v:.3f}" for v in values],
         "textposition": "outside", "hovertemplate": f"%{{x}} ({name}): %{{y:.4f}}<extra></extra>"}
        for name, values, colour in (("training-free", before, REFERENCE_COLOUR),
                                     ("trained", after, KEPT_COLOUR))
    ]
    layout = {
        "title": {"text": title, "font": {"size": 13}},
        "height": 300,
        "barmode": "group",
        "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
        "font": FONT,
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        # headroom above the tallest bar for its value
        "yaxis": {"title": {"text": axis}, "range": [0, 1.15 * max([*before, *after, 1e-9])]},
        "legend": {"orientation": "h", "y": -0.2},
    }
    return go.Figure({"data": data, "layout": layout})
