"""The "Align" view: every method's phrase heatmap side by side, the transport plan of one
method with its marginals, the solvers' convergence and a score table.

One job a module: :mod:`~otviz.ui.align.settings` (the defaults and :class:`AlignSettings`,
the method-independent knobs), :mod:`~otviz.ui.align.choices` (the phrase and token
pickers), :mod:`~otviz.ui.align.compute` (runs, heatmaps, plans, scores from the cached
alignments), :mod:`~otviz.ui.align.drawing` (the pictures), :mod:`~otviz.ui.align.views`
(the callbacks as plain functions of plain values), :mod:`~otviz.ui.align.downloads` (the
view's files), :mod:`~otviz.ui.align.layout` (the page's components by name) and
:mod:`~otviz.ui.align.wiring` (the listeners, inputs and outputs by name).
"""

from otviz.ui.align.choices import (
    default_phrase,
    phrase_choices,
    phrase_text,
    resolve_phrase,
    shown_phrase,
    shown_words,
    span_value,
    token_choices,
    token_labels,
)
from otviz.ui.align.compute import (
    PhraseMaps,
    PlanData,
    align_runs,
    phrase_heatmaps,
    phrase_maps,
    plan_data,
    quota_note,
    score_rows,
)
from otviz.ui.align.downloads import align_downloads
from otviz.ui.align.drawing import PlanView
from otviz.ui.align.settings import (
    CAME_TEMPERATURES,
    DEFAULT_CAME_TEMPERATURE,
    DEFAULT_METHOD,
    DEFAULT_SHARED_SCALE,
    RASTER_FORMAT,
    TAB_TITLE,
    AlignSettings,
)
from otviz.ui.align.views import AlignView, align_view, phrase_view, plan_view, scores_view
from otviz.ui.align.wiring import AlignLink, build_align_tab

__all__ = [
    "CAME_TEMPERATURES",
    "DEFAULT_CAME_TEMPERATURE",
    "DEFAULT_METHOD",
    "DEFAULT_SHARED_SCALE",
    "RASTER_FORMAT",
    "TAB_TITLE",
    "AlignLink",
    "AlignSettings",
    "AlignView",
    "PhraseMaps",
    "PlanData",
    "PlanView",
    "align_downloads",
    "align_runs",
    "align_view",
    "build_align_tab",
    "default_phrase",
    "phrase_choices",
    "phrase_heatmaps",
    "phrase_maps",
    "phrase_text",
    "phrase_view",
    "plan_data",
    "plan_view",
    "quota_note",
    "resolve_phrase",
    "shown_phrase",
    "shown_words",
    "span_value",
    "score_rows",
    "scores_view",
    "token_choices",
    "token_labels",
]
