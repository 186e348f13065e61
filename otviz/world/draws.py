"""Random draws with the same stream as numpy's, at less per-call cost.

Every sample is a pure function of its generator's stream, so a faster draw must consume
exactly the numbers the original call did and return the same values. These do:

* ``rng.integers(low, high, size=n)`` equals ``n`` scalar ``rng.integers(low, high)`` calls
  (each value is one bounded 32-bit draw either way), and the scalar call skips the array
  set-up (``np.prod(size)`` and friends) that dominates for a handful of values;
* ``rng.permutation(n)`` equals ``rng.shuffle`` of a list of ``n`` items (the same
  Fisher-Yates swaps from the same bounded draws), and fewer than two items draw nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def integers(rng: np.random.Generator, low: int, high: int, n: int) -> list[int]:
    """``rng.integers(low, high, size=n).tolist()``."""
    return [int(rng.integers(low, high)) for _ in range(n)]


def shuffled(items: Iterable[T], rng: np.random.Generator) -> list[T]:
    """``[items[k] for k in rng.permutation(len(items))]``."""
    out = list(items)
    if len(out) > 1:
        rng.shuffle(out)
    return out
