"""The Probe view on the shipped checkpoint: the scores of the caption, its edits and the
user's variants equal each method's own combined score of each pair computed one pair at a
time through the pipeline; tables, figures and downloads carry the same numbers; batch mode
accuracy is probe_accuracy of its scores; bad input gives clean errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from otviz.eval.probe import probe_accuracy
from otviz.explain import InputError
from otviz.suite import ALIGN_METHODS, METHOD_LABELS
from otviz.ui.app import build_shared_inputs
from otviz.ui.probe_tab import (
    MAX_CUSTOM,
    SCORE_COLUMNS,
    TAB_TITLE,
    build_probe_tab,
    load_gallery,
    probe_captions,
    probe_view,
    run_batch_probe,
    run_probe,
    score_captions,
)
from tests.helpers import api_parameters

LAMBDA = 0.7
METHODS = ["global_only", *ALIGN_METHODS]


@pytest.fixture(scope="module")
def gallery():
    items = load_gallery()
    assert len(items) >= 3 and all(it.negatives for it in items)
    return items


@pytest.fixture(scope="module")
def image(gallery) -> np.ndarray:
    return np.asarray(Image.open(gallery[0].image_path).convert("RGB"))


CUSTOM = "a small red circle\n\n  a large green star above a blue ring  \n"


@pytest.fixture(scope="module")
def view(tools, gallery, image):
    explainer, suite = tools
    return probe_view(explainer, suite, image, gallery[0].caption, CUSTOM, LAMBDA)


@pytest.fixture(scope="module")
def result(tools, gallery, image):
    explainer, suite = tools
    return run_probe(explainer, suite, image, gallery[0].caption, CUSTOM, LAMBDA)


def direct_scores(explainer, suite, image, captions) -> dict[str, np.ndarray]:
    """Each method's combined score of each pair, one pair at a time (Explainer.align)."""
    out = {n: [] for n in suite.methods}
    for caption in captions:
        runs = explainer.align(explainer.encode(image, caption), suite, list(suite.methods))
        for name, run in runs.items():
            out[name].append(float(run.alignment.combined_score(LAMBDA)))
    return {n: np.array(v) for n, v in out.items()}


def test_captions_true_edits_and_custom(gallery):
    caption = gallery[0].caption
    items, edits, notes = probe_captions(caption, CUSTOM + caption)
    assert items[0].text == caption and items[0].category == "true"
    applied = [e for e in edits if e.applied]
    assert [i.text for i in items[1 : 1 + len(applied)]] == [e.caption for e in applied]
    assert [i.text for i in items if i.category == "custom"] == [
        "a small red circle", "a large green star above a blue ring"
    ]
    assert [i.label for i in items if i.category == "custom"] == ["custom 1", "custom 2"]
    assert len(notes) == 1 and "already" in notes[0]  # the true caption typed again


def test_scores_equal_each_methods_own_score(tools, result, image):
    explainer, suite = tools
    assert result.methods == METHODS
    texts = [c.text for c in result.captions]
    direct = direct_scores(explainer, suite, image, texts)
    combined = result.combined()
    for row, name in enumerate(result.methods):
        np.testing.assert_allclose(combined[row], direct[name], rtol=1e-4, atol=1e-5)
        s = result.scores[name]
        np.testing.assert_allclose(combined[row], s.global_score + LAMBDA * s.local_score)
    np.testing.assert_array_equal(result.scores["global_only"].local_score, 0.0)
    # every method sees the same image: one global embedding, so Global-only's score is
    # the cosine with each caption's text embedding
    np.testing.assert_allclose(
        result.scores["global_only"].global_score, result.scores["filip"].global_score
    )


def test_tables_figures_and_downloads_carry_the_scores(view, result):
    summary, captions, scores, bars, matrix, pending = view
    files = pending.write()
    k = len(result.captions)
    assert list(scores.columns) == SCORE_COLUMNS and len(scores) == len(METHODS) * k
    assert list(captions["caption"][:k]) == [c.text for c in result.captions]
    combined = result.combined()
    margins = result.margins()
    for row, name in enumerate(METHODS):
        part = scores[scores["method"] == METHOD_LABELS[name]]
        np.testing.assert_allclose(part["combined"], combined[row], atol=1e-4)
        verdicts = ["wins" if m > 0 else "loses" for m in margins[row]]
        assert list(part["true caption"])[1:] == verdicts
        wins = int((margins[row] > 0).sum())
        assert f"- {METHOD_LABELS[name]}: {wins}/{k - 1}" in summary
    assert isinstance(bars, Figure) and isinstance(matrix, Figure)
    panels = [ax for ax in bars.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == [METHOD_LABELS[n] for n in METHODS]
    for ax, row in zip(panels, combined, strict=True):
        np.testing.assert_allclose([p.get_height() for p in ax.patches], row)
    shown = matrix.axes[0].images[0].get_array()
    assert shown.shape == margins.shape
    np.testing.assert_allclose(np.sign(shown), np.sign(margins))
    names = [Path(f).name for f in files]
    assert names == ["probe_scores.png", "probe_win_matrix.png", "probe_combined_scores.npy",
                     "probe_combined_scores.csv", "probe_scores.json"]
    assert Image.open(files[0]).size[0] > 100
    np.testing.assert_allclose(np.load(files[2]).T, combined)
    saved = json.loads(Path(files[4]).read_text())
    assert saved["lambda_local"] == LAMBDA
    for row, name in enumerate(METHODS):
        np.testing.assert_allclose(saved["scores"][name]["combined"], combined[row])
        assert saved["scores"][name]["true_wins"] == list(margins[row] > 0)


def test_lambda_reweights_the_local_score(result):
    for lam in (0.0, 2.0):
        combined = dataclasses.replace(result, lambda_local=lam).combined()
        for row, name in enumerate(METHODS):
            s = result.scores[name]
            np.testing.assert_allclose(combined[row], s.global_score + lam * s.local_score)
    assert not np.allclose(dataclasses.replace(result, lambda_local=0.0).combined()[1:],
                           result.combined()[1:])


def test_batch_accuracy_is_probe_accuracy_of_its_scores(tools, gallery):
    explainer, suite = tools
    items = gallery[:2]
    batch = run_batch_probe(explainer, suite, LAMBDA, items)
    expected_categories = [c for it in items for c in it.negatives]
    assert batch.categories == expected_categories and batch.n_images == 2
    acc = batch.accuracy()
    for name in METHODS:
        ref = probe_accuracy(torch.from_numpy(batch.positives[name]),
                             torch.from_numpy(batch.negatives[name]), batch.categories)
        assert acc[name] == ref
    # the batch scores are the methods' own scores of each (image, caption) pair
    pos, neg = {n: [] for n in METHODS}, {n: [] for n in METHODS}
    for it in items:
        texts = [it.caption, *it.negatives.values()]
        direct = direct_scores(explainer, suite, str(it.image_path), texts)
        for name in METHODS:
            pos[name] += [direct[name][0]] * (len(texts) - 1)
            neg[name] += list(direct[name][1:])
    for name in METHODS:
        np.testing.assert_allclose(batch.positives[name], pos[name], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(batch.negatives[name], neg[name], rtol=1e-4, atol=1e-5)


def test_one_method_call_per_method(tools, gallery, image, monkeypatch):
    explainer, suite = tools
    calls = []
    for name, entry in suite.methods.items():
        original = entry.method.forward
        monkeypatch.setattr(entry.method, "forward",
                            lambda batch, f=original, n=name: calls.append((n, batch.size))
                            or f(batch))
    captions = [gallery[0].caption, *gallery[0].negatives.values()]
    score_captions(explainer, suite, image, captions)
    assert calls == [(n, len(captions)) for n in METHODS]


@pytest.mark.parametrize(
    ("image_ok", "caption", "custom", "lam", "message"),
    [
        (False, "a red circle", "", 0.5, "no image"),
        (True, "   ", "", 0.5, "caption is empty"),
        (True, "a red circle", "\n".join(f"a cat {i}" for i in range(MAX_CUSTOM + 1)), 0.5,
         "at most"),
        (True, "a red circle", "", -1.0, "lambda_l"),
        (True, "a red circle", "x" * 1200, 0.5, "over 1000 characters"),
    ],
)
def test_errors_are_clean(tools, image, image_ok, caption, custom, lam, message):
    explainer, suite = tools
    with pytest.raises(InputError, match=message):
        probe_view(explainer, suite, image if image_ok else None, caption, custom, lam)


def test_builder_wires_the_tab(ctx):
    with gr.Blocks() as demo:
        shared = build_shared_inputs(ctx)
        with gr.Tab(TAB_TITLE):
            build_probe_tab(ctx, shared)
    # the single and batch probes (each with its downloads step, not an endpoint)
    assert api_parameters(demo) == {
        "/probe": ["image", "caption", "checkpoint", "features", "image_size", "variants",
                   "lambda_local"],
        "/probe_batch": ["checkpoint", "features", "image_size", "lambda_local"],
    }
