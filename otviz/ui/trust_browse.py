"""Browse by trust: the rows passing Browse's filters sorted by a trust metric (Quantus,
:mod:`otviz.eval.trust`) of Method A's map, best first, optionally keeping the better or the
worse half. A metric is computed for every row of the loaded table the first time it is
picked (Quantus calls over chunks of the rows, so its memory is a chunk's whatever the
number of rows: :mod:`otviz.eval.trust.browse`; seconds to minutes on 2 cores), then kept."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import gradio as gr
import pandas as pd
import torch
from torch import Tensor

from otviz.eval.browse import BrowseTable
from otviz.eval.trust.browse import browse_trust_values
from otviz.eval.trust.metrics import METRIC_BY_KEY, TABLE_METRICS
from otviz.explain import InputError
from otviz.suite import MethodSuite
from otviz.ui.budget import ComputeBudget, visitor
from otviz.ui.shutdown import refuse_if_stopping
from otviz.viz.tables import POINTING_INFO, metric_label

NO_METRIC = "no trust metric"
ALL, BETTER, WORSE = "all rows", "better half", "worse half"
KEEP = (ALL, BETTER, WORSE)
#: Why a localisation metric's column is blank on an uploaded folder (as the Trust panel
#: says of an upload).
NO_BOXES = ("no {metric} values: localisation metrics need each phrase's gold box, which "
            "only the world splits carry; an uploaded folder is sorted by the model-based "
            "metrics only (faithfulness, randomisation, robustness, complexity)")
#: What replaces the trust controls where Quantus is not installed.
UNAVAILABLE = ("*Trust metrics are not offered on this server: they need Quantus, which its "
               "install lacks (docs/trust.md).*")
#: What replaces them where Quantus is installed but OpenCV (which it imports) fails to load.
NO_CV2 = ("*Trust metrics are not offered on this server: Quantus is installed but OpenCV, "
          "which it imports, does not load ({why}); docs/trust.md, \"Installing Quantus\".*")
#: metric label (with its direction; the pointing conventions named,
#: :func:`~otviz.viz.tables.metric_label`) -> key, in the order of the trust table.
METRIC_CHOICES = {f"{metric_label(m.key, m.label)} {'↑' if m.higher else '↓'}": m.key
                  for m in TABLE_METRICS}


class TrustValues:
    """Computed per-row metric values by (table, map, metric); a table is known by its
    identity, and only the tables still loaded are kept. With a ``budget``, a computation
    is admitted by it first (the table's rows times the metric's measured cost per map)."""

    def __init__(self, budget: ComputeBudget | None = None) -> None:
        self.budget = budget
        self._values: dict[tuple[int, str, str],
                           tuple[BrowseTable, Tensor, dict[int, str]]] = {}
        self._lock = threading.Lock()

    def get(self, suite: MethodSuite, table: BrowseTable, name: str,
            metric: str) -> tuple[Tensor, dict[int, str]]:
        """``(values, reasons)``: the metric per row, and row -> why its value is NaN."""
        key = (id(table), name, metric)
        with self._lock:
            hit = self._values.get(key)
        if hit is not None and hit[0] is table:
            return hit[1], hit[2]
        free = METRIC_BY_KEY[metric].needs_boxes and table.gold is None  # all NaN, no work
        admitted = contextlib.nullcontext()
        if self.budget is not None and not free:
            cost = self.budget.costs.trust(len(table.items), [metric])
            admitted = self.budget.admit(visitor(), "sorting by a trust metric", cost)
        with admitted:
            start = time.perf_counter()
            reasons: dict[int, str] = {}
            values = browse_trust_values(  # a server stop ends it before its next chunk
                suite, table, name, metric, reasons=reasons,
                before_chunk=functools.partial(refuse_if_stopping, "the trust sort"))
        if self.budget is not None and not free and len(table.items):
            self.budget.costs.record_trust(
                {metric: 1000 * (time.perf_counter() - start)}, len(table.items))
        with self._lock:
            self._values = {k: v for k, v in self._values.items() if k[0] != id(table)
                            or v[0] is table}
            self._values[key] = (table, values, reasons)
        return values, reasons


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


@dataclass
class TrustSort:
    """Browse's rows by a trust metric: the picked metric's label, its value per query, the
    reordering of the rows and, per query without a value, why."""

    label: str
    values: Tensor
    reorder: Callable[[Tensor], Tensor]
    note: str | None = None  # why the metric's column is blank, when it is
    reasons: dict[int, str] = field(default_factory=dict)

    def annotate(self, frame: pd.DataFrame, rows: list[int]) -> pd.DataFrame:
        """The page's table with the metric's value of each row as a last column; a row
        without one reads ``"— "`` and its reason, as Browse's other blank cells read ``"—"``
        (the column's ``note`` stands for all of them when the whole column is blank)."""
        frame = frame.copy()
        if len(frame) == len(rows):
            frame[f"A: {self.label}"] = [self._cell(q) for q in rows]
        return frame

    def _cell(self, q: int) -> float | str:
        value = float(self.values[q])
        if value == value:  # not NaN
            return round(value, 3)
        return "—" if self.note or q not in self.reasons else f"— {self.reasons[q]}"


def trust_sort(cache: TrustValues, suite: MethodSuite, table: BrowseTable, name: str,
               metric: str | None, keep: str | None) -> TrustSort | None:
    """Browse's rows sorted by the picked metric of map ``name`` (``None``: none picked)."""
    if not metric or metric == NO_METRIC:
        return None
    if metric not in METRIC_CHOICES:
        raise InputError(f"unknown trust metric {metric!r}")
    key = METRIC_CHOICES[metric]
    higher = METRIC_BY_KEY[key].higher
    values, reasons = cache.get(suite, table, name, key)
    note = None
    if METRIC_BY_KEY[key].needs_boxes and table.gold is None:
        note = NO_BOXES.format(metric=metric)
    return TrustSort(metric, values, trust_order(values, higher, keep or ALL), note, reasons)


def trust_unavailable() -> str | None:
    """Why this server offers no trust metrics (one line for the page), or ``None``: Quantus
    is not installed (:data:`UNAVAILABLE`), or it is but its ``cv2`` does not load here
    (:data:`NO_CV2`: e.g. the full ``opencv-python`` wheel Quantus requires, without the
    system's libGL; docs/trust.md). Quantus itself is not imported here (~3 s at start)."""
    if importlib.util.find_spec("quantus") is None:
        return UNAVAILABLE
    try:
        import cv2  # noqa: F401  (Quantus' perturbations import it)
    except ImportError as e:
        return NO_CV2.format(why=str(e).splitlines()[0] if str(e) else type(e).__name__)
    return None


def trust_controls() -> tuple[gr.Dropdown, gr.Dropdown]:
    """The view's two controls: the metric (of Method A's map) to sort by, and which rows to
    keep; hidden where the server has no trust metrics (:func:`trust_unavailable`), whose
    reason then takes their place."""
    shown = trust_unavailable() is None
    metric = gr.Dropdown([NO_METRIC, *METRIC_CHOICES], value=NO_METRIC, scale=1,
                         label="Sort by trust metric of Method A (computed on first pick)",
                         info=POINTING_INFO.replace("*", ""),
                         elem_id="browse-trust-metric", visible=shown)
    keep = gr.Dropdown(list(KEEP), value=ALL, label="Keep (by that metric)", scale=1,
                       elem_id="browse-trust-keep", visible=shown)
    if not shown:
        gr.Markdown(trust_unavailable(), elem_id="browse-trust-unavailable")
    return metric, keep
