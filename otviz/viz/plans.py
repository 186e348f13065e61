"""Interactive (plotly) views of one transport plan: the patch x token matrix with hover
labels, the token marginals against the reference masses nu, and the solvers' convergence.

Figures are built from plain dicts and styled by hand rather than with a named plotly
template (loading one costs ~25 ms per figure), cheap enough to rebuild on every click.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from otviz.viz.style import HEAT_CMAP, drawable

KEPT_COLOUR = "#b5367a"  # magma's magenta: mass the plan kept
REFERENCE_COLOUR = "#9e9e9e"  # the reference mass the solver aimed for
FONT = {"size": 11}


def _layout(title: str, height: int, **extra) -> dict:
    return {
        "title": {"text": title, "font": {"size": 13}},
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 60},
        "font": FONT,
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        **extra,
    }


def plan_matrix_figure(
    plan: np.ndarray,
    grid: tuple[int, int],
    token_labels: Sequence[str],
    token_words: Sequence[str],
    title: str,
) -> go.Figure:
    """Heatmap of a plan ``[N patches, M tokens]`` (rows row-major on ``grid``).

    Hovering a cell names the patch (its index and ``(row, col)`` on the grid), the BPE
    token and the caption word it belongs to, and the mass ``P_ij``.
    """
    token_labels = [drawable(t) for t in token_labels]
    token_words = [drawable(w) for w in token_words]
    n, m = plan.shape
    if n != grid[0] * grid[1]:
        raise ValueError(f"plan has {n} rows but the grid {grid} has {grid[0] * grid[1]} patches")
    if not len(token_labels) == len(token_words) == m:
        raise ValueError(f"{m} plan columns but {len(token_labels)} token labels")
    rows, cols = np.divmod(np.arange(n), grid[1])
    # the hover names live on the axes (categories), not in an n x m text matrix: the
    # figure's JSON stays ~50 KB instead of ~400 KB, which the browser parses per click
    patches = [f"patch {i} (row {r}, col {c})" for i, r, c in zip(range(n), rows, cols,
                                                                  strict=True)]
    tokens = [f"token {j} '{t}' of word '{w}'"
              for j, (t, w) in enumerate(zip(token_labels, token_words, strict=True))]
    trace = {
        "type": "heatmap",
        "z": plan,
        "x": tokens,
        "y": patches,
        "hovertemplate": "%{y}<br>%{x}<br>mass %{z:.4g}<extra></extra>",
        "colorscale": HEAT_CMAP,
        "zmin": 0.0,
        "colorbar": {"title": {"text": "mass", "side": "right"}, "thickness": 12},
    }
    row_starts = list(range(0, n, grid[1]))
    layout = _layout(
        title,
        height=max(360, min(720, 6 * n + 120)),
        xaxis={
            "type": "category",
            "tickmode": "array",
            "tickvals": tokens,
            "ticktext": list(token_labels),
            "tickangle": -45,
            "title": {"text": "caption token"},
        },
        yaxis={"type": "category", "autorange": "reversed", "tickmode": "array",
               "tickvals": [patches[i] for i in row_starts],
               "ticktext": [str(i) for i in row_starts],
               "title": {"text": "image patch (row-major; a tick per grid row)"}},
    )
    return go.Figure({"data": [trace], "layout": layout})


def token_marginal_figure(
    kept: np.ndarray, reference: np.ndarray | None, token_labels: Sequence[str], title: str
) -> go.Figure:
    """Grouped bars per token: the mass the plan kept (column marginal) next to the
    reference mass nu (absent for methods without one)."""
    x = [f"{j}:{drawable(t)}" for j, t in enumerate(token_labels)]
    data = [
        {
            "type": "bar",
            "name": "kept (plan column sum)",
            "x": x,
            "y": kept,
            "marker": {"color": KEPT_COLOUR},
        }
    ]
    if reference is not None:
        data.append(
            {
                "type": "bar",
                "name": "reference nu",
                "x": x,
                "y": reference,
                "marker": {"color": REFERENCE_COLOUR},
            }
        )
    layout = _layout(
        title,
        300,
        barmode="group",
        xaxis={"tickangle": -45},
        yaxis={"title": {"text": "mass"}},
        legend={"orientation": "h", "y": 1.12, "x": 0},
    )
    return go.Figure({"data": data, "layout": layout})


def convergence_figure(labels: Sequence[str], errors: Sequence[float | None]) -> go.Figure:
    """Bars of each OT solver's final marginal error (log scale); methods without a solver
    (``None``) are listed as such under the axis."""
    solved = [(lab, e) for lab, e in zip(labels, errors, strict=True) if e is not None]
    absent = [lab for lab, e in zip(labels, errors, strict=True) if e is None]
    floor = 1e-12
    data = [
        {
            "type": "bar",
            "x": [lab for lab, _ in solved],
            "y": [max(float(e), floor) for _, e in solved],
            "text": [f"{float(e):.2e}" for _, e in solved],
            "textposition": "outside",
            "marker": {"color": KEPT_COLOUR},
            "hovertemplate": "%{x}: marginal error %{text}<extra></extra>",
        }
    ]
    note = "no OT solver: " + ", ".join(absent) if absent else ""
    heights = data[0]["y"] or [1.0]
    # a decade of headroom above the tallest bar and below the lowest, for the value labels
    log_range = [np.log10(min(heights)) - 1.0, np.log10(max(heights)) + 1.0]
    layout = _layout(
        "Solver convergence (final marginal error)",
        300,
        yaxis={"type": "log", "title": {"text": "marginal error"}, "range": log_range},
        xaxis={"title": {"text": note}},
    )
    return go.Figure({"data": data, "layout": layout})
