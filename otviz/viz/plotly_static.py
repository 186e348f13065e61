"""A static matplotlib twin of a plotly figure, for PNG downloads without a browser (plotly's
own PNG export, kaleido, drives a Chromium per call: ~3 s a figure on this CPU, and none
is installed on a Space).

It draws the trace types the views use (``heatmap``, ``bar``, ``scatter``) with their
title, axis titles, tick labels, log axes, reversed axes and stacked y-axis domains; hover
text and interactivity have no static form.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from matplotlib.axes import Axes
from matplotlib.colors import LinearSegmentedColormap
from matplotlib.figure import Figure
from plotly.colors import convert_colors_to_same_type

from otviz.viz.style import HEAT_CMAP, drawable, new_figure

PX_PER_INCH = 100  # plotly's pixel sizes to inches


def _text(title) -> str:
    return drawable(getattr(title, "text", None) or "")


def _axis_names(fig: go.Figure) -> list[str]:
    """The y-axes the traces use, top to bottom by their layout domain."""
    names = sorted({getattr(t, "yaxis", None) or "y" for t in fig.data} or {"y"})

    def top(name: str) -> float:
        domain = fig.layout["yaxis" + name[1:]].domain
        return -(domain[1] if domain else 1.0)

    return sorted(names, key=top)


def _tick_positions(axis, categories) -> list | None:
    """Where ``axis``'s explicit ticks go: their values, or on a category axis the positions
    of those categories in the trace's coordinates (``categories``)."""
    if axis.tickvals is None or axis.ticktext is None:
        return None
    if axis.type != "category":
        return list(axis.tickvals)
    index = {c: k for k, c in enumerate(categories or ())}
    return [index[v] for v in axis.tickvals]


def _style_axes(ax: Axes, fig: go.Figure, yname: str, bottom: bool) -> None:
    xaxis, yaxis = fig.layout.xaxis, fig.layout["yaxis" + yname[1:]]
    trace = next((t for t in fig.data if (getattr(t, "yaxis", None) or "y") == yname), None)
    if yaxis.type == "log":
        ax.set_yscale("log")
    if yaxis.range is not None and yaxis.type == "log":
        ax.set_ylim(10 ** yaxis.range[0], 10 ** yaxis.range[1])
    elif yaxis.range is not None:
        ax.set_ylim(*yaxis.range)
    if yaxis.autorange == "reversed":
        ax.invert_yaxis()
    ax.set_ylabel(_text(yaxis.title), fontsize=9)
    x_ticks = _tick_positions(xaxis, getattr(trace, "x", None))
    if x_ticks is not None:
        ax.set_xticks(x_ticks, [drawable(str(t)) for t in xaxis.ticktext])
    y_ticks = _tick_positions(yaxis, getattr(trace, "y", None))
    if y_ticks is not None:
        ax.set_yticks(y_ticks, [drawable(str(t)) for t in yaxis.ticktext])
    if bottom:
        ax.set_xlabel(_text(xaxis.title), fontsize=9)
    ax.tick_params(axis="x", labelrotation=-(xaxis.tickangle or 0), labelsize=8)
    ax.tick_params(axis="y", labelsize=8)


def _colormap(scale) -> LinearSegmentedColormap | str:
    """A plotly colour scale (``(position, colour)`` pairs) as a matplotlib colour map."""
    if not scale:
        return HEAT_CMAP
    positions = [float(p) for p, _ in scale]
    colours = convert_colors_to_same_type([c for _, c in scale], colortype="tuple")[0]
    return LinearSegmentedColormap.from_list("plotly", list(zip(positions, colours, strict=True)))


def _draw_trace(ax: Axes, fig: Figure, trace, k: int, n_bars: int) -> bool:
    """Draw one trace; returns whether it carries a legend entry."""
    name = trace.name if trace.showlegend is not False else None
    if trace.type == "heatmap":
        z = np.asarray(trace.z, dtype=float)
        mesh = ax.imshow(z, aspect="auto", cmap=_colormap(trace.colorscale),
                         vmin=trace.zmin, vmax=trace.zmax, interpolation="nearest",
                         origin="lower")  # plotly draws row 0 at the bottom
        bar = fig.colorbar(mesh, ax=ax, shrink=0.9)
        bar.set_label(_text(trace.colorbar.title), fontsize=9)
        return False
    x, y = list(trace.x), np.asarray(trace.y, dtype=float)
    colour = (trace.marker.color if isinstance(trace.marker.color, str) else None)
    if trace.type == "bar":
        width = 0.8 / n_bars
        pos = np.arange(len(x)) + (k - (n_bars - 1) / 2) * width
        ax.bar(pos, y, width, color=colour, label=name)
        ax.set_xticks(np.arange(len(x)), [drawable(str(v)) for v in x])
        for p, v, t in zip(pos, y, trace.text or [], strict=False):
            ax.annotate(str(t), (p, v), ha="center", va="bottom", fontsize=7)
        return name is not None
    mode = trace.mode or "lines"
    if "lines" in mode or "markers" in mode:
        ax.plot(x, y, linestyle="-" if "lines" in mode else "none",
                marker="o" if "markers" in mode else None, markersize=4,
                color=colour or (trace.line.color if trace.line else None), label=name)
    if "text" in mode and trace.text is not None:
        for px, py, t in zip(x, y, trace.text, strict=False):
            if t:
                ax.annotate(drawable(str(t)), (px, py), xytext=(0, 5),
                            textcoords="offset points", ha="center", fontsize=7)
    return name is not None


def static_figure(fig: go.Figure) -> Figure:
    """The matplotlib twin of ``fig``: one panel per y-axis domain, traces drawn in order."""
    width = (fig.layout.width or 900) / PX_PER_INCH
    height = (fig.layout.height or 400) / PX_PER_INCH
    out = new_figure(width, height)
    names = _axis_names(fig)
    axes = out.subplots(len(names), 1, squeeze=False, sharex=len(names) > 1)[:, 0]
    for k, (yname, ax) in enumerate(zip(names, axes, strict=True)):
        traces = [t for t in fig.data if (getattr(t, "yaxis", None) or "y") == yname]
        bars = [t for t in traces if t.type == "bar"]
        legend = [_draw_trace(ax, out, t, bars.index(t) if t in bars else 0, max(1, len(bars)))
                  for t in traces]
        _style_axes(ax, fig, yname, k == len(names) - 1)
        if any(legend):
            ax.legend(fontsize=7)
    out.suptitle(_text(fig.layout.title), fontsize=10)
    return out
