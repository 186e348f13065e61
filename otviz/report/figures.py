"""Paper-style figures of the evaluation report (``otviz report``): grouped bars of table
columns, training and convergence curves, and a grid of phrase-grounding heatmaps (rows:
examples, columns: methods). The probe, anchor-similarity and anchor-word figures are those
of :mod:`otviz.viz.probe` and :mod:`otviz.viz.anchors`."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from otviz.patch_grid.tokens import TokenGeometry
from otviz.viz.heatmaps import draw_heatmap
from otviz.viz.style import new_figure, plt

#: Characters of a 9 pt title per inch of figure width (titles longer than the figure wrap).
TITLE_CHARS_PER_INCH = 13
#: Characters of a 7 pt legend entry per inch (its columns stay inside the figure).
LEGEND_CHARS_PER_INCH = 17


#: The grounding grid's default title.
GRID_TITLE = "Phrase heatmaps (plan columns summed over the phrase's tokens); gold box in cyan"


def grouped_bars_figure(
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    title: str,
    ylabel: str,
    percent: bool = True,
    intervals: Mapping[str, Sequence[Sequence[float] | None]] | None = None,
) -> Figure:
    """One cluster of bars per group (e.g. method), one bar per series (e.g. metric), the
    value printed on each bar. ``percent`` shows fractions as percentages on a 0-100 axis.
    ``intervals`` (per series, a ``[low, high]`` per group or None) draws each bar's
    interval as an error bar, the value then printed inside the bar."""
    scale = 100.0 if percent else 1.0
    k, n = len(series), len(groups)
    width = 0.8 / max(k, 1)
    fig_width = max(5.0, 0.35 * n * max(k, 1) + 1.8)
    fig = new_figure(fig_width, 3.4)
    ax = fig.add_subplot()
    palette = plt.get_cmap("tab10")
    for s, (label, values) in enumerate(series.items()):
        vals = np.asarray([np.nan if v is None else v for v in values], dtype=float) * scale
        pos = np.arange(n) + (s - (k - 1) / 2) * width
        bars = ax.bar(pos, np.nan_to_num(vals), width, label=label, color=palette(s % 10))
        spans = (intervals or {}).get(label)
        if spans is not None:
            low, high = (np.asarray([np.nan if c is None else c[i] for c in spans], float)
                         * scale for i in (0, 1))
            ax.errorbar(pos, vals, yerr=[vals - low, high - vals], fmt="none", ecolor="black",
                        elinewidth=0.8, capsize=2)
        texts = ax.bar_label(bars, labels=["-" if np.isnan(v) else f"{v:.0f}" if percent
                                           else f"{v:.2f}" for v in vals], fontsize=6, padding=1,
                             label_type="edge" if spans is None else "center")
        if spans is not None:  # readable where an interval's whisker crosses the value
            for text in texts:
                text.set_bbox({"boxstyle": "round,pad=0.15", "facecolor": "white",
                               "edgecolor": "none", "alpha": 0.75})
    ax.set_xticks(np.arange(n), list(groups), rotation=20, ha="right", fontsize=8)
    legend_rows = 0
    if k > 1:
        fits = int(LEGEND_CHARS_PER_INCH * fig_width) // (max(map(len, series)) + 5)
        ncols = max(1, min(k, 4, fits))
        legend_rows = -(-k // ncols)
        ax.legend(fontsize=7, frameon=False, ncols=ncols, loc="upper left")
    if percent:  # headroom above 100 for the legend's rows, which would cover full bars
        ax.set_ylim(0, 108 + 14 * legend_rows)
        ax.set_yticks(np.arange(0, 101, 20))
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(textwrap.fill(title, int(TITLE_CHARS_PER_INCH * fig_width)), fontsize=9)
    ax.tick_params(axis="y", labelsize=7)
    return fig


def curves_figure(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]],
    ylabel: str,
    xlabel: str = "step",
    smooth: int = 1,
    suptitle: str | None = None,
) -> Figure:
    """One panel per entry of ``panels`` (title -> runs), one line per run ``label -> (x,
    y)`` (runs whose values live on different scales go to different panels); ``smooth >
    1`` draws the running mean over that many points, the raw curve faintly behind it."""
    fig = new_figure(4.2 * len(panels) + 0.6, 3.4)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    palette = plt.get_cmap("tab10")
    colour = 0
    for ax, (title, curves) in zip(axes, panels.items(), strict=True):
        for label, (x, y) in curves.items():
            x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
            c = palette(colour % 10)
            colour += 1
            if smooth > 1 and y.size >= smooth:
                ax.plot(x, y, color=c, alpha=0.2, linewidth=0.8)
                kernel = np.ones(smooth) / smooth
                ax.plot(x[smooth - 1 :], np.convolve(y, kernel, mode="valid"), color=c,
                        label=label, linewidth=1.4)
            else:
                ax.plot(x, y, color=c, label=label, linewidth=1.4)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, frameon=False, loc="best")
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return fig


def grounding_grid_figure(
    images: Sequence[np.ndarray],
    heats: Sequence[Sequence[np.ndarray]],
    boxes: Sequence[Sequence[float]],
    row_titles: Sequence[str],
    column_titles: Sequence[str],
    geometry: TokenGeometry,
    panel_size: float = 1.7,
    notes: Sequence[str | None] = (),
    title: str = GRID_TITLE,
) -> Figure:
    """Rows: examples (image, queried phrase, gold box in cyan); columns: methods, each
    panel the method's phrase heatmap on its own colour scale (masses differ by method),
    drawn where its tokens look (``geometry``: the token geometry on the images, which
    share one size). A column with a note (``notes``, one per column or none: a map flat by
    construction, :func:`~otviz.suite.flat_map_reasons`) shows that reason in words over
    its image instead of a map drawn as if it were a result, as the app's grid does.
    ``title``: the figure's (the report names the reading there,
    :func:`~otviz.viz.tables.titled`)."""
    rows, cols = len(images), len(column_titles)
    fig = new_figure(panel_size * cols + 0.4, panel_size * rows + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False)
    for r in range(rows):
        for c in range(cols):
            ax = axes[r, c]
            heat = np.asarray(heats[r][c], dtype=float)
            note = notes[c] if notes else None
            draw_heatmap(ax, images[r], heat, geometry, vmin=float(heat.min()),
                         vmax=float(heat.max()), box=boxes[r], alpha=0.0 if note else 0.6,
                         title=column_titles[c] if r == 0 else None)
            if note:
                ax.text(0.5, 0.5, textwrap.fill(note, 26), transform=ax.transAxes,
                        ha="center", va="center", fontsize=4.5,
                        bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none"})
            if c == 0:
                ax.set_ylabel(row_titles[r], fontsize=7)
    return with_title(fig, title)


def with_title(fig: Figure, title: str) -> Figure:
    """``fig`` with ``title`` over all its panels, wrapped to the figure's width."""
    fig.suptitle(textwrap.fill(title, int(TITLE_CHARS_PER_INCH * fig.get_figwidth())),
                 fontsize=9)
    return fig
