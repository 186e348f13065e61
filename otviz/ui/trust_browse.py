"""Browse by trust: the rows passing Browse's filters sorted by a trust metric (Quantus,
:mod:`otviz.eval.trust`) of Method A's map, best first, optionally keeping the better or the
worse half. A metric is computed for every row of the loaded table the first time it is
picked (one Quantus call over all rows: seconds to a minute on 2 cores), then kept."""

from __future__ import annotations

import threading
from collections.abc import Callable

import gradio as gr
import torch
from torch import Tensor

from otviz.eval.browse import BrowseTable
from otviz.eval.trust.browse import browse_trust_values
from otviz.eval.trust.metrics import METRICS
from otviz.explain import InputError
from otviz.suite import MethodSuite

NO_METRIC = "no trust metric"
ALL, BETTER, WORSE = "all rows", "better half", "worse half"
KEEP = (ALL, BETTER, WORSE)
#: metric label (with its direction) -> key, in the order of the trust table.
METRIC_CHOICES = {f"{m.label} {'↑' if m.higher else '↓'}": m.key for m in METRICS}


class TrustValues:
    """Computed per-row metric values by (table, map, metric); a table is known by its
    identity, and only the tables still loaded are kept."""

    def __init__(self) -> None:
        self._values: dict[tuple[int, str, str], tuple[BrowseTable, Tensor]] = {}
        self._lock = threading.Lock()

    def get(self, suite: MethodSuite, table: BrowseTable, name: str, metric: str) -> Tensor:
        key = (id(table), name, metric)
        with self._lock:
            hit = self._values.get(key)
        if hit is not None and hit[0] is table:
            return hit[1]
        values = browse_trust_values(suite, table, name, metric)
        with self._lock:
            self._values = {k: v for k, v in self._values.items() if k[0] != id(table)
                            or v[0] is table}
            self._values[key] = (table, values)
        return values


def trust_order(values: Tensor, higher: bool, keep: str = ALL) -> Callable[[Tensor], Tensor]:
    """``rows -> rows`` sorted by ``values`` (best first; rows without a value last), with
    ``keep`` the better or worse half (by the median of the rows with a value)."""
    if keep not in KEEP:
        raise InputError(f"unknown choice {keep!r}; choose one of {list(KEEP)}")

    def reorder(rows: Tensor) -> Tensor:
        v = values[rows]
        finite = torch.isfinite(v)
        if keep != ALL and bool(finite.any()):
            median = v[finite].quantile(0.5)
            better = (v >= median) if higher else (v <= median)
            chosen = finite & (better if keep == BETTER else ~better)
            rows, v, finite = rows[chosen], v[chosen], finite[chosen]
        score = torch.where(finite, v if higher else -v, torch.full_like(v, -torch.inf))
        return rows[torch.argsort(score, descending=True, stable=True)]

    return reorder


def trust_reorder(cache: TrustValues, suite: MethodSuite, table: BrowseTable, name: str,
                  metric: str | None, keep: str | None) -> Callable[[Tensor], Tensor] | None:
    """The reordering of Browse's rows for the picked metric (``None``: none picked)."""
    if not metric or metric == NO_METRIC:
        return None
    if metric not in METRIC_CHOICES:
        raise InputError(f"unknown trust metric {metric!r}")
    key = METRIC_CHOICES[metric]
    higher = next(m.higher for m in METRICS if m.key == key)
    return trust_order(cache.get(suite, table, name, key), higher, keep or ALL)


def trust_controls() -> tuple[gr.Dropdown, gr.Dropdown]:
    """The view's two controls: the metric (of Method A's map) to sort by, and which rows to
    keep."""
    metric = gr.Dropdown([NO_METRIC, *METRIC_CHOICES], value=NO_METRIC, scale=1,
                         label="Sort by trust metric of Method A (computed on first pick)",
                         elem_id="browse-trust-metric")
    keep = gr.Dropdown(list(KEEP), value=ALL, label="Keep (by that metric)", scale=1,
                       elem_id="browse-trust-keep")
    return metric, keep
