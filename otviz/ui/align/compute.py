"""What the Align view computes from a pair's cached features and plans: every method's
run, the phrase's heatmaps, a plan with its marginals on the valid tokens, the score rows.
Encoding and solving happen once per (image, caption, region kind, CAME temperature):
:class:`otviz.explain.Explainer` caches the features and every method's alignment, so the
views below only read cached plans (``Alignment.heatmap``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from otviz.explain import REGION_KINDS, Encoded, Explainer, InputError, MethodRun
from otviz.methods import METHODS
from otviz.suite import (
    ALIGN_METHODS,
    METHOD_LABELS,
    SCORED_METHODS,
    MethodSuite,
    came_methods,
    with_came_temperature,
)
from otviz.ui.align.choices import phrase_text, resolve_phrase, token_labels
from otviz.ui.align.settings import CAME_TEMPERATURES, AlignSettings
from otviz.ui.explainer_panels import explainer_panels
from otviz.viz.mass import negative_mass
from otviz.viz.phrase_grid import grid_layout
from otviz.viz.tables import ScoreRow


def align_runs(
    explainer: Explainer,
    suite: MethodSuite,
    encoded: Encoded,
    regions: str = "grid",
    came_temperature: float | None = None,
    compute: bool = True,
) -> dict[str, MethodRun]:
    """Every scored method's (cached) run on the pair (``compute=False``: cached runs only,
    see :meth:`Explainer.align`). Only the methods that read regions
    (``uses_regions``: PowerCLIP) get ``regions``, the others always run on ``"grid"``, so a
    region-kind change re-solves those alone; the methods with CAME quotas (``uses_came``:
    QC-Align) run at ``came_temperature`` (``None``: their own), so a temperature change
    re-solves those alone."""
    if regions not in REGION_KINDS:
        raise InputError(f"unknown region kind {regions!r}; choose one of {REGION_KINDS}")
    missing = [n for n in ALIGN_METHODS if n not in suite.methods]
    if missing:
        raise InputError(f"the checkpoint has no {', '.join(missing)}")
    tuned = suite if came_temperature is None else _tuned_suite(suite, came_temperature)
    runs: dict[str, MethodRun] = {}
    for name in SCORED_METHODS:
        if name in suite.methods:
            method = suite.methods[name].method
            runs |= explainer.align(encoded, tuned if method.uses_came else suite, [name],
                                    regions if method.uses_regions else "grid", compute)
    return runs


def _tuned_suite(suite: MethodSuite, came_temperature: float) -> MethodSuite:
    low, high = CAME_TEMPERATURES
    if not low <= float(came_temperature) <= high:
        raise InputError(f"the CAME temperature must be between {low} and {high}")
    return with_came_temperature(suite, float(came_temperature))


def quota_note(
    runs: dict[str, MethodRun], suite: MethodSuite, came_temperature: float | None = None
) -> str:
    """The CAME quotas' non-uniformity (the run's ``quota_max_over_uniform``) of each method
    with CAME (QC-Align) at the temperature it ran with (``None``: its own), and the one its
    head was trained at."""
    notes = []
    for name in came_methods(suite):
        ratio = float(runs[name].alignment.extras["quota_max_over_uniform"][0])
        own = suite.methods[name]
        used = own.method.came_temperature if came_temperature is None else came_temperature
        trained = ("training-free" if own.source == "training-free"
                   else f"head trained at T = {own.method.came_temperature:g}")
        notes.append(f"{METHOD_LABELS[name]}'s CAME quotas: max **{ratio:.2f}x** uniform at "
                     f"T = {used:g} ({trained})")
    return "\n\n".join(notes)


def phrase_heatmaps(
    runs: dict[str, MethodRun], encoded: Encoded, words: list[int]
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """``[gh, gw]`` heatmap of the phrase per method, each method's ``shown_patch_map`` of
    its tokens: the map its grounding is scored on (``Alignment.heatmap``, ConceptOT Sec.
    2.6, unless the method reads the phrase its own way), and the labels of the maps that
    are not masses (QC-Align's Π/(μν); PowerCLIP's Fig. 6 similarity where its best subset is
    empty)."""
    select = encoded.token_select(words)
    heats, readouts = {}, {}
    for n in ALIGN_METHODS:
        heat, label = METHODS[n].shown_patch_map(runs[n].alignment, select)
        heats[n] = heat[0].reshape(encoded.grid).numpy()
        if label:
            readouts[n] = label
    return heats, readouts


@dataclass(frozen=True)
class PhraseMaps:
    """What one phrase's grid shows: each method's ``[gh, gw]`` map, the labels of the maps
    that are not masses (:func:`phrase_heatmaps`) and the phrase's words."""

    heats: dict[str, np.ndarray]
    readouts: dict[str, str]
    text: str
    explained: dict[str, np.ndarray | str] = field(default_factory=dict)

    def layout(self, encoded: Encoded, shared_scale: bool) -> dict[str, Any]:
        """The grid's drawing over the pair's image (:func:`grid_layout`), the explainers'
        panels (if any) after the methods'."""
        return grid_layout(encoded.geometry, self.heats, self.text, shared_scale,
                           self.readouts, explainer_panels(self.explained))


def phrase_maps(runs: dict[str, MethodRun], encoded: Encoded, phrase: str | None,
                explained: Callable[[str], dict[str, np.ndarray | str]] | None = None,
                ) -> PhraseMaps:
    """What the grid of ``phrase`` shows: :func:`phrase_heatmaps` of its words, its words
    and, with ``explained`` (:func:`~otviz.ui.explainer_panels.explained_by`), the
    explainers' maps of its words."""
    heats, readouts = phrase_heatmaps(runs, encoded, resolve_phrase(encoded, phrase))
    text = phrase_text(encoded, phrase)
    return PhraseMaps(heats, readouts, text, explained(text) if explained else {})


@dataclass
class PlanData:
    """One method's plan restricted to the valid tokens, with its marginals.

    Attributes:
        plan: ``[N, M]`` patches x valid tokens.
        row_marginal, row_reference: ``[N]`` kept patch mass and mu (``None``: no mu).
        col_marginal, col_reference: ``[M]`` kept token mass and nu (``None``: no nu).
        tokens, words: the text and caption word of each column.
    """

    plan: np.ndarray
    row_marginal: np.ndarray
    row_reference: np.ndarray | None
    col_marginal: np.ndarray
    col_reference: np.ndarray | None
    tokens: list[str]
    words: list[str]


#: Dense plans of the latest runs, by run identity: a low-rank plan takes tens of ms to
#: expand, and the plan view and the score table both read it on every click.
_DENSE: OrderedDict[int, tuple[MethodRun, np.ndarray]] = OrderedDict()
_DENSE_KEPT = 64
_DENSE_LOCK = threading.Lock()


def dense_plan(run: MethodRun) -> np.ndarray:
    """``[N, L]`` the run's plan as a dense array (``plan.dense()[0]``), expanded once."""
    with _DENSE_LOCK:
        hit = _DENSE.get(id(run))
        if hit is not None and hit[0] is run:
            _DENSE.move_to_end(id(run))
            return hit[1]
    dense = run.alignment.plan.dense()[0].numpy()
    with _DENSE_LOCK:
        _DENSE[id(run)] = (run, dense)
        while len(_DENSE) > _DENSE_KEPT:
            _DENSE.popitem(last=False)
    return dense


def plan_data(run: MethodRun, encoded: Encoded) -> PlanData:
    """The run's plan and marginals on the pair's valid tokens."""
    positions, texts, words = token_labels(encoded)
    a = run.alignment

    def ref(t: torch.Tensor | None, cols: bool) -> np.ndarray | None:
        return None if t is None else (t[0, positions] if cols else t[0]).numpy()

    return PlanData(
        plan=dense_plan(run)[:, positions.numpy()],
        row_marginal=a.row_marginal[0].numpy(),
        row_reference=ref(a.row_reference, False),
        col_marginal=a.col_marginal[0, positions].numpy(),
        col_reference=ref(a.col_reference, True),
        tokens=texts,
        words=words,
    )


def score_rows(runs: dict[str, MethodRun], lambda_local: float) -> list[ScoreRow]:
    """One row per scored method (Global-only first)."""
    rows = []
    for name, run in runs.items():
        a = run.alignment
        err = None if a.marginal_error is None else float(a.marginal_error[0])
        negative = negative_mass(dense_plan(run))
        label = METHOD_LABELS[name]
        if "raw_local_score" in a.extras:  # PowerCLIP: local = S / S_max, the raw S named
            label = f"{label} (raw S = {float(a.extras['raw_local_score'][0]):.3g})"
        rows.append(
            ScoreRow.make(
                name,
                label,
                float(a.global_score[0]),
                float(a.local_score[0]),
                float(lambda_local),
                err,
                run.ms,
                run.source,
                negative,
            )
        )
    return rows


def encode_and_align(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    settings: AlignSettings,
    compute: bool = True,
) -> tuple[Encoded, dict[str, MethodRun]]:
    """The pair encoded and every method's run at ``settings``' region kind and CAME
    temperature (cached; ``compute=False``: a pair not cached is a
    :class:`~otviz.explain.NotComputedError` rather than computed)."""
    encoded = explainer.encode(image, caption, compute)
    return encoded, align_runs(explainer, suite, encoded, settings.regions,
                               settings.came_temperature, compute)
