"""Score tables: one row per method with its global, local and combined scores, the solver's
convergence, its wall time and where its heads came from; and what every shown table's title
and pointing columns say: the reading it was computed on
(:func:`~otviz.eval.segmentation.reading`, as ``otviz eval`` titles its tables) and which
pointing-game convention each pointing column scores."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import pandas as pd

from otviz.backbone import Backbone
from otviz.eval.grounding_metrics import TOLERANCE_PX
from otviz.eval.segmentation import reading

#: The short labels of the pointing game's two conventions, by the key the eval code scores
#: them under (:mod:`otviz.eval.grounding_metrics`): ``pointing`` a strict hit, the peak
#: inside a gold box; ``pointing_tol`` the peak within :data:`TOLERANCE_PX` source pixels of
#: one.
POINTING_LABELS: dict[str, str] = {
    "pointing": "Pointing (strict)",
    "pointing_tol": f"Pointing (±{TOLERANCE_PX:g} px)",
}
#: The info line beside every table or figure that shows the two conventions.
POINTING_INFO = (
    "*Pointing (strict)*: the map's peak inside the phrase's gold box, as "
    "what-is-where-by-looking and Chefer et al. score it (their Flickr30k Entities anchors, "
    "CLIP ViT-B/32: WWbL 75.63, centre prior 47.40, random point 27.24); "
    f"*Pointing (±{TOLERANCE_PX:g} px)*: the peak inside the box grown by {TOLERANCE_PX:g} "
    "source pixels on every side. Both read the same peak with the same tie rule "
    "(docs/trust.md).")


def metric_label(key: str, label: str) -> str:
    """The label a metric ``key`` is shown under: a pointing convention's short label
    (:data:`POINTING_LABELS`), else its own ``label``."""
    return POINTING_LABELS.get(key, label)


def titled(title: str, backbone: Backbone) -> str:
    """``title`` naming the reading it was computed on, as ``otviz eval``'s tables do."""
    return f"{title} ({reading(backbone)})"

SCORE_COLUMNS: dict[str, str] = {
    "label": "method",
    "global_score": "global s_g",
    "local_score": "local s_l",
    "combined": "combined s_g + λ·s_l",
    "marginal_error": "marginal error",
    "negative_mass": "negative mass",
    "ms": "ms",
    "source": "heads",
}


@dataclass
class ScoreRow:
    """One method's scores for one (image, caption) pair.

    ``combined = global_score + lambda_local * local_score`` (ConceptOT App. G.4);
    ``marginal_error`` is ``None`` for methods without an OT solver; ``negative_mass`` is the
    total of the plan's negative entries (nonzero only for a signed plan, e.g. ConceptOT's
    faithful Nystrom plan).
    """

    name: str
    label: str
    global_score: float
    local_score: float
    lambda_local: float
    combined: float
    marginal_error: float | None
    ms: float
    source: str
    negative_mass: float = 0.0

    @classmethod
    def make(
        cls,
        name: str,
        label: str,
        global_score: float,
        local_score: float,
        lambda_local: float,
        marginal_error: float | None,
        ms: float,
        source: str,
        negative_mass: float = 0.0,
    ) -> ScoreRow:
        """A row with ``combined`` computed from the scores."""
        combined = global_score + lambda_local * local_score
        return cls(
            name,
            label,
            global_score,
            local_score,
            lambda_local,
            combined,
            marginal_error,
            ms,
            source,
            negative_mass,
        )


def score_frame(rows: Sequence[ScoreRow], digits: int = 4) -> pd.DataFrame:
    """The rows as a display table (numbers rounded to ``digits`` decimals; the marginal
    error in scientific notation, blank where there is no solver)."""
    records = []
    for row in rows:
        rec = {}
        for key, title in SCORE_COLUMNS.items():
            value = getattr(row, key)
            if key == "negative_mass":
                value = "" if value <= 0 else f"{value:.2e}"
            elif key == "marginal_error":
                value = "" if value is None or not math.isfinite(value) else f"{value:.2e}"
            elif key == "ms":
                value = round(value, 1)
            elif isinstance(value, float):
                value = round(value, digits)
            rec[title] = value
        records.append(rec)
    return pd.DataFrame.from_records(records, columns=list(SCORE_COLUMNS.values()))


def score_records(rows: Sequence[ScoreRow]) -> list[dict]:
    """The rows as plain dicts with full precision (for JSON export)."""
    return [asdict(row) for row in rows]
