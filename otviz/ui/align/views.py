"""The Align view's callbacks as plain functions of plain values (testable without a
browser): the Align click, and the reads of what it computed (a phrase, a method or token,
the score table) that never re-encode or re-solve."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from otviz.explain import Explainer
from otviz.suite import ALIGN_METHODS, METHOD_LABELS, MethodSuite
from otviz.ui.align.choices import phrase_choices, phrase_text, shown_phrase, token_choices
from otviz.ui.align.compute import encode_and_align, quota_note, score_rows
from otviz.ui.align.drawing import PlanView, draw_plan, phrase_grid
from otviz.ui.align.settings import DEFAULT_METHOD, DEFAULT_SETTINGS, AlignSettings
from otviz.ui.explainer_panels import explained_by
from otviz.viz.plans import convergence_figure
from otviz.viz.tables import ScoreRow, score_frame


@dataclass
class AlignView:
    """Everything one Align click shows."""

    phrase_choices: list[tuple[str, str]]
    phrase: str
    token_choices: list[tuple[str, int]]
    token: int
    grid: np.ndarray
    heats: dict[str, np.ndarray]
    plan: PlanView
    scores: pd.DataFrame
    rows: list[ScoreRow]
    convergence: go.Figure
    quota_note: str
    #: Why the explainers' panels are notes (the compute budget refused their maps), if so.
    explainers_refused: str | None = None
    #: Says when the phrase shown is not the one picked (:func:`shown_phrase`).
    phrase_note: str | None = None


def phrase_view(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    phrase: str | None,
    *,
    settings: AlignSettings = DEFAULT_SETTINGS,
    compute: bool = True,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The phrase callback: the heatmap grid and the per-method heatmaps from the cached
    features and plans (nothing is re-encoded or re-solved; with ``compute=False`` a pair
    not cached is a :class:`~otviz.explain.NotComputedError` rather than computed); with
    ``settings.explainers``, the explainers' panels too."""
    encoded, runs = encode_and_align(explainer, suite, image, caption, settings, compute)
    return phrase_grid(encoded, runs, phrase, settings.shared_scale,
                       explained_by(explainer.backbone, encoded, settings.explainers))


def plan_view(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    method: str,
    token: int | None = None,
    *,
    settings: AlignSettings = DEFAULT_SETTINGS,
    compute: bool = True,
) -> PlanView:
    """The method / token callback: plan matrix, token column map and marginals
    (``compute`` as in :func:`phrase_view`)."""
    encoded, runs = encode_and_align(explainer, suite, image, caption, settings, compute)
    return draw_plan(encoded, runs, method, token)


def scores_view(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    *,
    settings: AlignSettings = DEFAULT_SETTINGS,
) -> tuple[pd.DataFrame, list[ScoreRow]]:
    """The lambda callback: the score table at ``settings.lambda_local`` (display frame and
    full-precision rows)."""
    _, runs = encode_and_align(explainer, suite, image, caption, settings)
    rows = score_rows(runs, settings.lambda_local)
    return score_frame(rows), rows


def align_view(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    *,
    settings: AlignSettings = DEFAULT_SETTINGS,
    method: str = DEFAULT_METHOD,
    phrase: str | None = None,
    token: int | None = None,
) -> AlignView:
    """The Align click: encode and solve (cached), then every figure of the view. A
    ``phrase`` / ``token`` still valid for this caption is kept, else the defaults;
    QC-Align runs with CAME at ``settings.came_temperature`` (``None``: its own); with
    ``settings.explainers``, the grid has the explainers' panels after the methods' (notes
    saying they were skipped, when the server's compute budget refuses them)."""
    encoded, runs = encode_and_align(explainer, suite, image, caption, settings)
    phrases = phrase_choices(encoded)
    phrase, phrase_note = shown_phrase(encoded, phrases, phrase)
    if phrase not in {v for _, v in phrases}:  # a run of words that is no tree node
        phrases.append((f'"{phrase_text(encoded, phrase)}"', phrase))
    tokens = token_choices(encoded)
    if token not in {v for _, v in tokens}:
        token = 0
    explained = explained_by(explainer.backbone, encoded, settings.explainers)
    grid, heats = phrase_grid(encoded, runs, phrase, settings.shared_scale, explained)
    rows = score_rows(runs, settings.lambda_local)
    errors = [r.marginal_error for r in rows if r.name in ALIGN_METHODS]
    return AlignView(
        phrase_choices=phrases,
        phrase=phrase,
        token_choices=tokens,
        token=token,
        grid=grid,
        heats=heats,
        plan=draw_plan(encoded, runs, method, token),
        scores=score_frame(rows),
        rows=rows,
        convergence=convergence_figure([METHOD_LABELS[n] for n in ALIGN_METHODS], errors),
        quota_note=quota_note(runs, suite, settings.came_temperature),
        explainers_refused=str(explained.refused) if explained and explained.refused else None,
        phrase_note=phrase_note,
    )
