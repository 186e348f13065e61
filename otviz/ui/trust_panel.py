"""The Align view's Trust panel: the field's explanation metrics (Quantus, through
:mod:`otviz.eval.trust`) of each method's map of the image and phrase on show (with
*Explainers too*, each explainer's as well), beside the colour oracle and the centre prior.

Opt-in: nothing is computed until the panel's button is clicked, so the Align click costs what
it cost before. The rows then come one at a time with the fast metrics (localisation, random
logit, sparseness: every map's within 10 s on two loaded cores, 0.3 s quiet), and the slow ones
(deletion, insertion, faithfulness correlation, MPRT, max-sensitivity: 10-100 times as dear a
map) are filled in afterwards, map by map, the page showing each step and what is left
(docs/trust.md, "In the app: what returns first"). Each part is kept per image, caption,
checkpoint, phrase, settings and row, so asking again is a read. Localisation needs the
phrase's gold box: the shipped world examples carry theirs
(``otviz/assets/examples/captions.json``); for any other image the panel shows the model-based
metrics only and says why.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
import numpy as np
import pandas as pd
from PIL import Image

from otviz.eval.trust.adapter import (
    HeatmapSource,
    PhraseScorer,
    TrustPhrase,
    caption_phrases,
    heatmap_sources,
    phrase_colour,
    trust_inputs,
)
from otviz.eval.trust.lattice import PatchLattice
from otviz.eval.trust.metrics import (
    FLAT,
    METRIC_BY_KEY,
    TABLE_METRICS,
    TrustMetric,
    TrustSettings,
    flat_note,
    trust_scores,
)
from otviz.eval.trust.table import verdict
from otviz.explain import Encoded, Explainer, NotComputedError
from otviz.explainers import EXPLAINERS, unavailable
from otviz.suite import METHOD_LABELS, MethodSuite, flat_map_reasons
from otviz.text.tree import Tree
from otviz.ui.budget import ComputeBudget, CostModel, server_budget, visitor
from otviz.ui.cheap_events import StepAside, yielding
from otviz.ui.context import AppContext
from otviz.ui.examples import Example, load_examples
from otviz.ui.inputs import user_errors
from otviz.ui.shutdown import refuse_if_stopping
from otviz.ui.trust_browse import trust_unavailable
from otviz.viz.tables import POINTING_INFO, metric_label, titled

TITLE = "Trust: which heatmap can you trust? (explanation metrics, computed on demand)"
#: The table's title; once filled, it names the reading the maps were drawn on
#: (:func:`~otviz.viz.tables.titled`).
TABLE_TITLE = "Trust metrics per map"
#: Lighter than the table's (otviz eval --tables trust): half the deletion / insertion steps
#: and faithfulness subsets, three noisy inputs (fewer forward passes per row).
SETTINGS = TrustSettings(regions=5, fc_runs=5, ms_samples=3)
#: The header mark of the slow metrics' columns (filled in after every map's fast metrics).
SLOW_MARK = " (slow)"
NO_BOXES = ("**No localisation here:** pointing (strict and tolerant), relevance mass and "
            "rank and AUC need the phrase's gold box, which only the world examples carry; "
            "this image (an upload, or a phrase that is not one of the example's gold noun "
            "phrases) is scored on "
            "the model-based metrics only (faithfulness, randomisation, robustness, "
            "complexity).")
HOW_TO_READ = """Each row scores one map of the phrase on show with the metrics of Quantus
(Hedström et al., JMLR 2023; docs/trust.md): ↑ higher is better, ↓ lower is better.
*Deletion / insertion*: mean drop / gain of the image's similarity with the phrase as its
patches are removed from / put back into the image in the map's order. *MPRT*: similarity of
the map to the map once the image tower's blocks are re-initialised from the top; a map that
barely changes (a model-free baseline, say) **does not depend on the model**. *Random logit*:
similarity to the map of another phrase of the caption. The colour oracle and the centre
prior are the model-free references any map must beat. """ + POINTING_INFO


class TrustCache:
    """Computed panel rows by key, the least recently used dropped beyond ``size``."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._rows: OrderedDict[tuple, dict] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple) -> dict | None:
        with self._lock:
            row = self._rows.get(key)
            if row is not None:
                self._rows.move_to_end(key)
            return row

    def put(self, key: tuple, row: dict) -> None:
        with self._lock:
            self._rows[key] = row
            while len(self._rows) > self.size:
                self._rows.popitem(last=False)


def image_key(rgb: np.ndarray) -> str:
    """The image part of :class:`~otviz.explain.Encoded`'s cache key."""
    return hashlib.sha1(rgb.tobytes() + str(rgb.shape).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def example_gold() -> dict[tuple[str, str], list[TrustPhrase]]:
    """``(image key, caption) -> gold phrases with boxes`` of the shipped world examples."""
    return {key: phrases for key, phrases in map(_example_phrases, _indexed_examples())}


def _indexed_examples() -> list[tuple[Example, dict]]:
    import json

    from otviz.ui.examples import EXAMPLES_DIR

    index = EXAMPLES_DIR / "captions.json"
    records = json.loads(index.read_text()) if index.exists() else []
    return list(zip(load_examples(), records, strict=True))


def _example_phrases(pair: tuple[Example, dict]) -> tuple[tuple[str, str], list[TrustPhrase]]:
    example, record = pair
    rgb = np.asarray(Image.open(example.image_path).convert("RGB"))
    tree = Tree.from_bracket(record["tree"]) if record.get("tree") else None
    phrases = [TrustPhrase(example.caption, tuple(range(start, end)), text,
                           tuple(float(v) for v in box), phrase_colour(text), tree)
               for text, box, (start, end) in zip(record["phrases"], record["boxes"],
                                                  record["spans"], strict=True)]
    return (image_key(rgb), example.caption), phrases


def panel_phrases(encoded: Encoded, words: Sequence[int]) -> tuple[list[TrustPhrase], int]:
    """The phrase classes of the pair and the index of the one on show: the example's gold
    noun phrases (with boxes) when the pair is a world example and the phrase one of them,
    else the caption's base noun phrases and the shown words (no boxes)."""
    gold = example_gold().get((encoded.key[0], encoded.caption), [])
    shown = tuple(words)
    for k, phrase in enumerate(gold):
        if phrase.words == shown:
            return gold, k
    phrases = caption_phrases(encoded.caption, encoded.parse.tree, shown)
    return phrases, next(k for k, p in enumerate(phrases) if p.words == shown)


def panel_sources(explainer: Explainer, suite: MethodSuite, with_explainers: bool
                  ) -> tuple[list[HeatmapSource], list[str]]:
    """The panel's rows (methods, the explainers that read this tower when asked, the colour
    oracle and the centre prior; the uniform map is left out: Quantus refuses a single flat
    map) and the notes of the explainers left out."""
    names = [n for n in EXPLAINERS if with_explainers]
    notes = [note for n in names if (note := unavailable(explainer.backbone, n))]
    names = [n for n in names if unavailable(explainer.backbone, n) is None]
    sources = [s for s in heatmap_sources(suite.methods, names) if s.name != "uniform"]
    return sources, notes


#: The trust tables' metrics (both pointing conventions among them), fast then slow.
FAST_KEYS = tuple(m.key for m in TABLE_METRICS if not m.slow)
SLOW_KEYS = tuple(m.key for m in TABLE_METRICS if m.slow)
#: The panel's two passes over the maps: every map's fast metrics, then every map's slow ones.
PASSES = (("fast", FAST_KEYS), ("slow", SLOW_KEYS))
PENDING = "…"


@dataclass(frozen=True)
class PanelRow:
    """The one (image, phrase) row the panel scores: Quantus' inputs picked down to it."""

    scorer: PhraseScorer
    pixels: np.ndarray
    targets: np.ndarray
    masks: np.ndarray | None
    near: np.ndarray | None  # the gold regions grown by the tolerance (``pointing_tol``)


def panel_row(explainer: Explainer, encoded: Encoded, phrases: Sequence[TrustPhrase],
              target: int, settings: TrustSettings) -> PanelRow:
    """Quantus' inputs of the phrase ``phrases[target]`` on the encoded image (the other
    phrases are the classes random logit draws from)."""
    inputs = trust_inputs(explainer.backbone, [encoded.image], [phrases],
                          settings.mprt_blocks or None)
    row = next(i for i, p in enumerate(inputs.scorer.phrases) if p is phrases[target])
    pick = slice(row, row + 1)
    masks = None if inputs.masks is None else inputs.masks[pick]
    near = None if inputs.near is None else inputs.near[pick]
    return PanelRow(inputs.scorer, inputs.pixels[pick], inputs.targets[pick], masks, near)


def trust_rows(
    explainer: Explainer, suite: MethodSuite, encoded: Encoded, words: Sequence[int],
    with_explainers: bool, cache: TrustCache, settings: TrustSettings = SETTINGS,
    budget: ComputeBudget | None = None,
) -> Iterator[tuple[list[dict], str]]:
    """``(rows so far, status)`` before each computed part of the panel and once at the end
    (module docstring): first every map's fast metrics, one row per map as it is done, then
    every map's slow metrics (:attr:`~otviz.eval.trust.metrics.TrustMetric.slow`) filled into
    those rows. Each (map, pass) part is cached on its own, so a row is only ever shown as
    complete when both of its parts are there; a second call computes nothing. With a
    ``budget``, the parts not cached are admitted by it first, before any work (estimated
    from its measured costs, which each computed part updates): refused, nothing is
    computed."""
    sources, notes = panel_sources(explainer, suite, with_explainers)
    # the pair's key and the phrase's words fix the phrase classes and the gold boxes
    base = (*encoded.key, suite.label, tuple(words), settings)
    rows: list[dict] = []
    maps: dict[str, np.ndarray] = {}  # each map once for both passes
    missing = [keys for name, keys in PASSES for source in sources
               if cache.get((*base, source.name, name)) is None]
    admitted = contextlib.nullcontext()
    if budget is not None and missing:
        admitted = budget.admit(visitor(), "the trust metrics", panel_cost(budget.costs, missing))
    with admitted:
        step = StepAside()  # a cheap event in progress goes first (bounded in all)
        if missing:
            step()
        phrases, target = panel_phrases(encoded, words)
        row = panel_row(explainer, encoded, phrases, target, settings)
        for name, keys in PASSES:
            for k, source in enumerate(sources):
                part = cache.get((*base, source.name, name))
                if part is None:
                    refuse_if_stopping("the trust metrics")
                    yield list(rows), _progress(name, source, k, len(sources))
                    step()
                    with yielding(row.scorer, step):  # and before each model call
                        part = _score_part(row, source, keys, settings, maps,
                                           budget and budget.costs)
                    cache.put((*base, source.name, name), part)
                merged = _merge(rows[k] if k < len(rows) else None, source, part, settings)
                rows[k:k + 1] = [merged]  # the fast pass appends row k, the slow one
                # replaces it
    patch = PatchLattice.on_cells(explainer.backbone.image_tower.geometry, settings.patch).patch
    yield rows, _final_status(rows, phrases[target], len(phrases), row, notes, settings, patch)


def panel_cost(costs: CostModel, parts: Sequence[Sequence[str]]) -> float:
    """Estimated seconds of the panel's ``parts`` (each a map's metric keys of one pass)."""
    return sum(costs.trust(1, keys) for keys in parts)


def _progress(name: str, source: HeatmapSource, k: int, n: int) -> str:
    """The status while part ``name`` of map ``k`` (of ``n``) is computed."""
    if name == "fast":
        return f"fast metrics: computing {source.label} ({k + 1} of {n}) …"
    slow = ", ".join(METRIC_BY_KEY[key].label for key in SLOW_KEYS)
    return (f"fast metrics of all {n} maps done; slow metrics ({slow}; blank until done): "
            f"computing {k + 1} of {n} ({source.label}) …")


def _score_part(row: PanelRow, source: HeatmapSource, keys: Sequence[str],
                settings: TrustSettings, maps: dict[str, np.ndarray],
                costs: CostModel | None = None) -> dict:
    """The metrics ``keys`` of ``source``'s map of ``row`` (its map reused from ``maps`` when
    there, and kept there), with their cost in ms (also recorded in ``costs``) and Quantus'
    refusals."""
    scores = trust_scores(row.scorer, source, row.pixels, row.targets, row.masks, settings,
                          metrics=keys, maps=maps.get(source.name), near=row.near)
    if costs is not None:
        costs.record_trust(scores.ms, 1)
    if scores.maps is not None:
        maps[source.name] = scores.maps
    return {**{key: float(value[0]) for key, value in scores.values.items()},
            "ms": sum(scores.ms.values()), "refused": scores.refused}


def _merge(row: dict | None, source: HeatmapSource, part: dict,
           settings: TrustSettings) -> dict:
    """A new panel row: ``row`` (``None``: none yet) with the computed ``part`` added, its
    cost summed and its randomisation verdict (:data:`PENDING` until MPRT is in)."""
    old = row or {"Map": source.label, "kind": source.kind, "ms": 0.0, "refused": {}}
    new = {**old, **part, "ms": old["ms"] + part["ms"],
           "refused": {**old["refused"], **part["refused"]}}
    new["Randomisation"] = verdict(new["mprt"], settings) if "mprt" in new else PENDING
    return new


def _final_status(rows: Sequence[dict], phrase: TrustPhrase, n_phrases: int, row: PanelRow,
                  notes: Sequence[str], settings: TrustSettings, patch: int) -> str:
    """The status once every row is complete: what was scored, what could not be and why,
    and the settings."""
    status = [f"{len(rows)} maps of “{phrase.text}” scored against {n_phrases} phrase "
              "classes"]
    if row.masks is None:
        status.append(NO_BOXES)
    status += notes
    flat_rows = [r for r in rows if set(r["refused"].values()) == {FLAT}]
    flat = [r["Map"] for r in flat_rows]
    if flat:
        status.append(flat_note(flat, [r["refused"] for r in flat_rows]))
    why = {METHOD_LABELS[n]: reason for n, reason in flat_map_reasons().items()}
    status += [f"{label}: {why[label]}" for label in flat if label in why]
    refused = [f"{r['Map']}: {', '.join(r['refused'])}" for r in rows
               if r["refused"] and r["Map"] not in flat]
    if refused:
        status.append("refused by Quantus' checks of the maps: " + "; ".join(refused))
    slow = ", ".join(METRIC_BY_KEY[key].label for key in SLOW_KEYS)
    status.append(f"settings: {settings.describe(patch)}; slow metrics (computed after the "
                  f"others, marked {SLOW_MARK.strip()}): {slow}")
    return "\n\n".join(status)


def trust_frame(rows: Sequence[dict]) -> pd.DataFrame:
    """The panel's table: one row per map, the metrics it has (the slow ones' headers marked
    :data:`SLOW_MARK`, blank where not yet computed), its verdict and cost."""
    shown = [m for m in TABLE_METRICS if any(m.key in r for r in rows)]
    records = [{"Map": r["Map"], **{_header(m): _cell(r.get(m.key)) for m in shown},
                "Randomisation": r["Randomisation"], "ms": round(r["ms"])} for r in rows]
    return pd.DataFrame(records)


def _header(metric: TrustMetric) -> str:
    """A metric's column header: label (a pointing convention's named,
    :func:`~otviz.viz.tables.metric_label`), which way is better, and the slow mark."""
    return (f"{metric_label(metric.key, metric.label)} {'↑' if metric.higher else '↓'}"
            f"{SLOW_MARK if metric.slow else ''}")


def _cell(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else round(value, 3)


def build_trust_panel(ctx: AppContext, inputs: list[Any],
                      resolve: Callable[[Encoded, str | None], list[int]]) -> None:
    """Add the panel (an accordion, closed) to the enclosing Align view, or the line saying
    why this server has none (:func:`~otviz.ui.trust_browse.trust_unavailable`).
    ``inputs``: the image, caption, checkpoint, features, image size, phrase and
    *Explainers too* components;
    ``resolve``: the phrase value -> its caption words."""
    reason = trust_unavailable()
    if reason is not None:  # no Quantus here: one line says so instead of the panel
        gr.Markdown(reason, elem_id="align-trust-unavailable")
        return
    cache = TrustCache()
    with gr.Accordion(TITLE, open=False, elem_id="align-trust"):
        run = gr.Button("Compute the trust metrics of this phrase's maps",
                        elem_id="align-trust-run")
        status = gr.Markdown(elem_id="align-trust-status")
        table = gr.Dataframe(label=TABLE_TITLE, interactive=False,
                             elem_id="align-trust-table")
        gr.Markdown(HOW_TO_READ)

    def on_trust(image, caption, checkpoint, features, image_size, phrase, explainers=False):
        checkpoint = ctx.read_as(checkpoint, features, image_size)
        explainer, suite = ctx.explainer(checkpoint), ctx.suite(checkpoint)
        budget = server_budget()
        try:  # a pair aligned before: its panel parts not cached are admitted in trust_rows
            encoded, admitted = explainer.encode(image, caption, compute=False), None
        except NotComputedError:  # encoding is work too: the whole panel admitted before it
            sources, _ = panel_sources(explainer, suite, bool(explainers))
            admitted = budget.admit(visitor(), "the trust metrics", panel_cost(
                budget.costs, [keys for _, keys in PASSES for _ in sources]))
        with admitted or contextlib.nullcontext():
            if admitted is not None:
                encoded = explainer.encode(image, caption)
            words = resolve(encoded, phrase)
            for rows, note in trust_rows(explainer, suite, encoded, words, bool(explainers),
                                         cache, budget=None if admitted else budget):
                yield gr.Dataframe(trust_frame(rows), label=titled(
                    TABLE_TITLE, explainer.backbone)), note

    # outside Gradio's per-event limits: the server's compute budget admits or refuses it at
    # once, so it never waits in the queue that Align's events wait in
    run.click(user_errors(on_trust), inputs, [table, status], api_name="align_trust",
              concurrency_limit=None)
