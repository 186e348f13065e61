"""Scene layout: non-overlapping placement of square boxes, and the spatial relations.

Relations are judged on boxes, strictly: ``a`` is ``left_of`` ``b`` when ``a`` ends before
``b`` starts horizontally (``a.x1 <= b.x0``), ``above`` when ``a.y1 <= b.y0``, and the
converses likewise. Two non-overlapping boxes are always separated along at least one axis,
so every pair of objects stands in at least one relation; a diagonal pair stands in two.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from otviz.world.types import Box

_TRIES = 32


def boxes_overlap(a: Box, b: Box, margin: int = 0) -> bool:
    """Whether ``a`` and ``b`` come closer than ``margin`` pixels along both axes."""
    return (
        a[0] < b[2] + margin and b[0] < a[2] + margin
        and a[1] < b[3] + margin and b[1] < a[3] + margin
    )


def relation_holds(relation: str, a: Box, b: Box) -> bool:
    """Whether box ``a`` stands in ``relation`` to box ``b``."""
    if relation == "left_of":
        return a[2] <= b[0]
    if relation == "right_of":
        return b[2] <= a[0]
    if relation == "above":
        return a[3] <= b[1]
    if relation == "below":
        return b[3] <= a[1]
    raise ValueError(f"unknown relation {relation!r}")


def salient_relation(a: Box, b: Box) -> str:
    """The relation of ``a`` to ``b`` along the axis with the wider gap (what a person
    would say first of a diagonal pair)."""
    gaps = {
        "left_of": b[0] - a[2],
        "right_of": a[0] - b[2],
        "above": b[1] - a[3],
        "below": a[1] - b[3],
    }
    return max(gaps, key=gaps.__getitem__)


def place_boxes(
    sides: Sequence[int], rng: np.random.Generator, size: int, margin: int
) -> list[Box]:
    """Square boxes of the given sides inside a ``size x size`` image, pairwise at least
    ``margin`` apart and ``margin`` from the border. Rejection sampling, largest box first;
    if a box does not fit, all boxes are laid out in random cells of a 2x2 grid instead
    (this always fits up to four boxes, as :class:`WorldConfig` checks)."""
    boxes: dict[int, Box] = {}
    for k in sorted(range(len(sides)), key=lambda k: -sides[k]):
        side = sides[k]
        # one draw of 2 x _TRIES fills the x row, then the y row: the stream of two draws
        tries = rng.integers(margin, size - margin - side + 1, 2 * _TRIES).tolist()
        for x, y in zip(tries[:_TRIES], tries[_TRIES:], strict=True):
            box = (x, y, x + side, y + side)
            if not any(boxes_overlap(box, other, margin) for other in boxes.values()):
                boxes[k] = box
                break
        else:
            return _grid_layout(sides, rng, size, margin)
    return [boxes[k] for k in range(len(sides))]


def _grid_layout(
    sides: Sequence[int], rng: np.random.Generator, size: int, margin: int
) -> list[Box]:
    half = size // 2
    cells = rng.permutation(4)[: len(sides)]
    boxes = []
    for cell, side in zip(cells.tolist(), sides, strict=True):
        cx, cy = (cell % 2) * half, (cell // 2) * half
        x = cx + int(rng.integers(margin, half - side - margin + 1))
        y = cy + int(rng.integers(margin, half - side - margin + 1))
        boxes.append((x, y, x + side, y + side))
    return boxes
