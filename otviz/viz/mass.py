"""Signed plans on screen: a transport plan's entries are masses, but ConceptOT's faithful
Nystrom plan (``K_ZP K_PP^-1 K_PY``) can hold negative entries. Views draw only the
nonnegative part as mass and say how much negative mass was left out."""

from __future__ import annotations

import numpy as np


def negative_mass(x: np.ndarray) -> float:
    """Total negative mass ``-sum min(x, 0)`` (0 for a proper plan)."""
    return float(-np.minimum(np.asarray(x, dtype=np.float64), 0.0).sum())


def displayable_mass(x: np.ndarray) -> tuple[np.ndarray, float]:
    """``(max(x, 0), negative mass)``: what a mass colour scale may show, and what it hides."""
    return np.clip(x, 0.0, None), negative_mass(x)


def negative_mass_note(negative: float) -> str:
    """A warning for titles ("" when there is no negative mass)."""
    return "" if negative <= 0 else f" ⚠ negative mass {negative:.3g} clipped"
