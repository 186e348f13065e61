"""The Phrases & regions view: tree drawing, region overlays, best region subsets, the exact
powerset vs NLA table (Theorem 1, Eq. 78), downloads and clean errors, on the shipped
checkpoint."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgba

from otviz.backbone import ImageInputError
from otviz.explain import InputError, region_masks
from otviz.methods.powerclip_readout import powerset_summary
from otviz.ot.powerset import exact_r2t, exact_t2r, nla_t1, nla_t2
from otviz.patch_grid.tokens import TokenGeometry
from otviz.text.parse import phrase_nodes
from otviz.text.tree import Tree
from otviz.ui.app import build_shared_inputs
from otviz.ui.phrases_tab import (
    build_phrases_tab,
    node_label,
    phrases_view,
    summary_rows,
)
from otviz.viz.regions import FILL_ALPHA, mask_outline, regions_figure
from otviz.viz.trees import HIGHLIGHT, SUBTREE, tree_figure, tree_layout
from tests.helpers import api_parameters

CAPTION = "a small red circle to the left of a blue square"


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    rng = np.random.default_rng(0)
    return (rng.random((90, 120, 3)) * 255).astype(np.uint8)


@pytest.fixture(scope="module")
def view(ctx, checkpoint, image):
    return phrases_view(ctx, checkpoint, image, CAPTION, "boxes")


def _segments(ax) -> int:
    return sum(len(c.get_segments()) for c in ax.collections if isinstance(c, LineCollection))


@pytest.mark.parametrize(
    "bracket",
    [
        "(S (NP (NP (DT a) (JJ red) (NN circle)) (PP (IN above) (NP (DT a) (NN star)))))",
        "(S (NP (NP (DT a) (NN dog))))",  # unary chain: three nodes over one span
        "(NN dog)",
    ],
)
def test_tree_figure_has_one_box_per_node(bracket):
    tree = Tree.from_bracket(bracket)
    n = len(list(tree.nodes()))
    fig = tree_figure(tree)
    ax = fig.axes[0]
    assert len(ax.texts) == n
    assert _segments(ax) == n - 1
    layout = tree_layout(tree)
    leaves = [p for p in layout if p.node.is_leaf]
    assert [p.x for p in leaves] == list(range(len(leaves)))  # words left to right
    assert len({p.y for p in leaves}) == 1 and all(p.y <= q.y for p in leaves for q in layout)
    for p in layout:
        if p.parent >= 0:
            assert layout[p.parent].y > p.y


def test_tree_highlight_colours_the_picked_subtree():
    tree = Tree.from_bracket(
        "(S (NP (DT a) (JJ red) (NN circle)) (PP (IN above) (NP (DT a) (NN star))))"
    )
    pp = tree.children[1]
    fig = tree_figure(tree, pp, title="builtin")
    faces = [t.get_bbox_patch().get_facecolor() for t in fig.axes[0].texts]
    assert faces.count(to_rgba(HIGHLIGHT)) == 1
    assert faces.count(to_rgba(SUBTREE)) == len(list(pp.nodes())) - 1
    texts = [t.get_text() for t in fig.axes[0].texts]
    nodes = [p.node for p in tree_layout(tree)]
    assert texts[nodes.index(pp)] == "PP"  # a phrase box names its label, its words below
    assert [t for t, n in zip(texts, nodes, strict=True) if n.is_leaf] == [
        "DT\na", "JJ\nred", "NN\ncircle", "IN\nabove", "DT\na", "NN\nstar"]


def test_node_picker_lists_the_phrase_nodes(view, ctx, checkpoint, image):
    encoded = ctx.explainer(checkpoint).encode(image, CAPTION)
    nodes = phrase_nodes(encoded.parse.tree)
    assert view.nodes == nodes
    assert view.choices == [(node_label(n), k) for k, n in enumerate(nodes)]
    assert view.node == 0
    assert view.parser == encoded.parse.parser
    assert f"**{view.parser}** parser" in view.parser_note
    if view.parser == "builtin":
        assert "benepar_en3" in view.parser_note and "try_download_benepar" in view.parser_note
    assert len(view.tree_figure.axes[0].texts) == len(list(encoded.parse.tree.nodes()))
    picked = phrases_view(ctx, checkpoint, image, CAPTION, "boxes", node=2)
    assert picked.node == 2
    assert nodes[2].span_text() in picked.subset_figure.get_suptitle()


def test_exact_vs_nla_table_equals_powerset_functions(view, ctx, checkpoint, image):
    q = torch.from_numpy(view.q)[None]
    rm = torch.from_numpy(view.regions.any(-1))[None]
    nm = torch.ones(1, q.shape[-1], dtype=torch.bool)
    method = ctx.suite(checkpoint).methods["powerclip"].method
    s = view.summary
    assert s["tau"] == method.tau and s["alpha"] == method.alpha and s["M"] == rm.sum()
    q32 = q.float()
    assert s["t2r"] == pytest.approx(float(exact_t2r(q32, rm, nm)[0][0]), abs=1e-6)
    assert s["r2t"] == pytest.approx(float(exact_r2t(q32, rm, nm)[0]), abs=1e-6)
    assert s["nla_t1"] == pytest.approx(float(nla_t1(q32, method.tau, rm, nm)[0]), abs=1e-6)
    assert s["nla_t2"] == pytest.approx(
        float(nla_t2(q32, method.tau, method.alpha, rm, nm)[0]), abs=1e-6
    )
    t2r_row, r2t_row, total_row = view.summary_table
    assert t2r_row[1] == pytest.approx(s["t2r"], abs=1e-6)
    assert t2r_row[4] == pytest.approx(s["nla_t1"] - s["t2r"], abs=1e-6)
    assert r2t_row[3] == pytest.approx(s["nla_t2"], abs=1e-6)
    assert total_row[1] == pytest.approx(s["t2r"] + s["r2t"], abs=1e-6)


def _brute_force(q: np.ndarray) -> tuple[float, float]:
    """T2R and R2T by explicit Python enumeration of the region subsets (Eq. 7, 42)."""
    r, k = q.shape
    subsets = [s for n in range(r + 1) for s in itertools.combinations(range(r), n)]
    scores = np.array([[q[list(a), b].sum() for b in range(k)] for a in subsets])
    return float(scores.max(0).mean()), float(scores.max(1).mean())


@pytest.mark.parametrize("tau", [1e-3, 0.05, 0.5])
def test_theorem1_error_and_eq78_bracket(ctx, checkpoint, image, tau):
    """0 <= NLA-T1 - T2R <= tau M log 2 (Theorem 1) and Lambda(0) <= R2T <= Lambda(1)
    (Eq. 78), with T2R / R2T checked against an explicit enumeration."""
    v = phrases_view(ctx, checkpoint, image, CAPTION, "segments", tau=tau)
    s = v.summary
    t2r, r2t = _brute_force(v.q)
    assert s["t2r"] == pytest.approx(t2r, abs=1e-5)
    assert s["r2t"] == pytest.approx(r2t, abs=1e-5)
    err = s["nla_t1"] - s["t2r"]
    assert -1e-6 <= err <= tau * s["M"] * math.log(2) + 1e-6
    assert s["t1_bound"] == pytest.approx(tau * s["M"] * math.log(2))
    assert s["lambda0"] - 1e-6 <= s["r2t"] <= s["lambda1"] + 1e-6
    assert s["lambda1"] == pytest.approx(np.clip(v.q, 0, None).sum(0).max(), abs=1e-5)
    assert s["lambda0"] == pytest.approx(v.q.sum(0).max() / 2, abs=1e-5)


def test_more_regions_than_enumerable_gives_na():
    q = torch.randn(1, 13, 3, generator=torch.Generator().manual_seed(0))
    s = powerset_summary(q, torch.ones(1, 13, dtype=torch.bool),
                         torch.ones(1, 3, dtype=torch.bool), 0.01, 0.75)
    assert s["t2r"] is None and s["r2t"] is None
    rows = summary_rows(s)
    assert rows[0][1] == "n/a" and rows[0][4] == "n/a"
    assert rows[0][3] == pytest.approx(s["nla_t1"], abs=1e-6)


@pytest.mark.parametrize("kind", ["grid", "boxes", "segments"])
def test_region_overlays_match_the_masks(ctx, checkpoint, image, kind):
    v = phrases_view(ctx, checkpoint, image, CAPTION, kind)
    encoded = ctx.explainer(checkpoint).encode(image, CAPTION)
    masks = region_masks(encoded, kind).numpy()
    np.testing.assert_array_equal(v.regions, masks)
    ax = v.regions_figure.axes[0]
    layers = ax.images[1:]
    assert len(layers) == len(masks)
    for m, layer in enumerate(layers):
        alpha = np.asarray(layer.get_array())[..., 3]
        cells = encoded.geometry.pixel_masks(torch.from_numpy(masks[m]), alpha.shape[1],
                                             alpha.shape[0])  # each token's cell
        np.testing.assert_array_equal(alpha > 0, cells.numpy())
        assert alpha.max() == pytest.approx(FILL_ALPHA)
        assert layer.get_extent() == [0, image.shape[1], image.shape[0], 0]
    assert sorted(t.get_text() for t in ax.texts) == sorted(str(m) for m in range(len(masks)))


def test_mask_outline_traces_the_patch_boundary():
    """A 2 x 2 block in the middle of a 4 x 4 grid of tokens centred on an even split of an
    80 x 120 image: eight unit edges around the pixel rectangle x in [30, 90], y in
    [20, 60]; an L-shape has perimeter 8."""
    mask = np.zeros((4, 4), dtype=bool)
    mask[1:3, 1:3] = True
    geometry = TokenGeometry.cell_centred((4, 4), (120, 80))
    segs = mask_outline(mask.reshape(-1), geometry)
    assert len(segs) == 8
    pts = np.array(segs).reshape(-1, 2)
    assert pts[:, 0].min() == 30 and pts[:, 0].max() == 90
    assert pts[:, 1].min() == 20 and pts[:, 1].max() == 60
    ell = np.zeros((3, 3), dtype=bool)
    ell[0, 0] = ell[1, 0] = ell[1, 1] = True
    assert len(mask_outline(ell.reshape(-1), TokenGeometry.cell_centred((3, 3), (3, 3)))) == 8
    fig = regions_figure(np.zeros((80, 120, 3), np.uint8), mask.reshape(1, -1), geometry)
    assert _segments(fig.axes[0]) == 8


def test_best_subsets_follow_corollary1_and_the_method(view, ctx, checkpoint, image):
    """Exact best subset of each node = its regions with a positive score (Corollary 1);
    the soft panel shows the method's own memberships, sigmoid(q / tau) with the NLAs."""
    positive = (view.q > 0).T  # [K, R]
    np.testing.assert_array_equal(view.exact_best, positive)
    method = ctx.suite(checkpoint).methods["powerclip"].method
    assert not method.exact
    np.testing.assert_allclose(view.soft_best, 1 / (1 + np.exp(-view.q.T / method.tau)),
                               atol=1e-6)
    for row in view.node_table:
        k = row[0]
        chosen = np.flatnonzero(positive[k])
        assert row[3] == "{" + ", ".join(map(str, chosen)) + "}"
        assert row[4] == pytest.approx(view.q[chosen, k].sum(), abs=1e-5)
        # Theorem 1, up to float32 rounding of the two sums
        assert -1e-5 <= row[5] - row[4] <= method.tau * len(view.regions) * math.log(2) + 1e-5
    exact_ax = view.subset_figure.axes[0]
    assert len(exact_ax.images) == 1 + int(positive[view.node].sum())


def test_downloads(view):
    files = {Path(p).name: Path(p) for p in view.files.write()}
    assert {"parse_tree.png", "regions_boxes.png", "best_regions_node0.png",
            "powerset_scores.json"} <= set(files)
    np.testing.assert_allclose(np.load(files["region_node_scores.npy"]), view.q)
    np.testing.assert_array_equal(np.load(files["region_masks_boxes.npy"]), view.regions)
    meta = json.loads(files["powerset_scores.json"].read_text())
    assert meta["parser"] == view.parser
    assert Tree.from_bracket(meta["tree"]) == view.nodes[0]  # the root
    assert meta["summary"]["t2r"] == pytest.approx(view.summary["t2r"])
    assert len(meta["per_node"]) == len(view.node_table)
    assert files["parse_tree.png"].read_bytes()[:4] == b"\x89PNG"


def test_errors_are_clean(ctx, checkpoint, image):
    cases = [
        ((None, CAPTION), {}, "no image"),
        ((image, ""), {}, "caption is empty"),
        ((image, "x" * 1001), {}, "over 1000"),
        ((image, CAPTION), {"regions": "superpixels"}, "unknown region kind"),
        ((image, CAPTION), {"node": 99}, "no phrase node"),
        ((image, CAPTION), {"tau": 0.0}, "tau must be"),
        ((np.zeros((3, 3, 7), np.uint8), CAPTION), {}, "not an image"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises((InputError, ImageInputError), match=message):
            phrases_view(ctx, checkpoint, *args, **kwargs)


def test_builder_wires_into_blocks(ctx):
    with gr.Blocks() as demo:
        shared = build_shared_inputs(ctx)
        build_phrases_tab(ctx, shared)
    # the click and the node picker's edit; the other edits run the latter again
    named = ["image", "caption", "checkpoint", "features", "image_size", "regions", "node", "tau"]
    assert api_parameters(demo) == {"/phrases": named, "/phrases_node": named}


def test_the_map_beside_the_subset_is_the_phrases_own(ctx, checkpoint, image):
    """The right panel draws the picked node's phrase map (PowerCLIP's Fig. 6 similarity on
    its chosen regions, the map its pointing is scored on), and two phrase nodes of one
    caption give two different maps."""
    explainer, suite = ctx.explainer(checkpoint), ctx.suite(checkpoint)
    encoded = explainer.encode(image, CAPTION)
    extras = explainer.align(encoded, suite, ["powerclip"], "boxes")["powerclip"].alignment.extras
    maps = {}
    for _, k in phrases_view(ctx, checkpoint, image, CAPTION, "boxes").choices[:3]:
        v = phrases_view(ctx, checkpoint, image, CAPTION, "boxes", node=k)
        files = {Path(p).name: Path(p) for p in v.files.write()}
        maps[k] = np.load(files[f"phrase_map_node{k}.npy"])
        np.testing.assert_allclose(maps[k].reshape(-1), extras["node_patch_maps"][0, k].numpy(),
                                   rtol=1e-6)
        heat = v.subset_figure.axes[2].images[1]  # [0]: the picture, [1]: the map over it
        assert heat.get_extent() == [0, image.shape[1], image.shape[0], 0]
    first, *others = maps.values()
    assert any(not np.allclose(first, other) for other in others)
