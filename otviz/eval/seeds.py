"""Results over seeds: mean and 95 % interval per table cell, and claims "A beats B" judged
from the interval of their paired difference.

The interval is across seeds (each seed a full repetition: the seed of the head training,
where the heads were trained per seed, and of the world test draw), Student-t:
``mean +- t_{0.975, n-1} s / sqrt(n)`` with ``s`` the sample standard deviation of the ``n``
per-seed values. It is not a bootstrap over test items: the per-seed values already
average over the test items, and the seeds carry both sources of variation. With fewer
than two seeds the interval is unbounded (nothing can be claimed).

A claim "A beats B on metric m" pairs the two by seed (same test draw, same training seed)
and looks at the interval of ``m_A - m_B``: it **holds** when the interval lies above 0,
**does not hold** when it lies below 0, and is **inconclusive** when it contains 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from otviz.eval.table import Column, Table

LEVEL = 0.95
HOLDS, DOES_NOT_HOLD, INCONCLUSIVE = "holds", "does not hold", "inconclusive"
MEASURED_FORMATS = ("pct", "num", "ms")
#: Row keys that identify a row across seeds, in order of preference (else its text cells).
ROW_KEYS = ("name", "variant")


@dataclass(frozen=True)
class Interval:
    """Mean of ``n`` per-seed values and its two-sided ``LEVEL`` interval."""

    mean: float
    low: float
    high: float
    n: int


def seed_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Student-t interval of the mean of per-seed ``values`` (module docstring)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, -math.inf, math.inf, n)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def group_bootstrap(values: np.ndarray, groups: np.ndarray, level: float = LEVEL,
                    draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile interval (two-sided ``level``) of the mean of per-item ``values`` over
    ``draws`` bootstrap resamples of whole ``groups`` (e.g. images: the phrases of one image
    move together), for a paired per-item comparison within one run."""
    rng = np.random.default_rng(seed)
    ids, inverse = np.unique(groups, return_inverse=True)
    sums = np.bincount(inverse, weights=values, minlength=len(ids))
    counts = np.bincount(inverse, minlength=len(ids))
    pick = rng.integers(0, len(ids), (draws, len(ids)))
    means = sums[pick].sum(1) / counts[pick].sum(1)
    tail = 100 * (1 - level) / 2
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def judge(difference: Interval) -> str:
    """The verdict on "A beats B" from the interval of the paired difference A - B."""
    if difference.low > 0:
        return HOLDS
    if difference.high < 0:
        return DOES_NOT_HOLD
    return INCONCLUSIVE


def beats(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> tuple[str, Interval]:
    """``(verdict, interval of a - b)`` for per-seed values ``a`` and ``b`` of one metric,
    paired by position (seed)."""
    if len(a) != len(b):
        raise ValueError(f"paired values need the same seeds, got {len(a)} and {len(b)}")
    diff = seed_interval([x - y for x, y in zip(a, b, strict=True)], level)
    return judge(diff), diff


def _row_id(row: dict) -> str:
    for key in ROW_KEYS:
        if key in row:
            return str(row[key])
    return " / ".join(v for v in row.values() if isinstance(v, str))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
        float(value))


def per_seed_values(runs: Sequence[Table], row: str, key: str) -> list[float]:
    """The values of column ``key`` in row ``row`` of one table over seeds (one table per
    seed)."""
    out = []
    for table in runs:
        match = [r for r in table.rows if _row_id(r) == row]
        if not match or not _is_number(match[0].get(key)):
            raise KeyError(f"row {row!r} has no number {key!r} in every seed")
        out.append(float(match[0][key]))
    return out


#: What a seed draws in the comparison's tables (the intervals' note).
SEEDED = "the head training where heads were trained per seed, and of the test draw"


def aggregate(runs: Sequence[Table], level: float = LEVEL, seeded: str = SEEDED) -> Table:
    """One table over seeds (``runs``: the same table per seed): each measured cell (a
    column of format pct / num / ms that is not a setting) becomes the mean, with
    ``<key>_ci = [low, high]`` and ``<key>_seeds`` (the per-seed values); Markdown shows
    ``mean [low, high]``; ``seeded`` says in the notes what a seed draws."""
    first = runs[0]
    table = Table(first.key, f"{first.title}; mean [{level:.0%} interval] over "
                  f"{len(runs)} seeds", list(first.columns), notes=_merged_notes(runs))
    measured = [c.key for c in first.columns if c.fmt in MEASURED_FORMATS and not c.setting]
    for row in first.rows:
        rid = _row_id(row)
        out = dict(row)
        for key in measured:
            if not _is_number(row.get(key)):
                continue
            try:
                values = per_seed_values(runs, rid, key)
            except KeyError:
                continue
            iv = seed_interval(values, level)
            out[key], out[f"{key}_ci"], out[f"{key}_seeds"] = iv.mean, [iv.low, iv.high], values
        table.rows.append(out)
    table.notes.append(f"intervals: Student-t over {len(runs)} seeds (seed of {seeded})")
    return table


def _merged_notes(runs: Sequence[Table]) -> list[str]:
    """The notes of the per-seed tables: a note every seed shares once; one that differs
    (the heads a seed used, a count) once with its differing words as ``a / b / c`` in seed
    order, or, where the seeds' notes differ in more than a few words, as its per-seed
    values."""
    out = []
    for k, note in enumerate(runs[0].notes):
        values = [t.notes[k] if k < len(t.notes) else "" for t in runs]
        out.append(note if len(set(values)) == 1 else _merged_note(values))
    return out


def _merged_note(values: Sequence[str]) -> str:
    """One note from its per-seed versions: word by word where they differ in at most a
    quarter of their words (at least one), else ``per seed: v0; v1; ...``."""
    tokens = [re.split(r"(\s+|[;,:()])", v) for v in values]
    if len({len(t) for t in tokens}) == 1:
        columns = list(zip(*tokens, strict=True))
        differing = sum(len(set(c)) > 1 for c in columns)
        if differing <= max(1, sum(bool(c[0].strip()) for c in columns) // 4):
            return "".join(c[0] if len(set(c)) == 1 else " / ".join(c) for c in columns)
    return "per seed: " + "; ".join(values)


CLAIM_COLUMNS = [
    Column("claim", "Claim", "text"), Column("diff", "Mean difference", "num"),
    Column("low", "Low", "num"), Column("high", "High", "num"),
    Column("verdict", "Verdict", "text"),
]


def claims_table(
    runs: dict[str, Sequence[Table]],
    claims: Sequence[tuple[str, str, str, str]],
    level: float = LEVEL,
    key: str = "claims",
    question: str = "",
) -> Table:
    """Verdicts on claims ``(table key, metric, A, B)`` = "A beats B on metric" from the
    per-seed tables ``runs[table key]`` (rows named as in :data:`ROW_KEYS`); the table's
    ``key``, and a ``question`` it answers ahead of its title."""
    title = f"Claims over seeds (paired difference, {level:.0%} interval)"
    table = Table(key, f"{question} {title}".strip(), CLAIM_COLUMNS)
    for source, metric, a, b in claims:
        verdict, diff = beats(per_seed_values(runs[source], a, metric),
                              per_seed_values(runs[source], b, metric), level)
        table.rows.append({"claim": f"{a} beats {b} on {source} {metric}", "table": source,
                           "metric": metric, "a": a, "b": b, "diff": diff.mean,
                           "low": diff.low, "high": diff.high, "verdict": verdict,
                           "n_seeds": diff.n})
    table.notes.append("holds: the interval of A - B lies above 0; does not hold: below 0; "
                       "inconclusive: it contains 0")
    return table


def best_vs_runner_up(runs: dict[str, Sequence[Table]],
                      metrics: Sequence[tuple[str, str]]) -> list[tuple[str, str, str, str]]:
    """The claims "the best mean row beats the second best" for ``metrics`` ``(table key,
    metric)``, the form of every "best ..." claim."""
    claims = []
    for key, metric in metrics:
        if key not in runs:
            continue
        ids = [_row_id(r) for r in runs[key][0].rows if _is_number(r.get(metric))]
        means = {}
        for rid in ids:
            try:
                values = per_seed_values(runs[key], rid, metric)
            except KeyError:
                continue
            means[rid] = sum(values) / len(values)
        ranked = sorted(means, key=means.get, reverse=True)
        if len(ranked) >= 2:
            claims.append((key, metric, ranked[0], ranked[1]))
    return claims
