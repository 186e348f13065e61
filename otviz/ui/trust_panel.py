"""The Align view's Trust panel: the field's explanation metrics (Quantus, through
:mod:`otviz.eval.trust`) of each method's map of the image and phrase on show (with
*Explainers too*, each explainer's as well), beside the colour oracle and the centre prior.

Opt-in: nothing is computed until the panel's button is clicked, so the Align click costs what
it cost before. The rows then come one at a time (the page shows each as it is done, with what
is left), and each is kept per image, caption, checkpoint, phrase and row, so asking again is
a read. Localisation needs the phrase's gold box: the shipped world examples carry theirs
(``otviz/assets/examples/captions.json``); for any other image the panel shows the model-based
metrics only and says why.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import gradio as gr
import numpy as np
import pandas as pd
from PIL import Image

from otviz.eval.trust.adapter import (
    HeatmapSource,
    TrustPhrase,
    caption_phrases,
    heatmap_sources,
    phrase_colour,
    trust_inputs,
)
from otviz.eval.trust.metrics import FLAT, METRICS, TrustSettings, trust_scores
from otviz.eval.trust.table import verdict
from otviz.explain import Encoded, Explainer
from otviz.explainers import EXPLAINERS, unavailable
from otviz.suite import MethodSuite
from otviz.text.tree import Tree
from otviz.ui.context import AppContext
from otviz.ui.examples import Example, load_examples
from otviz.ui.inputs import user_errors

TITLE = "Trust: which heatmap can you trust? (explanation metrics, computed on demand)"
#: Lighter than the table's (otviz eval --tables trust): half the deletion / insertion steps
#: and faithfulness subsets, three noisy inputs (fewer forward passes per row).
SETTINGS = TrustSettings(regions=5, fc_runs=5, ms_samples=3)
NO_BOXES = ("**No localisation here:** pointing, relevance mass and rank and AUC need the "
            "phrase's gold box, which only the world examples carry; this image (an upload, "
            "or a phrase that is not one of the example's gold noun phrases) is scored on "
            "the model-based metrics only (faithfulness, randomisation, robustness, "
            "complexity).")
HOW_TO_READ = """Each row scores one map of the phrase on show with the metrics of Quantus
(Hedström et al., JMLR 2023; docs/trust.md): ↑ higher is better, ↓ lower is better.
*Deletion / insertion*: mean drop / gain of the image's similarity with the phrase as its
patches are removed from / put back into the image in the map's order. *MPRT*: similarity of
the map to the map once the image tower's blocks are re-initialised from the top; a map that
barely changes (a model-free baseline, say) **does not depend on the model**. *Random logit*:
similarity to the map of another phrase of the caption. The colour oracle and the centre
prior are the model-free references any map must beat."""


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


def trust_rows(
    explainer: Explainer, suite: MethodSuite, encoded: Encoded, words: Sequence[int],
    with_explainers: bool, cache: TrustCache, settings: TrustSettings = SETTINGS,
) -> Iterator[tuple[list[dict], str]]:
    """``(rows so far, status)`` after each row of the panel (module docstring)."""
    phrases, target = panel_phrases(encoded, words)
    inputs = trust_inputs(explainer.backbone, [encoded.image], [phrases],
                          settings.mprt_blocks or None)
    row = next(i for i, p in enumerate(inputs.scorer.phrases) if p is phrases[target])
    pick = slice(row, row + 1)
    masks = None if inputs.masks is None else inputs.masks[pick]
    sources, notes = panel_sources(explainer, suite, with_explainers)
    rows: list[dict] = []
    for k, source in enumerate(sources):
        key = (*encoded.key, suite.label, tuple(words), source.name, masks is not None)
        got = cache.get(key)
        if got is None:
            yield rows, f"computing {source.label} ({k + 1} of {len(sources)}) …"
            scores = trust_scores(inputs.scorer, source, inputs.pixels[pick],
                                  inputs.targets[pick], masks, settings)
            got = {"Map": source.label, "kind": source.kind,
                   **{m.key: float(scores.values[m.key][0]) for m in METRICS
                      if m.key in scores.values},
                   "ms": sum(scores.ms.values()), "refused": scores.refused}
            got["Randomisation"] = verdict(got.get("mprt", float("nan")), settings)
            cache.put(key, got)
        rows.append(got)
    status = [f"{len(rows)} maps of “{phrases[target].text}” scored against "
              f"{len(phrases)} phrase classes"]
    if masks is None:
        status.append(NO_BOXES)
    status += notes
    flat = [r["Map"] for r in rows if set(r["refused"].values()) == {FLAT}]
    if flat:
        status.append(f"no scores for {', '.join(flat)}: the map is flat (one value "
                      "everywhere), nothing to order or perturb")
    refused = [f"{r['Map']}: {', '.join(r['refused'])}" for r in rows
               if r["refused"] and r["Map"] not in flat]
    if refused:
        status.append("refused by Quantus' checks of the maps: " + "; ".join(refused))
    patch = inputs.pixels.shape[-1] // explainer.backbone.grid[1]
    status.append(f"settings: {settings.describe(patch)}")
    yield rows, "\n\n".join(status)


def trust_frame(rows: Sequence[dict]) -> pd.DataFrame:
    """The panel's table: one row per map, the metrics it has, its verdict and cost."""
    shown = [m for m in METRICS if any(m.key in r for r in rows)]
    records = [{"Map": r["Map"],
                **{f"{m.label} {'↑' if m.higher else '↓'}": _cell(r.get(m.key)) for m in shown},
                "Randomisation": r["Randomisation"], "ms": round(r["ms"])} for r in rows]
    return pd.DataFrame(records)


def _cell(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else round(value, 3)


def build_trust_panel(ctx: AppContext, inputs: list[Any],
                      resolve: Callable[[Encoded, str | None], list[int]]) -> None:
    """Add the panel (an accordion, closed) to the enclosing Align view. ``inputs``: the image,
    caption, checkpoint, phrase and *Explainers too* components; ``resolve``: the phrase
    value -> its caption words."""
    cache = TrustCache()
    with gr.Accordion(TITLE, open=False, elem_id="align-trust"):
        run = gr.Button("Compute the trust metrics of this phrase's maps",
                        elem_id="align-trust-run")
        status = gr.Markdown(elem_id="align-trust-status")
        table = gr.Dataframe(label="Trust metrics per map", interactive=False,
                             elem_id="align-trust-table")
        gr.Markdown(HOW_TO_READ)

    def on_trust(img, text, checkpoint, phr, expl=False):
        explainer, suite = ctx.explainer(checkpoint), ctx.suite(checkpoint)
        encoded = explainer.encode(img, text)
        words = resolve(encoded, phr)
        for rows, note in trust_rows(explainer, suite, encoded, words, bool(expl), cache):
            yield trust_frame(rows), note

    run.click(user_errors(on_trust), inputs, [table, status], api_name="align_trust")
