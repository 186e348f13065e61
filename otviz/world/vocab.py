"""The world's closed vocabulary: shapes, colours, sizes, relations and the held-out pairs.

``HELD_OUT_PAIRS`` are the colour-shape pairs of the compositional split. They are chosen
by a fixed rule, not at random: shape ``s`` (index into ``SHAPES``) is held out in colour
``(3 s + 1) mod 8``, which pairs every shape and every colour exactly once (3 is coprime
with 8), and triangle and heart are also held out in colour ``(5 s + 4) mod 8``. That is 10
of the 64 pairs (15.6%); every shape and every colour is still seen in training in at
least six other pairings, so the split tests composition, not unseen words.
"""

from __future__ import annotations

SHAPES: tuple[str, ...] = (
    "circle", "square", "triangle", "diamond", "star", "cross", "heart", "ring",
)

COLOURS: tuple[str, ...] = (
    "red", "orange", "yellow", "green", "cyan", "blue", "purple", "white",
)

COLOUR_RGB: dict[str, tuple[int, int, int]] = {
    "red": (222, 40, 40),
    "orange": (245, 140, 25),
    "yellow": (240, 222, 40),
    "green": (40, 175, 60),
    "cyan": (40, 210, 220),
    "blue": (40, 75, 225),
    "purple": (150, 55, 195),
    "white": (248, 248, 248),
}

SIZES: tuple[str, ...] = ("small", "large")

RELATIONS: tuple[str, ...] = ("left_of", "right_of", "above", "below")

CONVERSE: dict[str, str] = {
    "left_of": "right_of", "right_of": "left_of", "above": "below", "below": "above",
}

NEGATIVE_CATEGORIES: tuple[str, ...] = (
    "replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att", "add_obj",
)

SPLITS: tuple[str, ...] = ("train", "test", "compositional", "val")


def _held_out_pairs() -> tuple[tuple[str, str], ...]:
    pairs = [(COLOURS[(3 * s + 1) % 8], SHAPES[s]) for s in range(len(SHAPES))]
    pairs += [(COLOURS[(5 * s + 4) % 8], SHAPES[s]) for s in (2, 6)]
    return tuple(sorted(pairs))


HELD_OUT_PAIRS: tuple[tuple[str, str], ...] = _held_out_pairs()
"""(colour, shape) pairs never rendered in train/test and always mentioned in compositional."""

ALL_PAIRS: tuple[tuple[str, str], ...] = tuple((c, s) for c in COLOURS for s in SHAPES)
SEEN_PAIRS: tuple[tuple[str, str], ...] = tuple(p for p in ALL_PAIRS if p not in HELD_OUT_PAIRS)
