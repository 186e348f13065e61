"""The grid and settings of a benchmark run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BenchConfig:
    """Grid and settings of one benchmark run (defaults: the full grid)."""

    ns: tuple[int, ...] = (64, 196, 576, 1024, 4096)
    ms: tuple[int, ...] = (16, 48, 77)
    ranks: tuple[int, ...] = (16, 32, 64)
    n_iters: int = 5
    dim: int = 256
    pairs: int = 512
    backward_pairs: int = 64  # forward+backward grid rows (per-pair figures; saves time)
    repeats: int = 3
    max_elems: int = 2**25
    threads: int = 2
    pot_pairs: int = 128
    pot: bool = True
    backward: bool = True
    train_step: bool = True
    shared: bool = True  # forward rows on layouts that repeat images / captions
    methods: tuple[str, ...] | None = None  # None: every registered method
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def quick_config() -> BenchConfig:
    """A grid small enough for a shared 2-core CPU that still holds the bar sizes."""
    return BenchConfig(ns=(196, 576, 1024), ms=(48,), ranks=(32,), pot_pairs=64)
