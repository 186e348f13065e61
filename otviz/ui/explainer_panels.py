"""The Align grid's explainer panels, behind a toggle (off by default, so the click costs
what it did without them): each explainer's map of the phrase (:mod:`otviz.explainers`:
from the image and the phrase's words alone), computed once per pair, phrase and model and
kept, drawn after the methods' panels. What each explainer computes: docs/explainers.md."""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict

import numpy as np

from otviz.backbone import Backbone
from otviz.explain import Encoded
from otviz.explainers import EXPLAINERS, explain_pairs, unavailable
from otviz.ui.budget import BudgetRefused, server_budget, visitor

TOGGLE_LABEL = "Explainers too (Grad-CAM, LeGrad, MaskCLIP, Chefer: gradients / attention, no OT)"
DEFAULT_ON = False
CACHE_SIZE = 512

#: Maps by (model, pair, phrase). The model enters as a weak reference, not ``id()``: once a
#: model is freed, a new one can get its id, and would be served the freed model's maps; a
#: dead reference equals no other, and the cache keeps no model alive.
_MAPS: OrderedDict[tuple, dict[str, np.ndarray | str]] = OrderedDict()
_LOCK = threading.Lock()


def explainer_maps(backbone: Backbone, encoded: Encoded, phrase: str,
                   who: str | None = None) -> dict[str, np.ndarray | str]:
    """Each explainer's ``[gh, gw]`` map of ``phrase`` (the phrase's words) on the pair's
    image, or, for an explainer that cannot read this backbone's tower, its "not available
    for <family> towers" note (:func:`~otviz.explainers.unavailable`) (cached). Computing
    them is admitted by the server's compute budget first, for ``who`` (default: the
    event's visitor; :class:`~otviz.ui.budget.BudgetRefused` when it is full)."""
    key = (weakref.ref(backbone.model), encoded.key, phrase)
    with _LOCK:
        hit = _MAPS.get(key)
        if hit is not None:
            _MAPS.move_to_end(key)
            return hit
    notes = {name: unavailable(backbone, name) for name in EXPLAINERS}
    todo = [name for name, note in notes.items() if note is None]
    budget = server_budget()
    maps: dict[str, np.ndarray | str] = {}
    with budget.admit(who or visitor(), "the explainer maps",
                      len(todo) * budget.costs.unit("explainer")):
        for name, note in notes.items():
            if note is not None:
                maps[name] = note
                continue
            start = time.perf_counter()
            maps[name] = explain_pairs(backbone, name, [encoded.image], [phrase]
                                       ).maps[0].reshape(encoded.grid).numpy()
            budget.costs.record("explainer", time.perf_counter() - start)
    with _LOCK:
        _MAPS[key] = maps
        while len(_MAPS) > CACHE_SIZE:
            _MAPS.popitem(last=False)
    return maps


def explainer_panels(maps: dict[str, np.ndarray | str]) -> list[tuple[str, np.ndarray | str]]:
    """``(title, map or note)`` panels of :func:`explainer_maps`, for
    :func:`otviz.viz.phrase_grid.grid_layout`'s ``extra``."""
    return [(EXPLAINERS[name].label + ("" if isinstance(m, str) else " (explainer, own scale)"),
             m) for name, m in maps.items()]


#: An explainer's panel when the compute budget refused its map: the methods' maps are
#: drawn all the same.
SKIPPED_NOTE = "not drawn: the server is busy; click Align again{when} to add it"


def skipped_note(refused: BudgetRefused) -> str:
    """The panel note of an explainer map the budget refused (with when to try again)."""
    when = "" if refused.retry_s is None else f" in about {refused.retry_s} s"
    return SKIPPED_NOTE.format(when=when)


class ExplainedBy:
    """``phrase -> explainer_maps(...)`` of one pair. When the server's compute budget
    refuses them, every explainer's panel is a note (:func:`skipped_note`) instead and
    :attr:`refused` keeps the refusal (the view says it, and keeps no such grid), so the
    methods' maps are drawn anyway; with ``fallback=False`` (a prefetch) the refusal is
    raised instead."""

    def __init__(self, backbone: Backbone, encoded: Encoded, who: str | None = None,
                 fallback: bool = True) -> None:
        self.backbone, self.encoded, self.who, self.fallback = backbone, encoded, who, fallback
        self.refused: BudgetRefused | None = None

    def __call__(self, phrase: str) -> dict[str, np.ndarray | str]:
        try:
            return explainer_maps(self.backbone, self.encoded, phrase, self.who)
        except BudgetRefused as refused:
            if not self.fallback:
                raise
            self.refused = refused
            return {name: skipped_note(refused) for name in EXPLAINERS}


def explained_by(backbone: Backbone, encoded: Encoded, on: bool, prefetch: bool = False
                 ) -> ExplainedBy | None:
    """:class:`ExplainedBy` of the pair, or ``None`` when ``on`` is off (the grid then draws
    the methods alone, as without explainers). A ``prefetch`` (the grids of phrases not
    picked yet) is admitted apart from the visitor's own clicks: it takes a server slot but
    never makes the visitor's next pick wait for it; refused, it draws nothing."""
    if not on:
        return None
    if prefetch:
        return ExplainedBy(backbone, encoded, f"{visitor()} (prefetch)", fallback=False)
    return ExplainedBy(backbone, encoded)
