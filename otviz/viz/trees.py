"""Constituency trees drawn as trees (matplotlib): one labelled box per node, words at the
bottom, an optional highlighted node with its subtree (the phrase PowerCLIP aligns)."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from otviz.text.tree import Tree
from otviz.viz.style import drawable, new_figure

FONT_SIZE = 10
WORD_INCHES = 0.62  # width per caption word (its leaf box at FONT_SIZE fits)
HIGHLIGHT = "#fdae61"
SUBTREE = "#fee8c8"
PLAIN = "#f0f0f0"


@dataclass(frozen=True)
class NodePosition:
    """A node of the drawing: the tree node, its centre ``(x, y)`` and its parent's index
    in the pre-order list (-1 for the root)."""

    node: Tree
    x: float
    y: float
    parent: int


def node_text(node: Tree) -> str:
    """Box text: a phrase's label alone (its words are the leaves under it, so the boxes
    stay narrow enough to read); a leaf's label over its word."""
    if not node.is_leaf or not node.word:
        return node.label
    return f"{node.label}\n{drawable(node.word)}"


def tree_layout(tree: Tree) -> list[NodePosition]:
    """Pre-order positions: leaves on the bottom row at ``x = ``word index, every other
    node at the depth ``y = -depth`` above the mean ``x`` of its children."""
    depth_max = _height(tree)
    out: list[NodePosition] = []

    def place(node: Tree, depth: int, parent: int) -> float:
        index = len(out)
        out.append(NodePosition(node, 0.0, 0.0, parent))
        if node.is_leaf:
            x, y = float(node.start), -float(depth_max)
        else:
            xs = [place(c, depth + 1, index) for c in node.children]
            x, y = sum(xs) / len(xs), -float(depth)
        out[index] = NodePosition(node, x, y, parent)
        return x

    place(tree, 0, -1)
    return out


def _height(tree: Tree) -> int:
    return 0 if tree.is_leaf else 1 + max(_height(c) for c in tree.children)


def tree_figure(tree: Tree, highlight: Tree | None = None, title: str | None = None) -> Figure:
    """The tree with one text box per node (``len(ax.texts)`` equals the node count) and one
    line per edge; ``highlight`` (a node of ``tree``) and its subtree are coloured."""
    layout = tree_layout(tree)
    inside = _subtree(layout, highlight)
    n_cols = max(1, tree.end - tree.start)
    height = 1.0 + 0.75 * (_height(tree) + 1)
    fig = new_figure(max(4.0, WORD_INCHES * n_cols + 0.6), height)
    ax = fig.subplots()
    segments, widths, colours = [], [], []
    for i, p in enumerate(layout):
        if p.parent < 0:
            continue
        q = layout[p.parent]
        segments.append([(q.x, q.y), (p.x, p.y)])
        hot = i in inside and p.parent in inside
        widths.append(2.2 if hot else 0.9)
        colours.append("#d95f02" if hot else "#888888")
    ax.add_collection(LineCollection(segments, linewidths=widths, colors=colours, zorder=1))
    for i, p in enumerate(layout):
        face = PLAIN
        if i in inside:
            face = HIGHLIGHT if i == min(inside) else SUBTREE
        ax.text(
            p.x, p.y, node_text(p.node), ha="center", va="center", fontsize=FONT_SIZE, zorder=2,
            bbox={"boxstyle": "round,pad=0.3", "fc": face, "ec": "#555555", "lw": 0.6},
        )
    xs = [p.x for p in layout]
    ys = [p.y for p in layout]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.6)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=FONT_SIZE + 1)
    return fig


def _subtree(layout: list[NodePosition], top: Tree | None) -> set[int]:
    """Indices of the first node equal to ``top`` and of its descendants (pre-order puts
    every parent before its children, so one pass over the parent links finds them)."""
    start = next((i for i, p in enumerate(layout) if top is not None and p.node == top), None)
    if start is None:
        return set()
    inside = {start}
    for i, p in enumerate(layout[start + 1 :], start + 1):
        if p.parent in inside:
            inside.add(i)
    return inside
