"""Figures of the compositional probe (ConceptOT Sec. 3, SugarCrepe-style): the scores of
one image's true caption and its edits per method, the win/lose matrix, and accuracy per
negative category over a set of images."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from otviz.viz.style import DIVERGING_CMAP, SIMILARITY_CMAP, new_figure, no_ticks, plt

TRUE_COLOUR = "#222222"


def _text_colour(value: float, vmin: float, vmax: float, cmap: str) -> str:
    """Black or white, whichever reads better on the colour map at ``value``."""
    share = 0.5 if vmax == vmin else (value - vmin) / (vmax - vmin)
    r, g, b, _ = plt.get_cmap(cmap)(float(np.clip(share, 0.0, 1.0)))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def probe_scores_figure(
    methods: Sequence[str],
    captions: Sequence[str],
    scores: np.ndarray,
    *,
    ylabel: str = "g + lambda s_l",
    ncols: int = 3,
) -> Figure:
    """Grouped bars, one panel per method with its own score axis zoomed to its scores
    (the methods' scores live on different scales and edits move them little): the score
    of every caption, caption 0 being the true one (dark bar, dashed line across the
    panel); an edit whose bar passes the line fools the method.

    Args:
        methods: ``n`` method labels.
        captions: ``k`` short caption labels (legend), the true caption first.
        scores: ``[n, k]``.
    """
    scores = np.asarray(scores, dtype=float)
    n, k = scores.shape
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig = new_figure(3.0 * ncols + 1.6, 2.1 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    palette = plt.get_cmap("tab10")
    colours = [TRUE_COLOUR] + [palette((j - 1) % 10) for j in range(1, k)]
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.set_visible(False)
            continue
        bars = ax.bar(range(k), scores[i], color=colours)
        ax.axhline(scores[i, 0], color=TRUE_COLOUR, linestyle="--", linewidth=0.8)
        low, high = float(scores[i].min()), float(scores[i].max())
        pad = 0.15 * (high - low) or 0.05 * max(abs(high), 1e-3)
        ax.set_ylim(low - pad, high + pad)
        ax.set_title(methods[i], fontsize=8)
        no_ticks(ax, y=False)
        ax.tick_params(labelsize=7)
        if i % ncols == 0:
            ax.set_ylabel(ylabel, fontsize=7)
    fig.legend(bars, list(captions), loc="outside right upper", fontsize=7, frameon=False)
    fig.suptitle("Score of the true caption (dark, dashed) and of each edit", fontsize=9)
    return fig


def _annotated_matrix(
    ax,
    values: np.ndarray,
    labels: Sequence[Sequence[str]],
    cmap: str,
    vmin: float,
    vmax: float,
):
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=7,
                    color=_text_colour(values[i, j], vmin, vmax, cmap))
    return image


def win_matrix_figure(
    methods: Sequence[str], edits: Sequence[str], margins: np.ndarray
) -> Figure:
    """Win/lose matrix: cell ``(method, edit)`` holds the margin ``score(true) -
    score(edit)``, marked "win" when strictly positive (a tie loses, as in
    :func:`otviz.eval.probe.probe_accuracy`). Colours show the margin divided by the row's
    largest absolute margin, on a diverging scale centred at 0, since the methods' scores
    live on different scales."""
    margins = np.asarray(margins, dtype=float)
    scale = np.abs(margins).max(axis=1, keepdims=True)
    relative = margins / np.where(scale > 0, scale, 1.0)
    fig = new_figure(max(4.5, 1.0 * len(edits) + 2.5), 0.38 * len(methods) + 1.6)
    ax = fig.add_subplot()
    labels = [[f"{'win' if m > 0 else 'lose'}\n{m:+.3f}" for m in row] for row in margins]
    image = _annotated_matrix(ax, relative, labels, DIVERGING_CMAP, -1.0, 1.0)
    ax.set_xticks(range(len(edits)), list(edits), rotation=20, ha="right", fontsize=8)
    ax.set_yticks(range(len(methods)), list(methods), fontsize=8)
    ax.set_title("Does the true caption beat each edit? (margin true - edit)", fontsize=9)
    fig.colorbar(image, ax=ax, label="margin / largest |margin| of the method", shrink=0.9)
    return fig


def probe_accuracy_figure(
    methods: Sequence[str], categories: Sequence[str], accuracy: np.ndarray, n_items: int
) -> Figure:
    """Accuracy per method (rows) and negative category (columns, "overall" last): the
    share of items where the true caption scores strictly above the negative."""
    accuracy = np.asarray(accuracy, dtype=float)
    fig = new_figure(max(5.0, 0.9 * len(categories) + 2.5), 0.38 * len(methods) + 1.6)
    ax = fig.add_subplot()
    labels = [["-" if np.isnan(a) else f"{a:.2f}" for a in row] for row in accuracy]
    image = _annotated_matrix(ax, np.nan_to_num(accuracy, nan=0.0), labels, SIMILARITY_CMAP,
                              0.0, 1.0)
    ax.set_xticks(range(len(categories)), list(categories), rotation=20, ha="right",
                  fontsize=8)
    ax.set_yticks(range(len(methods)), list(methods), fontsize=8)
    ax.set_title(f"Probe accuracy over {n_items} (image, negative) pairs (chance 0.5)",
                 fontsize=9)
    fig.colorbar(image, ax=ax, label="accuracy", shrink=0.9)
    return fig
