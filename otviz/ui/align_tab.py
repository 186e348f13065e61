"""The "Align" view: every method's phrase heatmap side by side, the transport plan of one
method with its marginals, the solvers' convergence and a score table.

Callbacks are plain functions of plain values (testable without a browser); the builder
only wires them to components. Encoding and solving happen once per (image, caption,
region kind): :class:`otviz.explain.Explainer` caches the features and every method's
alignment, so a phrase, method, token, scale or lambda change only reads cached plans
(``Alignment.heatmap``) and draws.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from otviz.boundary.text import check_phrase
from otviz.errors import UserInputError
from otviz.explain import REGION_KINDS, Encoded, Explainer, InputError, MethodRun
from otviz.methods import METHODS
from otviz.methods.masses import max_over_uniform
from otviz.suite import (
    ALIGN_METHODS,
    DEFAULT_LAMBDA,
    METHOD_LABELS,
    SCORED_METHODS,
    MethodSuite,
    came_methods,
    method_choices,
    with_came_temperature,
)
from otviz.text.parse import phrase_nodes
from otviz.text.words import split_words
from otviz.ui.context import AppContext, SharedInputs
from otviz.ui.downloads import DownloadDir
from otviz.ui.events import on_edit
from otviz.ui.explainer_panels import DEFAULT_ON as EXPLAINERS_ON
from otviz.ui.explainer_panels import TOGGLE_LABEL, explained_by, explainer_panels
from otviz.ui.inputs import truncation_note, user_errors
from otviz.ui.phrase_grids import (
    DELAY_JS,
    DRAWER,
    PREFETCH_MAX,
    PRELOAD_JS,
    SWAP_JS,
    GridCache,
    decode_jpeg,
    encode_jpeg,
    pair_token,
    prefetch_payload,
)
from otviz.ui.plots import FigurePlot
from otviz.ui.trust_panel import build_trust_panel
from otviz.viz.mass import displayable_mass, negative_mass, negative_mass_note
from otviz.viz.panels import compose_heatmaps
from otviz.viz.phrase_grid import grid_layout, grounding_boxes
from otviz.viz.plans import convergence_figure, plan_matrix_figure, token_marginal_figure
from otviz.viz.tables import ScoreRow, score_frame, score_records

log = logging.getLogger(__name__)
TAB_TITLE = "Align"
DEFAULT_METHOD = "conceptot"
#: Each method's panel on its own colour scale by default: on one shared scale the
#: methods that spread their mass look like the bare image next to the peaked ones.
DEFAULT_SHARED_SCALE = False
#: CAME's temperature control: the paper's plain softmax (1) down to sharp quotas.
CAME_TEMPERATURES = (0.05, 2.0)
DEFAULT_CAME_TEMPERATURE = 1.0
# Rasters go to the page as JPEG: ~1 ms to encode against ~50 ms for PNG on this CPU (the
# downloads stay PNG).
RASTER_FORMAT = "jpeg"
_SPAN = re.compile(r"^span:(\d+):(\d+)$")

HOW_TO_READ = """**How to read this view.** *Heatmaps:* for the chosen word or parse-tree
phrase, each panel shows how much of the phrase's mass the method transports to each image
patch (the sum of the plan's columns over the phrase's tokens, ConceptOT Sec. 2.6; bright =
more mass); the cyan box encloses the patches above half the panel's peak (weak grounding; left out
when it covers nearly the whole image, e.g. for a flat map).
The image is greyed and dimmed; the colour grows opaque with the mass, so the
phrase's region glows. By default each panel has its own colour scale (the bar under it) to
show each method's own pattern; tick *one colour scale* to compare them in absolute mass.
*Transport plan:* rows are image patches (row-major on the patch grid;
hover for the row and column), columns are the caption's BPE tokens; pick a token to see its
column on the image. *Marginals:* how much mass each patch and token kept (plan row and
column sums) against the reference masses mu and nu the method aimed for; "unmatched" is
the part of mu a patch did not transport (unbalanced methods leave background unmatched).
*QC-Align* is read relative to its marginals: its panel shows sum over the phrase's tokens
of Pi_ij / (mu_i nu_j) (1 = no more coupling than the quotas imply), and its CAME quota map
mu is the "reference mu" panel when QC-Align is the selected method. *CAME temperature*
re-scores QC-Align with CAME's attention softmax at that temperature (1 = the paper's plain
softmax; lower = sharper, less uniform quotas); the note beside it gives the quotas' largest
entry over uniform. CAME has no parameters, so the control applies to a trained head too,
but its projections were trained at the temperature the note names. *ConceptOT*'s faithful
Nystrom plan (checkpoint "training-free, ConceptOT faithful") can hold negative entries:
they are never drawn as mass (clipped at 0, the titles and the score table's "negative
mass" column say how much); the default training-free entry uses the nonnegative variant.
*PowerCLIP*'s panel is its own readout: the regions of the phrase's tree node weighted by
their membership sigmoid(q / tau) in the node's best subset (the map its pointing game is
scored on; pick *boxes*, the proposals its head trained on, or *grid*); when no region is
in the best subset (all memberships ~0) the panel shows its Fig. 6 text-to-patch similarity
instead, titled "Fig. 6 sim.".
Global+Patch, FILIP, Text-Attn and PowerCLIP have no reference masses. *Scores:* global
cosine s_g, local score s_l, their combination s_g + λ·s_l (ConceptOT App. G.4), the
solver's final marginal error (blank without an OT solver) and the solve time.
*Explainers too* adds, after the methods' panels, the maps of Grad-CAM, LeGrad, MaskCLIP and
Chefer et al.'s relevance: read from the model's gradients or attention given the image and
the phrase's words alone, no transport plan (docs/explainers.md); each on its own scale."""


# ----------------------------------------------------------------------- choices
def phrase_choices(encoded: Encoded) -> list[tuple[str, str]]:
    """``(label, value)`` for the caption's words, then its parse-tree phrases (spans of
    two words or more, NP/PP/VP/... and the whole caption), each as ``"span:start:end"``
    over word indices. Words the context length cut are left out."""
    kept = set(encoded.kept_words)
    words = [(f'word "{encoded.words[k].text}"', f"span:{k}:{k + 1}") for k in sorted(kept)]
    phrases = [
        (f'{node.label} "{node.span_text()}"', f"span:{node.start}:{node.end}")
        for node in phrase_nodes(encoded.parse.tree)
        if node.end - node.start > 1 and any(k in kept for k in range(node.start, node.end))
    ]
    return words + phrases


def default_phrase(choices: list[tuple[str, str]]) -> str:
    """The caption's first base noun phrase (the earliest NP, the shortest at that start),
    else its first word."""
    nps = []
    for label, value in choices:
        span = _SPAN.match(value)
        if label.startswith("NP ") and span:
            start, end = int(span.group(1)), int(span.group(2))
            nps.append((start, end - start, value))
    return min(nps)[2] if nps else choices[0][1]


def resolve_phrase(encoded: Encoded, phrase: str | None) -> list[int]:
    """Word indices of ``phrase``: a picker value ``"span:start:end"`` or words typed by the
    user, matched (case-insensitively) as a contiguous run of caption words."""
    phrase = check_phrase(phrase)
    n = len(encoded.words)
    span = _SPAN.match(phrase)
    if span:
        start, end = int(span.group(1)), int(span.group(2))
        if not 0 <= start < end <= n:
            raise InputError(f"the phrase {phrase!r} is not in the caption (it has {n} words)")
        return list(range(start, end))
    wanted = [w.text.lower() for w in split_words(phrase)]
    have = [w.text.lower() for w in encoded.words]
    for start in range(n - len(wanted) + 1):
        if wanted and have[start : start + len(wanted)] == wanted:
            return list(range(start, start + len(wanted)))
    raise InputError(f'"{phrase}" is not in the caption "{encoded.caption}"')


def phrase_text(encoded: Encoded, phrase: str | None) -> str:
    """The caption words of ``phrase`` (see :func:`resolve_phrase`), space-separated."""
    return " ".join(encoded.words[k].text for k in resolve_phrase(encoded, phrase))


def token_labels(encoded: Encoded) -> tuple[torch.Tensor, list[str], list[str]]:
    """The valid token positions ``[M]`` with each token's text (its characters in the
    caption) and caption word."""
    positions = torch.nonzero(encoded.features.token_mask[0]).flatten()
    spans = encoded.features.text.captions[0].token_spans
    word_of = encoded.features.token_word[0]
    texts = [encoded.caption[s:e] for s, e in spans[: len(positions)]]
    words = [encoded.words[int(w)].text if w >= 0 else "" for w in word_of[positions]]
    return positions, texts, words


def token_choices(encoded: Encoded) -> list[tuple[str, int]]:
    """``(label, column)`` for every plan column (valid token)."""
    _, texts, words = token_labels(encoded)
    return [
        (f"{j}: {t}" + ("" if t == w else f" ({w})"), j)
        for j, (t, w) in enumerate(zip(texts, words, strict=True))
    ]


# ----------------------------------------------------------------------- computing
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


# ----------------------------------------------------------------------- drawing
def patch_marginal_image(
    encoded: Encoded, data: PlanData, label: str, reference_name: str = "reference mu"
) -> np.ndarray:
    """Kept patch mass on the image beside the reference mu (titled ``reference_name``, with
    its largest entry over the uniform mass) and the unmatched part of mu."""
    kept, negative = displayable_mass(data.row_marginal.reshape(encoded.grid))
    label = label + negative_mass_note(negative)
    if data.row_reference is None:
        return compose_heatmaps(
            encoded.image,
            [kept],
            [f"{label}: kept (no mu)"],
            geometry=encoded.geometry,
            columns=1,
            panel_px=200,
            colorbar_label="patch mass",
        )
    mu = data.row_reference.reshape(encoded.grid)
    reference = torch.from_numpy(data.row_reference)[None]
    ratio = float(max_over_uniform(reference, reference > 0)[0])
    mu_title = f"{reference_name} (max {ratio:.2f}x uniform)"
    return compose_heatmaps(
        encoded.image,
        [mu, kept, np.clip(mu - kept, 0.0, None)],
        [mu_title, f"{label}: kept", "unmatched (mu − kept)+"],
        geometry=encoded.geometry,
        columns=3,
        panel_px=160,
        colorbar_label="patch mass",
    )


def token_map_image(encoded: Encoded, data: PlanData, column: int, label: str) -> np.ndarray:
    """One plan column (a token's mass over the patches) on the image, with its box."""
    heat, negative = displayable_mass(data.plan[:, column].reshape(encoded.grid))
    return compose_heatmaps(
        encoded.image,
        [heat],
        [f'{label}: "{data.tokens[column]}"' + negative_mass_note(negative)],
        geometry=encoded.geometry,
        boxes=grounding_boxes(encoded.geometry, [heat]),
        columns=1,
        panel_px=224,
        colorbar_label="token mass",
    )


# ----------------------------------------------------------------------- callbacks
@dataclass
class PlanView:
    """What the plan side of the view shows for one method and token."""

    plan: go.Figure
    token_map: np.ndarray
    patch_marginals: np.ndarray
    token_marginals: go.Figure
    data: PlanData


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


def _encode_and_align(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    regions: str,
    came_temperature: float | None = None,
    compute: bool = True,
) -> tuple[Encoded, dict[str, MethodRun]]:
    encoded = explainer.encode(image, caption, compute)
    return encoded, align_runs(explainer, suite, encoded, regions, came_temperature, compute)


def _phrase_grid(
    encoded: Encoded, runs: dict[str, MethodRun], phrase: str | None, shared_scale: bool,
    explained: Callable[[str], dict[str, np.ndarray | str]] | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    maps = phrase_maps(runs, encoded, phrase, explained)
    return compose_heatmaps(encoded.image, **maps.layout(encoded, shared_scale)), maps.heats


def _plan_view(
    encoded: Encoded, runs: dict[str, MethodRun], method: str, token: int | None
) -> PlanView:
    if method not in ALIGN_METHODS:
        raise InputError(f"unknown method {method!r}")
    data = plan_data(runs[method], encoded)
    column = 0 if token is None else int(token)
    if not 0 <= column < data.plan.shape[1]:
        raise InputError(f"token {token} is not in the caption ({data.plan.shape[1]} tokens)")
    label = METHOD_LABELS[method]
    return PlanView(
        plan=plan_matrix_figure(
            data.plan,
            encoded.grid,
            data.tokens,
            data.words,
            f"{label}: transport plan (patches x tokens)"
            + negative_mass_note(negative_mass(data.plan))
            + (" (colour from 0; hover shows the signed value)"
               if negative_mass(data.plan) > 0 else ""),
        ),
        token_map=token_map_image(encoded, data, column, label),
        patch_marginals=patch_marginal_image(
            encoded, data, label, METHODS[method].reference_label
        ),
        token_marginals=token_marginal_figure(
            data.col_marginal, data.col_reference, data.tokens, f"{label}: token marginals vs nu"
        ),
        data=data,
    )


def phrase_view(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    phrase: str | None,
    regions: str = "grid",
    shared_scale: bool = DEFAULT_SHARED_SCALE,
    came_temperature: float | None = None,
    compute: bool = True,
    explainers: bool = EXPLAINERS_ON,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The phrase callback: the heatmap grid and the per-method heatmaps from the cached
    features and plans (nothing is re-encoded or re-solved; with ``compute=False`` a pair
    not cached is a :class:`~otviz.explain.NotComputedError` rather than computed); with
    ``explainers``, the explainers' panels too."""
    encoded, runs = _encode_and_align(explainer, suite, image, caption, regions,
                                      came_temperature, compute)
    return _phrase_grid(encoded, runs, phrase, shared_scale,
                        explained_by(explainer.backbone, encoded, explainers))


def plan_view(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    method: str,
    token: int | None = None,
    regions: str = "grid",
    came_temperature: float | None = None,
    compute: bool = True,
) -> PlanView:
    """The method / token callback: plan matrix, token column map and marginals
    (``compute`` as in :func:`phrase_view`)."""
    encoded, runs = _encode_and_align(explainer, suite, image, caption, regions,
                                      came_temperature, compute)
    return _plan_view(encoded, runs, method, token)


def scores_view(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    lambda_local: float = DEFAULT_LAMBDA,
    regions: str = "grid",
    came_temperature: float | None = None,
) -> tuple[pd.DataFrame, list[ScoreRow]]:
    """The lambda callback: the score table (display frame and full-precision rows)."""
    _, runs = _encode_and_align(explainer, suite, image, caption, regions, came_temperature)
    rows = score_rows(runs, lambda_local)
    return score_frame(rows), rows


def align_view(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    method: str = DEFAULT_METHOD,
    regions: str = "grid",
    shared_scale: bool = DEFAULT_SHARED_SCALE,
    lambda_local: float = DEFAULT_LAMBDA,
    phrase: str | None = None,
    token: int | None = None,
    came_temperature: float | None = None,
    explainers: bool = EXPLAINERS_ON,
) -> AlignView:
    """The Align click: encode and solve (cached), then every figure of the view. A
    ``phrase`` / ``token`` still valid for this caption is kept, else the defaults;
    QC-Align runs with CAME at ``came_temperature`` (``None``: its own); with
    ``explainers``, the grid has the explainers' panels after the methods'."""
    encoded, runs = _encode_and_align(explainer, suite, image, caption, regions,
                                      came_temperature)
    phrases = phrase_choices(encoded)
    if phrase not in {v for _, v in phrases}:
        phrase = default_phrase(phrases)
    tokens = token_choices(encoded)
    if token not in {v for _, v in tokens}:
        token = 0
    grid, heats = _phrase_grid(encoded, runs, phrase, shared_scale,
                               explained_by(explainer.backbone, encoded, explainers))
    rows = score_rows(runs, lambda_local)
    errors = [r.marginal_error for r in rows if r.name in ALIGN_METHODS]
    return AlignView(
        phrase_choices=phrases,
        phrase=phrase,
        token_choices=tokens,
        token=token,
        grid=grid,
        heats=heats,
        plan=_plan_view(encoded, runs, method, token),
        scores=score_frame(rows),
        rows=rows,
        convergence=convergence_figure([METHOD_LABELS[n] for n in ALIGN_METHODS], errors),
        quota_note=quota_note(runs, suite, came_temperature),
    )


def align_downloads(
    explainer: Explainer,
    suite: MethodSuite,
    image,
    caption: str | None,
    phrase: str | None,
    method: str = DEFAULT_METHOD,
    regions: str = "grid",
    shared_scale: bool = DEFAULT_SHARED_SCALE,
    lambda_local: float = DEFAULT_LAMBDA,
    token: int | None = None,
    came_temperature: float | None = None,
    explainers: bool = EXPLAINERS_ON,
) -> list[str]:
    """Files of the current view: every figure (PNG; the plotly ones also as HTML), the
    phrase heatmaps, the plan and its marginals (.npy + .csv) and the scores (JSON)."""
    encoded, runs = _encode_and_align(explainer, suite, image, caption, regions,
                                      came_temperature)
    grid, heats = _phrase_grid(encoded, runs, phrase, shared_scale,
                               explained_by(explainer.backbone, encoded, explainers))
    view = _plan_view(encoded, runs, method, token)
    data, out = view.data, DownloadDir()
    out.save_figure(grid, "phrase_heatmaps")
    out.save_figure(view.patch_marginals, f"patch_marginals_{method}")
    out.save_figure(view.token_map, f"token_map_{method}")
    out.save_figure(view.plan, f"plan_{method}")
    out.save_figure(view.token_marginals, f"token_marginals_{method}")
    rows = score_rows(runs, lambda_local)
    out.save_figure(convergence_figure(
        [METHOD_LABELS[n] for n in ALIGN_METHODS],
        [r.marginal_error for r in rows if r.name in ALIGN_METHODS]), "solver_convergence")
    out.save_array(
        np.stack([heats[n].reshape(-1) for n in ALIGN_METHODS], axis=1),
        "phrase_heatmaps",
        columns=[METHOD_LABELS[n] for n in ALIGN_METHODS],
    )
    out.save_array(data.plan, f"plan_{method}", columns=data.tokens)
    nan_n, nan_m = np.full(data.plan.shape[0], np.nan), np.full(data.plan.shape[1], np.nan)
    rows_ref = data.row_reference if data.row_reference is not None else nan_n
    cols_ref = data.col_reference if data.col_reference is not None else nan_m
    out.save_array(
        np.stack([data.row_marginal, rows_ref], axis=1),
        f"patch_marginals_{method}",
        columns=["kept", "mu"],
    )
    out.save_array(
        np.stack([data.col_marginal, cols_ref], axis=1),
        f"token_marginals_{method}",
        columns=["kept", "nu"],
    )
    out.save_json(
        {
            "caption": encoded.caption,
            "phrase": phrase_text(encoded, phrase),
            "method": method,
            "regions": regions,
            "grid": list(encoded.grid),
            "tokens": data.tokens,
            "token_words": data.words,
            "lambda_local": lambda_local,
            "came_temperature": next(
                (suite.methods[n].method.came_temperature for n in came_methods(suite)), None)
            if came_temperature is None else came_temperature,
            "scores": score_records(rows),
        },
        "scores",
    )
    return [str(p) for p in out.files]


# ----------------------------------------------------------------------- the tab
#: The prefetch of a pair's phrase grids: in the background of what the person sees (outside
#: the queue, no progress overlay, drawn at idle priority: otviz.ui.phrase_grids), once the
#: page has drawn the Align click.
PREFETCH = {"queue": False, "show_progress": "hidden", "api_visibility": "private",
            "js": DELAY_JS}


@dataclass
class AlignLink:
    """What another view needs to open a pair in Align: the phrase picker to set, the Align
    click (its function, inputs and outputs) to run after setting it, and the prefetch of
    the pair's phrase grids that follows the click (:meth:`after`)."""

    phrase: gr.Dropdown
    click: tuple[Callable, list, list]
    prefetch: tuple[Callable, list, list]

    def prefetch_after(self, dependency: Any) -> Any:
        """Prefetch the pair's phrase grids into the page when ``dependency`` succeeds, and
        have the page decode them."""
        _, _, payload = self.prefetch
        return dependency.success(*self.prefetch, **PREFETCH).success(
            None, payload, None, js=PRELOAD_JS, api_visibility="private")

    def after(self, event: Any, **kwargs: Any) -> Any:
        """Run the Align click when ``event`` succeeds (``kwargs`` go to its listener), then
        prefetch the phrase grids."""
        return self.prefetch_after(event.success(*self.click, **kwargs))


def build_align_tab(ctx: AppContext, shared: SharedInputs) -> AlignLink:
    """Add the Align view to the enclosing ``gr.Blocks`` (inside its tab)."""
    with gr.Row():
        run = gr.Button("Align", variant="primary", scale=1)
        regions = gr.Radio(list(REGION_KINDS), value="grid", label="PowerCLIP regions", scale=2)
        shared_scale = gr.Checkbox(DEFAULT_SHARED_SCALE, label="One colour scale for all methods",
                                   scale=1)
        lam = gr.Slider(
            0.0, 2.0, DEFAULT_LAMBDA, step=0.05, scale=2, label="λ_l in combined = s_g + λ_l·s_l"
        )
    with gr.Row():
        came_t = gr.Slider(*CAME_TEMPERATURES, DEFAULT_CAME_TEMPERATURE, step=0.05, scale=1,
                           label="QC-Align: CAME temperature (1 = the paper's softmax)")
        quotas = gr.Markdown()
        explain_on = gr.Checkbox(EXPLAINERS_ON, label=TOGGLE_LABEL, scale=1,
                                 elem_id="align-explainers")
    # the heatmap grid spans the page (four panels across); the plan side comes under it
    phrase = gr.Dropdown(
        label="Phrase (a word or a parse-tree phrase; or type words)",
        choices=[],
        allow_custom_value=True,
        elem_id="align-phrase",
    )
    # its download button is left out: a phrase swapped in by the page (otviz.ui.phrase_grids)
    # is not the component's value; "Prepare downloads" saves the grid on show
    grid = gr.Image(
        label="Phrase heatmap per method", format=RASTER_FORMAT, interactive=False,
        elem_id="align-grid", buttons=["fullscreen"],
    )
    # the page's copy of the pair's phrase grids, the token of the pair on show, and the
    # phrase a pick swapped in from the copy
    prefetched = gr.HTML(visible="hidden", html_template="", elem_id="align-prefetched")
    shown_token = gr.Textbox(visible="hidden", elem_id="align-token")
    swapped = gr.Textbox(visible="hidden", elem_id="align-swapped")
    with gr.Row():
        with gr.Column(scale=3):
            method = gr.Dropdown(method_choices(), value=DEFAULT_METHOD, label="Method",
                                 elem_id="align-method")
            plan = FigurePlot(label="Transport plan", elem_id="align-plan")
        with gr.Column(scale=2):
            token = gr.Dropdown(label="Token (its plan column on the image)", choices=[])
            token_map = gr.Image(
                label="Token column on the image", format=RASTER_FORMAT, interactive=False,
                elem_id="align-token-map",
            )
    with gr.Row():
        patch_marginals = gr.Image(
            label="Patch marginals vs mu", format=RASTER_FORMAT, interactive=False,
            elem_id="align-patch-marginals",
        )
        token_marginals = FigurePlot(label="Token marginals vs nu", elem_id="align-token-marginals")
    scores = gr.Dataframe(label="Scores per method", interactive=False, elem_id="align-scores")
    with gr.Row():
        convergence = FigurePlot(label="Solver convergence", elem_id="align-convergence")
        with gr.Column():
            prepare = gr.Button("Prepare downloads")
            files = gr.File(label="Downloads", file_count="multiple")
    build_trust_panel(ctx, [shared.image, shared.caption, shared.checkpoint, phrase, explain_on],
                      resolve_phrase)
    gr.Markdown(HOW_TO_READ)
    grids = GridCache()

    def tools(checkpoint: str) -> tuple[Explainer, MethodSuite]:
        return ctx.explainer(checkpoint), ctx.suite(checkpoint)

    def token_of(encoded: Encoded, checkpoint: str, reg: str, temp: float | None,
                 expl: bool) -> str:
        return pair_token(encoded.key, checkpoint, reg, temp, bool(expl))

    def on_align(img, text, checkpoint, meth, reg, scale, lam_l, phr, tok, temp, expl=False):
        DRAWER.start()  # the page prefetches the phrase grids after this click
        explainer, suite = tools(checkpoint)
        v = align_view(explainer, suite, img, text, meth, reg, scale, lam_l, phr, tok, temp,
                       bool(expl))
        encoded = explainer.encode(img, text)  # cached
        note = truncation_note(encoded)
        if note:
            gr.Warning(note)
        signed = [r.label for r in v.rows if r.negative_mass > 0]
        if signed:
            gr.Warning(f"negative plan mass in {', '.join(signed)}: clipped at 0 on screen, "
                       "see the score table")
        notice = ctx.world_notice(checkpoint, img)
        if notice:
            gr.Warning(notice, duration=None, title="Far from the synthetic world")
        token_key = token_of(encoded, checkpoint, reg, temp, expl)
        grids.put(token_key, v.phrase, scale, encode_jpeg(v.grid))
        return (
            gr.Dropdown(choices=v.phrase_choices, value=v.phrase),
            gr.Dropdown(choices=v.token_choices, value=v.token),
            v.grid,
            v.plan.plan,
            v.plan.token_map,
            v.plan.patch_marginals,
            v.plan.token_marginals,
            v.scores,
            v.convergence,
            v.quota_note,
            token_key,
        )

    # reads of what an Align click computed (they never encode or solve); the prefetch is
    # served outside the queue (one HTTP request), the reads a person waits on go through it:
    # Gradio's page shows nothing for an error of a request served outside the queue
    def on_prefetch(img, text, checkpoint, reg, scale, temp, expl=False):
        try:
            explainer, suite = tools(checkpoint)
            encoded, runs = _encode_and_align(explainer, suite, img, text, reg, temp,
                                              compute=False)
            token_key = token_of(encoded, checkpoint, reg, temp, expl)
            explained = explained_by(explainer.backbone, encoded, bool(expl), prefetch=True)
            picks = [value for _, value in phrase_choices(encoded)][:PREFETCH_MAX]
            jpegs = {p: grids.get(token_key, p, scale) for p in picks}
            todo = [p for p, jpeg in jpegs.items() if jpeg is None]
            drawn = DRAWER.draw(encoded.image, [
                phrase_maps(runs, encoded, p, explained).layout(encoded, scale) for p in todo
            ]) if todo else []
        except UserInputError:  # nothing aligned to prefetch (yet): the page asks the server
            return gr.skip()
        except Exception:  # the server draws every pick the page cannot swap in
            log.exception("prefetching the phrase grids failed")
            return gr.skip()
        for p, jpeg in zip(todo, drawn, strict=True):
            grids.put(token_key, p, scale, jpeg)
            jpegs[p] = jpeg
        return prefetch_payload(token_key, scale, jpegs)

    def on_phrase(img, text, checkpoint, reg, scale, phr, temp, expl=False, swapped_in=None):
        if swapped_in and swapped_in == phr:  # the page already shows it (SWAP_JS)
            return gr.skip()
        explainer, suite = tools(checkpoint)
        encoded, runs = _encode_and_align(explainer, suite, img, text, reg, temp,
                                          compute=False)
        token_key = token_of(encoded, checkpoint, reg, temp, expl)
        jpeg = grids.get(token_key, phr or "", scale)
        if jpeg is not None:
            return decode_jpeg(jpeg)
        raster = _phrase_grid(encoded, runs, phr, scale,
                              explained_by(explainer.backbone, encoded, bool(expl)))[0]
        grids.put(token_key, phr or "", scale, encode_jpeg(raster))
        return raster

    def on_plan(img, text, checkpoint, meth, tok, reg, temp):
        v = plan_view(*tools(checkpoint), img, text, meth, tok, reg, temp, compute=False)
        return v.plan, v.token_map, v.patch_marginals, v.token_marginals

    def on_token(img, text, checkpoint, meth, tok, reg, temp):
        return plan_view(*tools(checkpoint), img, text, meth, tok, reg, temp,
                         compute=False).token_map

    def on_lambda(img, text, checkpoint, lam_l, reg, temp):
        return scores_view(*tools(checkpoint), img, text, lam_l, reg, temp)[0]

    def on_download(img, text, checkpoint, phr, meth, reg, scale, lam_l, tok, temp, expl=False):
        return align_downloads(*tools(checkpoint), img, text, phr, meth, reg, scale, lam_l, tok,
                               temp, bool(expl))

    base = [shared.image, shared.caption, shared.checkpoint]
    all_inputs = [*base, method, regions, shared_scale, lam, phrase, token, came_t, explain_on]
    all_outputs = [
        phrase,
        token,
        grid,
        plan,
        token_map,
        patch_marginals,
        token_marginals,
        scores,
        convergence,
        quotas,
        shown_token,
    ]
    phrase_inputs = [*base, regions, shared_scale, phrase, came_t, explain_on]
    plan_inputs = [*base, method, token, regions, came_t]
    plan_outputs = [plan, token_map, patch_marginals, token_marginals]
    link = AlignLink(phrase, (user_errors(on_align), all_inputs, all_outputs),
                     (user_errors(on_prefetch), [*base, regions, shared_scale, came_t,
                                                 explain_on], prefetched))
    hidden = {"api_visibility": "private"}  # the same endpoint again, from another control
    link.prefetch_after(run.click(*link.click, api_name="align"))
    link.prefetch_after(regions.input(*link.click, **hidden))
    link.prefetch_after(came_t.release(*link.click, **hidden))
    link.prefetch_after(explain_on.input(*link.click, **hidden))
    # a pick: swapped in the page from the prefetched grids (SWAP_JS), else drawn (or read
    # from the grid cache) by the server; the server call for a swapped pick is a no-op
    on_edit(phrase, None, [phrase, shared_scale, prefetched, shown_token], swapped,
            js=SWAP_JS).then(user_errors(on_phrase), [*phrase_inputs, swapped], grid,
                             api_name="align_phrase", show_progress="hidden")
    link.prefetch_after(shared_scale.input(user_errors(on_phrase), phrase_inputs, grid,
                                           **hidden))
    on_edit(method, user_errors(on_plan), plan_inputs, plan_outputs, api_name="align_plan")
    on_edit(token, user_errors(on_token), plan_inputs, token_map, api_name="align_token")
    lam.release(user_errors(on_lambda), [*base, lam, regions, came_t], scores,
                api_name="align_scores")
    prepare.click(
        user_errors(on_download),
        [*base, phrase, method, regions, shared_scale, lam, token, came_t, explain_on],
        files,
        api_name="align_downloads",
    )
    return link
