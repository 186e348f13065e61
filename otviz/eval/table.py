"""A result table of the evaluation runner: named columns with a display format, rows as
dicts, notes; rendered to Markdown (the papers' layout: percentages with one decimal) and
to JSON (raw values, fractions in [0, 1])."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

Format = Literal["text", "pct", "num", "int", "ms"]


@dataclass(frozen=True)
class Column:
    """``key`` of the row dicts, ``label`` in the header, ``fmt``: ``"pct"`` (a fraction
    shown as a percentage, one decimal), ``"num"`` (three decimals), ``"ms"`` (two),
    ``"int"`` (thousands separated) or ``"text"``; ``setting``: the value is a setting of
    the row (an ablation's λ_l), not a measurement, so it is never averaged over seeds."""

    key: str
    label: str
    fmt: Format = "pct"
    setting: bool = False


@dataclass
class Table:
    """One table: ``key`` (file and JSON name), ``title``, columns, rows, notes."""

    key: str
    title: str
    columns: list[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def column(self, key: str) -> list[Any]:
        """The values of one column, in row order."""
        return [row.get(key) for row in self.rows]

    def markdown(self) -> str:
        """The table as GitHub Markdown: title, header, rows, then the notes."""
        head = "| " + " | ".join(c.label for c in self.columns) + " |"
        rule = "|" + "|".join("---" if c.fmt == "text" else "---:" for c in self.columns) + "|"
        lines = [f"**{self.title}**", "", head, rule]
        for row in self.rows:
            cells = [format_cell(row, c) for c in self.columns]
            lines.append("| " + " | ".join(cells) + " |")
        lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines).rstrip() + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "columns": [{"key": c.key, "label": c.label, "format": c.fmt} for c in self.columns],
            "rows": self.rows,
            "notes": self.notes,
        }


def format_cell(row: dict[str, Any], column: Column) -> str:
    """A row's cell: the value, then ``[low, high]`` when the row has an interval
    ``<key>_ci`` (tables over seeds, :mod:`otviz.eval.seeds`)."""
    text = format_value(row.get(column.key), column.fmt)
    ci = row.get(f"{column.key}_ci")
    if ci is None:
        return text
    low, high = (format_value(v, column.fmt) if math.isfinite(v) else ("-∞" if v < 0 else "∞")
                 for v in ci)
    return f"{text} [{low}, {high}]"


def format_value(value: Any, fmt: Format) -> str:
    """One cell: ``-`` for a missing or NaN value, else the column's format."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt == "pct":
        return f"{100.0 * float(value):.1f}"
    if fmt == "num":
        return f"{float(value):.3f}"
    if fmt == "ms":
        return f"{float(value):.2f}"
    if fmt == "int":
        return f"{int(value):,}"
    return str(value)
