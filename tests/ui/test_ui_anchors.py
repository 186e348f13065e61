"""The Anchors view: clustered anchor matrix, anchor-word affinity, top words, 2-D map,
anchor kernel maps and mass, downloads and clean errors, on the shipped checkpoint."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from otviz.boundary.text import MAX_WORDS, parse_word_list
from otviz.eval.grounding_metrics import mean_offdiag_cosine
from otviz.explain import InputError
from otviz.ui.anchors_tab import (
    WORLD_WORDS,
    anchor_bank_view,
    anchor_maps_view,
    build_anchors_tab,
    conceptot_entry,
    default_words,
    untrained_words,
)
from otviz.ui.app import build_shared_inputs
from otviz.ui.context import COMMON_CONCEPTS, EMBEDDED
from otviz.viz.anchors import anchor_matrix_figure, cluster_order, embed_2d
from otviz.viz.panels import heat_fields
from otviz.world.vocab import COLOURS, SHAPES, SIZES
from tests.helpers import api_parameters

CAPTION = "a small red circle to the left of a blue square"
WORDS = "red, blue, circle, square, small, to the left of"


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    rng = np.random.default_rng(0)
    return (rng.random((96, 112, 3)) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def bank(ctx, checkpoint):
    return anchor_bank_view(ctx, checkpoint, WORDS, "PCA")


def test_cluster_order_puts_block_anchors_adjacent():
    """Three blocks of mutually similar anchors, scattered over the indices: the clustered
    figure shows each block contiguously, and its image is the matrix in that order."""
    rng = np.random.default_rng(1)
    labels = rng.permutation(np.repeat([0, 1, 2], [4, 3, 5]))
    cos = np.where(labels[:, None] == labels[None, :], 0.9, -0.2)
    cos = cos + rng.normal(0, 0.02, cos.shape)
    cos = (cos + cos.T) / 2
    np.fill_diagonal(cos, 1.0)
    fig = anchor_matrix_figure(cos, mean_offdiag=0.1)
    ax = fig.axes[0]
    order = np.array([int(t.get_text()) for t in ax.get_xticklabels()])
    assert sorted(order) == list(range(12))
    runs = labels[order]
    assert (np.diff(runs) != 0).sum() == 2  # three contiguous blocks
    np.testing.assert_allclose(ax.images[0].get_array(), cos[np.ix_(order, order)])
    np.testing.assert_array_equal(order, cluster_order(cos))
    assert "0.100" in ax.get_title()


def test_default_words_and_word_list_parsing():
    assert default_words(f"{EMBEDDED} · training-free").split(", ") == WORLD_WORDS
    assert set(COLOURS) | set(SHAPES) | set(SIZES) <= set(WORLD_WORDS)
    assert default_words("ViT-B-16 / openai · training-free").split(", ") == COMMON_CONCEPTS
    assert parse_word_list(" red,blue ;red\n\n to the left of ") == ["red", "blue",
                                                                    "to the left of"]
    # letters of any script are letters: Arabic, Cyrillic, CJK
    assert parse_word_list("أحمر, синий; 円") == ["أحمر", "синий", "円"]
    for bad, message in [
        ("", "empty"),
        (" , ;\n", "empty"),
        ("red, !!!", "not words"),
        ("x" * 41, "over 40"),
        (", ".join(f"w{k}" for k in range(MAX_WORDS + 1)), f"at most {MAX_WORDS}"),
    ]:
        with pytest.raises(InputError, match=message):
            parse_word_list(bad)


def test_anchor_matrix_and_affinity_equal_direct_cosines(ctx, checkpoint, bank):
    entry = conceptot_entry(ctx, checkpoint)
    anchors = F.normalize(entry.method.anchors.detach().double(), dim=-1)
    np.testing.assert_allclose(bank.cosine, (anchors @ anchors.T).numpy(), atol=1e-6)
    assert bank.mean_offdiag == pytest.approx(mean_offdiag_cosine(anchors), abs=1e-9)
    r = anchors.shape[0]
    hand = (bank.cosine.sum() - np.trace(bank.cosine)) / (r * (r - 1))
    assert bank.mean_offdiag == pytest.approx(hand, abs=1e-6)
    assert bank.words == [w.strip() for w in WORDS.split(",")]
    assert bank.affinity.shape == (r, len(bank.words))
    backbone = ctx.explainer(checkpoint).backbone
    for j, word in enumerate(bank.words):  # one word at a time, as its own caption
        tokens, mask = backbone.encode_text([word], entry.space)
        concept = entry.method.proj_t(tokens[0][mask[0]]).double()
        emb = concept.mean(0)
        expected = F.cosine_similarity(anchors, emb[None], dim=-1).numpy()
        np.testing.assert_allclose(bank.affinity[:, j], expected, atol=1e-5)
    assert int(backbone.words([bank.words[-1]]).mask.sum()) == 4  # a multi-token entry


def test_top_words_table_and_figures(bank):
    r = len(bank.order)
    assert [row[0] for row in bank.table] == [int(k) for k in bank.order]
    for row in bank.table:
        k = row[0]
        best = int(np.argmax(bank.affinity[k]))
        assert bank.top[k][0] == (bank.words[best], pytest.approx(bank.affinity[k, best]))
        assert row[1].startswith(bank.words[best])
        assert row[2] == pytest.approx(bank.affinity[k, best], abs=1e-4)
        assert [c for _, c in bank.top[k]] == sorted((c for _, c in bank.top[k]), reverse=True)
    heat = bank.affinity_figure.axes[0].images[0].get_array()
    np.testing.assert_allclose(heat, bank.affinity[bank.order])
    assert [t.get_text() for t in bank.affinity_figure.axes[0].get_xticklabels()] == bank.words
    assert bank.matrix_figure.axes[0].images[0].get_array().shape == (r, r)
    assert f"{bank.mean_offdiag:.3f}" in bank.summary


def test_pca_coordinates_of_anchors_and_words(ctx, checkpoint, bank):
    """The map's coordinates are the top-2 principal components of the stacked unit
    anchors and word embeddings (checked against an SVD, up to the sign of each axis)."""
    entry = conceptot_entry(ctx, checkpoint)
    anchors = F.normalize(entry.method.anchors.detach().double(), dim=-1).numpy()
    r = anchors.shape[0]
    backbone = ctx.explainer(checkpoint).backbone
    words = []
    for word in bank.words:
        tokens, mask = backbone.encode_text([word], entry.space)
        words.append(F.normalize(entry.method.proj_t(tokens[0][mask[0]]).mean(0), dim=0))
    points = np.concatenate([anchors, torch.stack(words).double().numpy()])
    centred = points - points.mean(0)
    u, s, _ = np.linalg.svd(centred, full_matrices=False)
    reference = u[:, :2] * s[:2]
    signs = np.sign((reference * bank.coords).sum(0))
    np.testing.assert_allclose(bank.coords, reference * signs, atol=1e-4)
    scatter = bank.scatter
    assert [t.name for t in scatter.data] == ["anchors", "words"]
    np.testing.assert_allclose(scatter.data[0].x, bank.coords[:r, 0])
    np.testing.assert_allclose(scatter.data[1].y, bank.coords[r:, 1])
    # every word is named on hover; its label is drawn where it overlaps no other one
    assert [h.removeprefix("word: ") for h in scatter.data[1].hovertext] == bank.words
    shown = [t for t in scatter.data[1].text if t]
    assert shown and all(t in bank.words for t in shown)
    assert scatter.data[0].hovertext[0].startswith(f"anchor 0: {bank.top[0][0][0]}")


def test_tsne_map_is_seeded(ctx, checkpoint):
    a = anchor_bank_view(ctx, checkpoint, WORDS, "t-SNE")
    b = anchor_bank_view(ctx, checkpoint, WORDS, "t-SNE")
    np.testing.assert_array_equal(a.coords, b.coords)
    assert a.coords.shape == (len(a.order) + len(a.words), 2) and np.isfinite(a.coords).all()
    with pytest.raises(ValueError, match="at least 5"):
        embed_2d(np.eye(4), "t-SNE")


def test_untrained_words_are_flagged(ctx, checkpoint):
    """A word whose token embedding row is zero (never trained) is reported."""
    backbone = ctx.explainer(checkpoint).backbone
    table = backbone.model.text.token_embedding.weight
    ids = backbone.words(["zebra"]).ids[0]
    ids = ids[backbone.words(["zebra"]).mask[0]]
    saved = table[ids].clone()
    try:
        with torch.no_grad():
            table[ids] = 0.0
        assert untrained_words(backbone, ["red", "zebra"]) == ["zebra"]
        view = anchor_bank_view(ctx, checkpoint, "red, zebra", "PCA")
        assert "never trained" in view.summary and "zebra" in view.summary
    finally:
        with torch.no_grad():
            table[ids] = saved


def test_anchor_maps_are_kernel_columns_and_mass_sums_to_plan(ctx, checkpoint, image):
    view = anchor_maps_view(ctx, checkpoint, image, CAPTION, n_top=5)
    explainer = ctx.explainer(checkpoint)
    entry = conceptot_entry(ctx, checkpoint)
    encoded = explainer.encode(image, CAPTION)
    z = entry.method.proj_v(explainer.projected(encoded).patches[0]).double()
    anchors = F.normalize(entry.method.anchors.detach().double(), dim=-1)
    eps = entry.method.config.eps
    expected = torch.exp(-(1.0 - anchors @ z.T) / eps).numpy()  # [r, N]
    np.testing.assert_allclose(view.kernel, expected, rtol=1e-4, atol=1e-12)
    run = explainer.align(encoded, ctx.suite(checkpoint), ["conceptot"])["conceptot"]
    total = float(run.alignment.plan.dense().double().sum())
    assert view.mass.sum() == pytest.approx(total, rel=1e-4)
    assert view.shown == [int(k) for k in np.argsort(-view.mass, kind="stable")[:5]]
    ax0 = view.figure.axes[0]
    assert ax0.get_title().startswith(f"anchor {view.shown[0]} ")
    h, w = encoded.grid
    heat = np.asarray(ax0.images[1].get_array())  # drawn where the tokens look
    drawn = heat_fields(encoded.geometry, [expected[view.shown[0]].reshape(h, w)],
                        heat.shape[1], heat.shape[0])[0]
    np.testing.assert_allclose(heat, drawn, rtol=1e-4, atol=1e-12)
    picked = anchor_maps_view(ctx, checkpoint, image, CAPTION, picked=[3, 1])
    assert picked.shown == [3, 1]


def test_downloads(bank, ctx, checkpoint, image):
    files = {Path(p).name: Path(p) for p in bank.files.write()}
    assert {"anchor_cosine.png", "anchor_word_affinity.png", "anchor_word_map_PCA.html",
            "anchors.json"} <= set(files)
    np.testing.assert_allclose(np.load(files["anchor_word_affinity.npy"]), bank.affinity)
    np.testing.assert_allclose(np.load(files["anchor_cosine.npy"]), bank.cosine)
    with files["anchor_word_affinity.csv"].open() as f:
        assert next(csv.reader(f)) == bank.words
    meta = json.loads(files["anchors.json"].read_text())
    assert meta["mean_offdiag_cosine"] == pytest.approx(bank.mean_offdiag)
    assert meta["cluster_order"] == [int(k) for k in bank.order]
    assert files["anchor_cosine.png"].read_bytes()[:4] == b"\x89PNG"
    maps = anchor_maps_view(ctx, checkpoint, image, CAPTION)
    names = {Path(p).name: Path(p) for p in maps.files.write()}
    np.testing.assert_allclose(np.load(names["anchor_kernel_maps.npy"]), maps.kernel)
    assert json.loads(names["anchor_mass.json"].read_text())["shown"] == maps.shown


def test_errors_are_clean(ctx, checkpoint, image):
    with pytest.raises(InputError, match="empty"):
        anchor_bank_view(ctx, checkpoint, " ", "PCA")
    with pytest.raises(InputError, match="not words"):
        anchor_bank_view(ctx, checkpoint, "red, ???", "PCA")
    with pytest.raises(InputError, match="projection"):
        anchor_bank_view(ctx, checkpoint, "red", "UMAP")
    with pytest.raises(InputError, match="unknown checkpoint"):
        anchor_bank_view(ctx, "nope · training-free", "red", "PCA")
    with pytest.raises(InputError, match="no image"):
        anchor_maps_view(ctx, checkpoint, None, CAPTION)
    with pytest.raises(InputError, match="caption is empty"):
        anchor_maps_view(ctx, checkpoint, image, "  ")
    with pytest.raises(InputError, match="no anchor"):
        anchor_maps_view(ctx, checkpoint, image, CAPTION, picked=[999])


def test_builder_wires_into_blocks(ctx):
    with gr.Blocks() as demo:
        shared = build_shared_inputs(ctx)
        build_anchors_tab(ctx, shared)
    # a control's edit runs its endpoint again and is not an endpoint of its own
    assert api_parameters(demo) == {
        "/anchors": ["checkpoint", "features", "image_size", "words", "projection"],
        "/anchor_maps": ["image", "caption", "checkpoint", "features", "image_size", "top_k",
                         "picked", "per_map_scale"],
        "/default_words": ["checkpoint", "features", "image_size"],
    }


def test_placed_labels_never_overlap_each_other_nor_the_obstacles():
    """Dense clusters: every placed label box is disjoint from every other and from every
    obstacle marker (checked by brute force), and an isolated point always gets a label."""
    from otviz.viz.anchors import MARKER_R, _label_box, _overlaps, place_labels

    rng = np.random.default_rng(0)
    points = np.vstack([rng.normal(0, 0.05, (30, 2)), [[5.0, 5.0]]])
    obstacles = rng.normal(0, 0.05, (10, 2))
    texts = [f"word{k}" for k in range(len(points))]
    where = place_labels(points, texts, obstacles)
    assert where[-1] is not None and None in where  # the cluster cannot hold them all
    every = np.vstack([points, obstacles])
    lo, span = every.min(0), np.ptp(every, 0)
    unit, blocked = (points - lo) / span, (obstacles - lo) / span
    boxes = [_label_box(*unit[k], texts[k], w) for k, w in enumerate(where) if w]
    for i, a in enumerate(boxes):
        assert -0.05 < a[0] and a[2] < 1.05 and -0.05 < a[1] and a[3] < 1.05  # in the plot
        assert not any(_overlaps(a, b) for b in boxes[i + 1:])
        assert not any(_overlaps(a, (x - MARKER_R, y - MARKER_R, x + MARKER_R, y + MARKER_R))
                       for x, y in blocked)
