"""Figures of ConceptOT's concept anchors (ConceptOT Sec. 2.3-2.4, Fig. 4-5) and the small
numbers behind them.

* :func:`anchor_matrix_figure`: the anchor-anchor cosine matrix ``P P^T``, rows and columns
  in the leaf order of average-linkage clustering on ``1 - cos`` (:func:`cluster_order`);
* :func:`affinity_figure`: anchor-word cosines, anchors in the same order;
* :func:`anchor_kernel_maps` / :func:`anchor_mass`: where each anchor is active on an image
  (the columns of ``K_ZP``, Eq. 5) and how much of the transported mass goes through it
  (the factored plan of Eq. 7);
* :func:`embed_2d` / :func:`embedding_scatter`: anchors and words on one 2-D map (PCA or
  t-SNE), as an interactive plotly scatter.

No Gradio here: the same figures serve the app, the CLI and the README.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from matplotlib.figure import Figure
from scipy.cluster.hierarchy import leaves_list, linkage
from scipy.spatial.distance import squareform
from torch import Tensor

from otviz.viz.style import DIVERGING_CMAP, SIMILARITY_CMAP, drawable, new_figure

PROJECTIONS: tuple[str, ...] = ("PCA", "t-SNE")
MAX_TICK_LABELS = 48  # beyond this many anchors, label every other tick


def cluster_order(cosine: np.ndarray) -> np.ndarray:
    """Leaf order of average-linkage hierarchical clustering of the anchors on the distance
    ``1 - cos`` (symmetrised, clipped at 0): similar anchors end up adjacent."""
    r = cosine.shape[0]
    if r < 2:
        return np.arange(r)
    dist = np.clip(1.0 - np.asarray(cosine, dtype=np.float64), 0.0, None)
    dist = (dist + dist.T) / 2.0
    np.fill_diagonal(dist, 0.0)
    return leaves_list(linkage(squareform(dist, checks=False), method="average"))


def _anchor_ticks(ax, order: np.ndarray, axis: str) -> None:
    step = 1 if len(order) <= MAX_TICK_LABELS else 2
    pos = np.arange(0, len(order), step)
    labels = [str(int(order[p])) for p in pos]
    if axis in ("x", "both"):
        ax.set_xticks(pos, labels, fontsize=6, rotation=90)
    if axis in ("y", "both"):
        ax.set_yticks(pos, labels, fontsize=6)


def anchor_matrix_figure(
    cosine: np.ndarray, order: np.ndarray | None = None, mean_offdiag: float | None = None
) -> Figure:
    """The ``[r, r]`` anchor cosine matrix, reordered by :func:`cluster_order` (or ``order``);
    ticks name the original anchor indices. Diverging colour map on ``[-1, 1]``."""
    cosine = np.asarray(cosine, dtype=np.float64)
    order = cluster_order(cosine) if order is None else np.asarray(order)
    size = min(7.0, 2.5 + 0.12 * len(order))
    fig = new_figure(size + 1.0, size)
    ax = fig.subplots()
    image = ax.imshow(
        cosine[np.ix_(order, order)], cmap=DIVERGING_CMAP, vmin=-1.0, vmax=1.0,
        interpolation="nearest",
    )
    _anchor_ticks(ax, order, "both")
    ax.set_xlabel("anchor (clustered order)")
    ax.set_ylabel("anchor")
    title = "Anchor-anchor cosine, average-linkage order"
    if mean_offdiag is not None:
        title += f"\nmean off-diagonal cosine = {mean_offdiag:.3f}"
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8, label="cosine")
    return fig


def affinity_figure(affinity: np.ndarray, words: Sequence[str], order: np.ndarray) -> Figure:
    """The ``[r, n_words]`` anchor-word cosine heatmap, anchors (rows) in ``order``."""
    affinity = np.asarray(affinity, dtype=np.float64)
    r, n = affinity.shape
    fig = new_figure(min(14.0, 2.0 + 0.28 * n), min(8.0, 2.0 + 0.12 * r))
    ax = fig.subplots()
    image = ax.imshow(affinity[order], cmap=SIMILARITY_CMAP, aspect="auto", interpolation="nearest")
    ax.set_xticks(np.arange(n), list(words), fontsize=7, rotation=60, ha="right")
    _anchor_ticks(ax, order, "y")
    ax.set_ylabel("anchor (clustered order)")
    ax.set_title("Anchor-word affinity (cosine in the concept space)", fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8, label="cosine")
    return fig


def top_words(
    affinity: np.ndarray, words: Sequence[str], k: int = 3
) -> list[list[tuple[str, float]]]:
    """Per anchor, its ``k`` words of highest affinity with the affinity, best first."""
    affinity = np.asarray(affinity)
    best = np.argsort(-affinity, axis=1, kind="stable")[:, :k]
    return [[(words[j], float(affinity[i, j])) for j in row] for i, row in enumerate(best)]


def anchor_kernel_maps(patch_anchor_cosine: Tensor, eps: float) -> Tensor:
    """``K_ZP[i, k] = exp(-(1 - z_i . p_k) / eps)`` (Eq. 5) from ``[N, r]`` patch-anchor
    cosines: column ``k`` is where anchor ``k`` is active on the image."""
    return torch.exp(-(1.0 - patch_anchor_cosine) / eps)


def anchor_mass(plan) -> Tensor:
    """``[B, r]`` share of the transported mass routed through each anchor.

    The factored plan is ``P~ = s * L C R`` (:class:`otviz.ot.lowrank.LowRankPlan`: ``L =
    diag(a) K_ZP``, ``C`` the core, ``R = K_PY diag(b)``, ``s`` the carried scale), so its
    total mass ``1^T P~ 1 = s * sum_k (1^T L)_k (C R 1)_k`` splits over the anchors ``k``.
    With the faithful kernel's inverse core (``K_PP,lambda^-1``) a term can be negative;
    the terms always sum to the total mass.
    """
    out_mass = plan.left.sum(1)  # [B, r]
    in_mass = (plan.core @ plan.right.sum(2, keepdim=True)).squeeze(-1)  # [B, r]
    return out_mass * in_mass * torch.exp(plan.log_scale)[:, None]


def embed_2d(points: np.ndarray, projection: str = "PCA", seed: int = 0) -> np.ndarray:
    """``[n, 2]`` coordinates of ``points`` (rows) by PCA or t-SNE (scikit-learn, seeded;
    t-SNE's perplexity is ``min(30, (n - 1) / 3)`` so it stays below ``n``)."""
    from sklearn.decomposition import PCA  # here: scikit-learn takes ~1 s to import
    from sklearn.manifold import TSNE

    points = np.asarray(points, dtype=np.float64)
    n = points.shape[0]
    if projection == "PCA":
        if n < 2:
            raise ValueError("a PCA map needs at least 2 points")
        return PCA(n_components=2, random_state=seed).fit_transform(points)
    if projection == "t-SNE":
        if n < 5:
            raise ValueError("a t-SNE map needs at least 5 points")
        perplexity = min(30.0, (n - 1) / 3.0)
        tsne = TSNE(2, perplexity=perplexity, init="pca", random_state=seed)
        return tsne.fit_transform(points)
    raise ValueError(f"unknown projection {projection!r}; choose one of {PROJECTIONS}")


#: Where a word's label may go around its marker, in order of preference.
LABEL_POSITIONS = ("top center", "bottom center", "middle right", "middle left")
#: Label box size in the map's unit square: height, and width per character, at the 10-px
#: font on the ~330 x 300 px plot area the map gets in half the app's width.
LABEL_H, CHAR_W = 0.05, 0.018
MARKER_R = 0.025  # a marker's radius in the unit square
MARGIN = 0.04  # how far past the points' range a label may reach (plotly pads its axes)


def _label_box(x: float, y: float, text: str, position: str) -> tuple[float, ...]:
    w, h = CHAR_W * len(text) + 0.01, LABEL_H
    offset = MARKER_R + 0.005
    if position == "middle center":  # a number inside its marker: the marker's box
        return x - MARKER_R, y - MARKER_R, x + MARKER_R, y + MARKER_R
    if position == "top center":
        return x - w / 2, y + offset, x + w / 2, y + offset + h
    if position == "bottom center":
        return x - w / 2, y - offset - h, x + w / 2, y - offset
    if position == "middle right":
        return x + offset, y - h / 2, x + offset + w, y + h / 2
    return x - offset - w, y - h / 2, x - offset, y + h / 2


def _overlaps(a: Sequence[float], b: Sequence[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def place_labels(
    points: np.ndarray,
    texts: Sequence[str],
    obstacles: np.ndarray | None = None,
    positions: Sequence[str] = LABEL_POSITIONS,
) -> list[str | None]:
    """A text position (the first of ``positions`` that fits) per point such that no two
    label boxes overlap, no label covers an obstacle point (e.g. an anchor marker) and none
    leaves the plot, or ``None`` where every position collides (that label is left to the
    hover). Points are placed greedily in order, on the map rescaled to the unit square."""
    every = points if obstacles is None or not len(obstacles) else np.vstack([points, obstacles])
    lo, span = every.min(0), np.ptp(every, 0)
    span = np.where(span > 0, span, 1.0)
    unit = (points - lo) / span
    blocked = [] if obstacles is None else [
        (x - MARKER_R, y - MARKER_R, x + MARKER_R, y + MARKER_R) for x, y in (obstacles - lo) / span
    ]
    placed: list[tuple[float, ...]] = []
    out: list[str | None] = []
    for (x, y), text in zip(unit, texts, strict=True):
        for position in positions:
            box = _label_box(float(x), float(y), text, position)
            inside = box[0] >= -MARGIN and box[2] <= 1 + MARGIN and box[1] >= -MARGIN \
                and box[3] <= 1 + MARGIN
            if inside and not any(_overlaps(box, other) for other in (*placed, *blocked)):
                placed.append(box)
                out.append(position)
                break
        else:
            out.append(None)
    return out


def embedding_scatter(
    anchor_xy: np.ndarray,
    word_xy: np.ndarray,
    anchor_hover: Sequence[str],
    words: Sequence[str],
    projection: str,
) -> go.Figure:
    """Plotly scatter of anchors (numbered circles) and words (labelled diamonds) on one
    2-D map; hovering an anchor shows its top words, hovering a word names it. Word labels
    are placed around their marker so none overlaps another or an anchor
    (:func:`place_labels`); the few that fit nowhere are shown on hover only."""
    words = [drawable(w) for w in words]
    numbers = [str(k) for k in range(len(anchor_xy))]
    inside = place_labels(np.asarray(anchor_xy), numbers, positions=("middle center",))
    markers = np.vstack([np.asarray(anchor_xy), np.asarray(word_xy)])
    around = place_labels(np.asarray(word_xy), words, markers)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=anchor_xy[:, 0], y=anchor_xy[:, 1], mode="markers+text", name="anchors",
            text=[k if where else "" for k, where in zip(numbers, inside, strict=True)],
            textposition="middle center",
            textfont={"size": 8, "color": "white"},
            marker={"size": 16, "color": "#3b4cc0", "line": {"width": 1, "color": "white"}},
            hovertext=list(anchor_hover), hoverinfo="text",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=word_xy[:, 0], y=word_xy[:, 1], mode="markers+text", name="words",
            text=[w if where else "" for w, where in zip(words, around, strict=True)],
            textposition=[where or "top center" for where in around], textfont={"size": 10},
            marker={"size": 9, "symbol": "diamond", "color": "#e6550d"},
            hovertext=[f"word: {w}" for w in words], hoverinfo="text",
        )
    )
    fig.update_layout(
        title=f"Anchors and words, {projection} of their concept-space embeddings",
        xaxis_title=f"{projection} 1", yaxis_title=f"{projection} 2",
        template="plotly_white", height=480, margin={"l": 40, "r": 20, "t": 50, "b": 40},
    )
    return fig
