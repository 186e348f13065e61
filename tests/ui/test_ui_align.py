"""The Align view on the shipped checkpoint: eight heatmap panels with grounding boxes, the
plan matrix and its marginals, the score table, phrase changes from cache, clean errors,
downloads that load back; and the raster panels and download helpers it is built on."""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import gradio as gr
import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from otviz.backbone import ImageInputError
from otviz.eval.came_quotas import quota_ratio_table
from otviz.explain import InputError, NotComputedError
from otviz.methods import METHODS
from otviz.patch_grid.boxes import heatmap_boxes
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import (
    ALIGN_METHODS,
    METHOD_LABELS,
    SCORED_METHODS,
    MethodSuite,
    SuiteMethod,
    flat_map_reasons,
)
from otviz.ui.align import (
    TAB_TITLE,
    AlignSettings,
    align_downloads,
    align_runs,
    align_view,
    build_align_tab,
    default_phrase,
    phrase_choices,
    phrase_view,
    plan_view,
    quota_note,
    resolve_phrase,
    scores_view,
    token_labels,
)
from otviz.ui.downloads import DownloadDir
from otviz.ui.examples import load_examples
from otviz.ui.inputs import user_errors
from otviz.ui.trust_browse import trust_unavailable
from otviz.viz.panels import (
    BACKDROP,
    BAR_PX,
    BOX_COLOUR,
    GAP_PX,
    HEAT_ALPHA,
    TITLE_PX,
    colormap_lut,
    compose_heatmaps,
)
from otviz.viz.panels import overlay as heat_overlay
from otviz.viz.phrase_grid import GRID_PANEL_PX
from tests.helpers import api_parameters

LAMBDA = 0.7


@pytest.fixture(scope="module")
def sample() -> tuple[np.ndarray, str]:
    """A shipped world example, as a 224-px RGB upload, with its caption."""
    example = load_examples()[0]
    image = Image.open(example.image_path).convert("RGB").resize((224, 224))
    return np.asarray(image), example.caption


@pytest.fixture(scope="module")
def view(tools, sample):
    explainer, suite = tools
    return align_view(explainer, suite, *sample, method="dense_uot",
                      settings=AlignSettings(lambda_local=LAMBDA))


@pytest.fixture(scope="module")
def encoded(tools, sample):
    return tools[0].encode(*sample)


def _runs(tools, encoded, regions="grid"):
    return align_runs(*tools, encoded, regions)


# ----------------------------------------------------------------------- panels
def test_panels_are_the_overlays_on_one_scale_and_boxes_are_drawn():
    """Each panel of the composed raster is exactly the image blended with its heatmap on
    the shared [0, max] scale; a box appears as a cyan outline where it was asked for."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
    heats = [rng.random((3, 4)) * (k + 1) for k in range(5)]
    geometry = TokenGeometry.cell_centred((3, 4), (80, 60))
    out = compose_heatmaps(image, heats, [f"m{k}" for k in range(5)], geometry=geometry,
                           columns=3, panel_px=80)
    base = np.asarray(Image.fromarray(image).resize((80, 60), Image.Resampling.BILINEAR))
    vmax = max(float(h.max()) for h in heats)
    cell_w, cell_h = 80 + GAP_PX, TITLE_PX + 60 + GAP_PX
    for k, heat in enumerate(heats):
        x, y = (k % 3) * cell_w, (k // 3) * cell_h + TITLE_PX
        expected = heat_overlay(base, heat, geometry, 0.0, vmax)
        np.testing.assert_array_equal(out[y : y + 60, x : x + 80], expected)
    lut = colormap_lut("magma").astype(float) / 255
    reference = matplotlib.colormaps["magma"](np.linspace(0, 1, 256))[:, :3]
    np.testing.assert_allclose(lut, reference, atol=0.5 / 255)
    boxed = compose_heatmaps(image, heats[:1], ["m"], geometry=geometry,
                             boxes=[(20, 15, 60, 45)], panel_px=80)
    assert tuple(boxed[TITLE_PX + 15, 40]) == BOX_COLOUR  # top edge of the box
    assert tuple(boxed[TITLE_PX + 30, 20]) == BOX_COLOUR  # left edge
    assert tuple(boxed[TITLE_PX + 30, 40]) != BOX_COLOUR  # inside


def test_overlay_is_the_documented_blend():
    """overlay = (1 - a) * backdrop * luma + a * colour(level), a linear in the level from
    HEAT_ALPHA[0] to HEAT_ALPHA[1]: the table-driven blend is within one intensity unit of
    the formula evaluated in float64 (its opacity is quantised to the 256 colour levels)."""
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    heat = rng.random((8, 8))  # one token per pixel, on its centre: the drawing is the identity
    got = heat_overlay(image, heat, TokenGeometry.cell_centred((8, 8), (8, 8)), 0.2,
                       0.9).astype(float)
    level = np.clip((heat - 0.2) / 0.7, 0, 1)
    index = (level * 255).astype(np.uint8)
    colour = colormap_lut("magma")[index].astype(float)
    a = (HEAT_ALPHA[0] + (HEAT_ALPHA[1] - HEAT_ALPHA[0]) * level)[..., None]
    luma = image.astype(float) @ np.array([0.299, 0.587, 0.114])
    expected = (1 - a) * (BACKDROP * luma)[..., None] + a * colour
    assert np.abs(got - expected).max() <= 1.0


def test_per_panel_scales_differ_from_the_shared_scale():
    image = np.full((40, 40, 3), 128, np.uint8)
    heats = [np.eye(4), 10 * np.eye(4)]
    geometry = TokenGeometry.cell_centred((4, 4), (40, 40))
    shared = compose_heatmaps(image, heats, ["a", "b"], geometry=geometry, panel_px=40)
    own = compose_heatmaps(image, heats, ["a", "b"], geometry=geometry, panel_px=40,
                           shared_scale=False)
    base = np.full((40, 40, 3), 128, np.uint8)
    # on its own scale the weak heatmap reaches the top colour like the strong one
    np.testing.assert_array_equal(
        own[TITLE_PX : TITLE_PX + 40, :40], heat_overlay(base, heats[0], geometry, 0.0, 1.0)
    )
    np.testing.assert_array_equal(
        shared[TITLE_PX : TITLE_PX + 40, :40], heat_overlay(base, heats[0], geometry, 0.0, 10.0)
    )


# ----------------------------------------------------------------------- click
def test_click_shows_eight_heatmaps_with_their_grounding_boxes(view, encoded, tools, sample):
    assert list(view.heats) == list(ALIGN_METHODS)
    assert all(h.shape == encoded.grid for h in view.heats.values())
    maps = [view.heats[n] for n in ALIGN_METHODS]
    boxes = heatmap_boxes(torch.from_numpy(np.stack([m.reshape(-1) for m in maps])),
                          encoded.geometry).tolist()
    # a box over (nearly) the whole image localises nothing and is not drawn; a map flat by
    # construction (Global+Patch) says why in its panel, with no box
    flat = flat_map_reasons()
    notes = [flat.get(n) for n in ALIGN_METHODS]
    boxes = [None if note or (b[2] - b[0]) * (b[3] - b[1]) >= 0.9 * 224 * 224 else b
             for note, b in zip(notes, boxes, strict=True)]
    text = " ".join(encoded.words[k].text for k in resolve_phrase(encoded, view.phrase))
    # by default every panel on its own scale (QC-Align's Pi / (mu nu) as it is)
    shown = [np.clip(m, 0.0, None) for m in maps]
    titles = [METHOD_LABELS[n] + (" Π/(μν), own scale" if n == "qc_align" else "")
              for n in ALIGN_METHODS]
    expected = compose_heatmaps(
        encoded.image,
        shown,
        titles,
        geometry=encoded.geometry,
        boxes=boxes,
        shared_scale=False,
        panel_px=GRID_PANEL_PX,
        colorbar_label=f'mass of "{text}"',
        notes=notes,
    )
    np.testing.assert_array_equal(view.grid, expected)
    # eight panels in two rows of four: each panel carries its box outline
    under = BAR_PX // 2 + 14  # the per-panel colour bar
    cell_h = view.grid.shape[0] // 2
    panel = cell_h - TITLE_PX - GAP_PX - under
    for k in (k for k in range(8) if boxes[k] is not None):
        x, y = (k % 4) * (panel + GAP_PX), (k // 4) * cell_h + TITLE_PX
        x0, y0 = round(boxes[k][0] * panel / 224), round(boxes[k][1] * panel / 224)
        assert tuple(view.grid[y + y0 + 1, x + x0 + 1]) == BOX_COLOUR
    # one shared scale: QC-Align's readout is stretched to the mass panels' peak
    shared, _ = phrase_view(*tools, *sample, view.phrase,
                            settings=AlignSettings(shared_scale=True))
    qc = ALIGN_METHODS.index("qc_align")
    peak = max(float(m.max()) for k, m in enumerate(shown) if k != qc)
    shown[qc] = shown[qc] * (peak / float(shown[qc].max()))
    np.testing.assert_array_equal(shared, compose_heatmaps(
        encoded.image, shown, titles, geometry=encoded.geometry, boxes=boxes,
        panel_px=GRID_PANEL_PX,
        colorbar_label=f'mass of "{text}"', notes=notes))


def test_plan_matrix_is_the_alignment_plan_on_valid_tokens(view, tools, encoded):
    runs = _runs(tools, encoded)
    mask = encoded.features.token_mask[0]
    n, m = encoded.grid[0] * encoded.grid[1], int(mask.sum())
    z = np.asarray(view.plan.plan.data[0].z)
    assert z.shape == (n, m)
    np.testing.assert_allclose(z, runs["dense_uot"].alignment.plan.dense()[0][:, mask].numpy())
    _, texts, words = token_labels(encoded)
    trace = view.plan.plan.data[0]
    assert "%{y}<br>%{x}" in trace.hovertemplate  # a cell's hover names its patch and token
    gw = encoded.grid[1]
    for i, j in [(0, 0), (n - 1, m - 1), (gw + 2, m // 2)]:
        assert trace.y[i] == f"patch {i} (row {i // gw}, col {i % gw})"
        assert trace.x[j].endswith(f"'{texts[j]}' of word '{words[j]}'")
    assert list(view.plan.plan.layout.xaxis.ticktext) == texts
    assert len(view.plan.plan.to_json()) < 120_000  # no per-cell text matrix


@pytest.mark.parametrize("method", ALIGN_METHODS)
def test_marginals_are_the_plan_sums(tools, sample, encoded, method):
    """Row sums of the shown plan are the patch marginals, column sums the token marginals;
    the reference masses are the method's mu and nu."""
    pv = plan_view(*tools, *sample, method, token=1)
    data = pv.data
    a = _runs(tools, encoded)[method].alignment
    mask = encoded.features.token_mask[0]
    np.testing.assert_allclose(data.plan.sum(1), data.row_marginal, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(data.plan.sum(0), data.col_marginal, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(data.row_marginal, a.row_marginal[0].numpy())
    bars = pv.token_marginals.data
    np.testing.assert_allclose(bars[0].y, a.col_marginal[0, mask].numpy())
    if a.col_reference is None:
        assert data.row_reference is None and len(bars) == 1
    else:
        np.testing.assert_allclose(bars[1].y, a.col_reference[0, mask].numpy())
        np.testing.assert_allclose(data.row_reference, a.row_reference[0].numpy())
    expected_map = compose_heatmaps(
        encoded.image,
        [data.plan[:, 1].reshape(encoded.grid)],
        [f'{METHOD_LABELS[method]}: "{data.tokens[1]}"'],
        geometry=encoded.geometry,
        boxes=[None if (b[2] - b[0]) * (b[3] - b[1]) >= 0.9 * 224 * 224 else b
               for b in heatmap_boxes(torch.from_numpy(data.plan[:, 1])[None],
                                      encoded.geometry).tolist()],
        columns=1,
        panel_px=224,
        colorbar_label="token mass",
    )
    np.testing.assert_array_equal(pv.token_map, expected_map)


@pytest.mark.parametrize("method", ["balanced_ot", "qc_align"])
def test_balanced_marginal_error_is_the_shown_violation(tools, sample, view, method):
    """For the balanced solvers the table's marginal error is the L1 distance of the shown
    marginals from mu and nu (Sinkhorn ends on a column update: the columns are exact)."""
    data = plan_view(*tools, *sample, method).data
    rows = np.abs(data.row_marginal - data.row_reference).sum()
    cols = np.abs(data.col_marginal - data.col_reference).sum()
    reported = next(r.marginal_error for r in view.rows if r.name == method)
    assert rows + cols == pytest.approx(reported, rel=1e-3, abs=1e-6)
    assert cols < 1e-5


def test_score_table(view, tools, sample, encoded):
    rows = view.rows
    assert [r.name for r in rows] == list(SCORED_METHODS) and len(view.scores) == 9
    feats = encoded.features
    cosine = float(
        (F.normalize(feats.image_global, dim=-1) * F.normalize(feats.text_global, dim=-1)).sum()
    )
    for r in rows:
        assert np.isfinite([r.global_score, r.local_score, r.combined, r.ms]).all()
        assert r.combined == pytest.approx(r.global_score + LAMBDA * r.local_score, abs=1e-12)
        assert r.global_score == pytest.approx(cosine, abs=1e-5)
        assert r.source == "training-free"
    has_solver = {r.name for r in rows if r.marginal_error is not None}
    assert {"balanced_ot", "dense_uot", "conceptot", "qc_align"} <= has_solver
    assert view.scores["combined s_g + λ·s_l"].tolist() == pytest.approx(
        [r.combined for r in rows], abs=1e-4
    )
    frame, rows2 = scores_view(*tools, *sample, settings=AlignSettings(lambda_local=2.0))
    for r in rows2:
        assert r.combined == pytest.approx(r.global_score + 2.0 * r.local_score)
    bars = view.convergence.data[0]
    solved = {METHOD_LABELS[r.name]: r.marginal_error for r in rows if r.name in has_solver}
    assert dict(zip(bars.x, bars.y, strict=True)) == pytest.approx(
        {k: max(v, 1e-12) for k, v in solved.items()}
    )


# ----------------------------------------------------------------------- phrases
def test_phrase_choices_are_words_and_parse_tree_phrases(encoded):
    choices = phrase_choices(encoded)
    values = {v: label for label, v in choices}
    for k, w in enumerate(encoded.words):  # a value carries the span and its words
        assert values[f"span:{k}:{k + 1}:{w.text}"] == f'word "{w.text}"'
    nps = [n for n in encoded.parse.tree.phrases("NP") if n.end - n.start > 1]
    assert nps
    for node in nps:
        label = values[f"span:{node.start}:{node.end}:{node.span_text()}"]
        assert label.endswith(f'"{node.span_text()}"')
    first = min(nps, key=lambda n: (n.start, n.end - n.start))  # the first base NP
    assert default_phrase(encoded, choices) == (
        f"span:{first.start}:{first.end}:{first.span_text()}")


def test_phrase_heatmaps_equal_alignment_heatmap(tools, sample, encoded, view):
    runs = _runs(tools, encoded)
    np_node = next(n for n in encoded.parse.tree.phrases("NP") if n.end - n.start > 1)
    typed = np_node.span_text().upper()  # typed by hand, any case
    grid, heats = phrase_view(*tools, *sample, typed)
    select = encoded.features.text.word_mask(0, range(np_node.start, np_node.end))
    for name in ALIGN_METHODS:
        a = runs[name].alignment
        if name == "powerclip":  # its own readout: the Fig. 6 similarity on its chosen regions
            ref = METHODS[name].phrase_patch_map(a, select[None])[0]
            np.testing.assert_array_equal(heats[name].reshape(-1), ref.numpy())
            continue
        matrix = (a.plan if a.readout is None else a.readout).dense()[0]  # QC-Align: Pi/(mu nu)
        np.testing.assert_allclose(
            heats[name].reshape(-1), matrix[:, select].sum(1).numpy(), rtol=1e-5, atol=1e-8
        )
        ref = runs[name].alignment.heatmap(select[None])[0].numpy()
        np.testing.assert_array_equal(heats[name].reshape(-1), ref)
    grid_span, _ = phrase_view(*tools, *sample, f"span:{np_node.start}:{np_node.end}")
    np.testing.assert_array_equal(grid, grid_span)
    shared, _ = phrase_view(*tools, *sample, typed, settings=AlignSettings(shared_scale=True))
    assert shared.shape != grid.shape  # one bar at the right, none under each panel


def test_phrase_change_reads_the_cache(tools, sample, view, monkeypatch):
    """After a click, a phrase change neither encodes nor solves again, and is fast."""
    explainer, suite = tools

    def boom(*args, **kwargs):
        raise AssertionError("re-encoded or re-solved on a phrase change")

    monkeypatch.setattr(explainer.backbone, "encode", boom)
    for entry in suite.methods.values():
        monkeypatch.setattr(entry.method, "forward", boom)
    start = time.perf_counter()
    for _, value in view.phrase_choices:
        phrase_view(*tools, *sample, value)
    per_change = (time.perf_counter() - start) / len(view.phrase_choices)
    assert per_change < 1.0  # generous on a shared CPU; the benchmark measures the real p50


def test_reads_without_compute_use_the_cache_or_refuse(tools, sample, view):
    """``compute=False`` (the phrase and plan requests served outside the queue) gives the
    cached result of a click, and for a pair never aligned a message instead of work."""
    first = view.phrase_choices[0][1]
    cached, _ = phrase_view(*tools, *sample, first, compute=False)
    np.testing.assert_array_equal(cached, phrase_view(*tools, *sample, first)[0])
    image, caption = sample
    with pytest.raises(NotComputedError, match="click Align"):
        phrase_view(*tools, image, caption + " and a blue star", first, compute=False)
    with pytest.raises(NotComputedError):
        plan_view(*tools, image[::-1].copy(), caption, "conceptot", compute=False)
    # cached features, regions never solved: a pair this test aligns itself, so that no
    # other test (in any order) has solved its segments
    fresh = caption + " and a small green heart"
    phrase_view(*tools, image, fresh, first)
    with pytest.raises(NotComputedError):
        plan_view(*tools, image, fresh, "powerclip", settings=AlignSettings(regions="segments"),
                  compute=False)


def test_region_kind_resolves_powerclip_alone(tools, sample, encoded):
    grid_runs = _runs(tools, encoded, "grid")
    box_runs = _runs(tools, encoded, "boxes")
    for name in SCORED_METHODS:
        if name != "powerclip":
            assert box_runs[name] is grid_runs[name]
    assert not torch.equal(
        box_runs["powerclip"].alignment.extras["regions"],
        grid_runs["powerclip"].alignment.extras["regions"],
    )
    v = align_view(*tools, *sample, settings=AlignSettings(regions="segments"))
    assert len(v.heats) == 8


def test_came_temperature_control_sharpens_the_quotas_monotonically(tools, sample, encoded):
    """Lowering CAME's temperature re-solves QC-Align alone and raises its quotas'
    max/uniform ratio at every step; the note beside the control shows that ratio."""
    explainer, suite = tools
    base = _runs(tools, encoded)
    assert align_runs(*tools, encoded, came_temperature=1.0)["qc_align"] is base["qc_align"]
    ratios = []
    for temperature in (1.0, 0.5, 0.2, 0.1, 0.05):
        runs = align_runs(*tools, encoded, came_temperature=temperature)
        assert all(runs[n] is base[n] for n in SCORED_METHODS if n != "qc_align")
        alignment = runs["qc_align"].alignment
        ratio = float(alignment.extras["quota_max_over_uniform"][0])
        mu = alignment.row_reference[0]
        assert ratio == pytest.approx(float(mu.max()) * mu.numel(), rel=1e-5)
        v = align_view(*tools, *sample, method="qc_align",
                       settings=AlignSettings(came_temperature=temperature))
        assert f"max **{ratio:.2f}x** uniform at T = {temperature:g} (training-free)" \
            in v.quota_note
        ratios.append(ratio)
    assert all(later > earlier for earlier, later in zip(ratios, ratios[1:], strict=False))
    # a trained head can take another temperature; the note names the one it was trained at
    own = suite.methods["qc_align"]
    trained = MethodSuite(suite.backbone, {"qc_align": SuiteMethod(
        own.method.with_came_temperature(0.5), own.space, "heads/qc_align")}, "trained")
    assert "at T = 0.2 (head trained at T = 0.5)" in quota_note(runs, trained, 0.2)
    with pytest.raises(InputError, match="CAME temperature"):
        align_runs(*tools, encoded, came_temperature=0.0)


def test_quota_ratio_table_reports_the_views_number(tools, sample, encoded):
    """benchmarks/came_temperature.py's table: per temperature, the ratio the Align view
    shows (one pair: mean = min = max)."""
    table = quota_ratio_table(*tools, [sample], (1.0, 0.1))
    for row, temperature in zip(table.rows, (1.0, 0.1), strict=True):
        runs = align_runs(*tools, encoded, came_temperature=temperature)
        ratio = float(runs["qc_align"].alignment.extras["quota_max_over_uniform"][0])
        assert row["temperature"] == f"{temperature:g}"
        assert row["mean"] == row["min"] == row["max"] == pytest.approx(ratio)
    assert table.rows[1]["mean"] > table.rows[0]["mean"]


# ----------------------------------------------------------------------- errors
def test_bad_input_raises_clean_errors(tools, sample, encoded):
    image, caption = sample
    with pytest.raises(InputError, match="not in the caption"):
        phrase_view(*tools, image, caption, "purple elephant")
    with pytest.raises(InputError, match="not in the caption"):
        resolve_phrase(encoded, "span:3:999")
    with pytest.raises(InputError, match="pick a word"):
        phrase_view(*tools, image, caption, "  ")
    with pytest.raises(InputError, match="caption is empty"):
        align_view(*tools, image, "   ")
    with pytest.raises(InputError, match="no image"):
        align_view(*tools, None, caption)
    with pytest.raises(ImageInputError):
        align_view(*tools, np.zeros(5), caption)
    with pytest.raises(InputError, match="unknown region kind"):
        align_view(*tools, image, caption, settings=AlignSettings(regions="hexagons"))
    with pytest.raises(InputError, match="token 99"):
        plan_view(*tools, image, caption, "filip", token=99)
    wrapped = user_errors(lambda: phrase_view(*tools, image, caption, "purple elephant"))
    with pytest.raises(gr.Error, match="purple elephant"):
        wrapped()


# ----------------------------------------------------------------------- downloads
def test_downloads_load_back(tools, sample, encoded, view):
    files = [
        Path(f)
        for f in align_downloads(*tools, *sample, view.phrase, method="conceptot",
                                 settings=AlignSettings(lambda_local=LAMBDA), token=2)
    ]
    assert all(f.is_file() for f in files)
    by_name = {f.name: f for f in files}
    data = plan_view(*tools, *sample, "conceptot", token=2).data
    np.testing.assert_array_equal(np.load(by_name["plan_conceptot.npy"]), data.plan)
    with by_name["plan_conceptot.csv"].open() as handle:
        table = list(csv.reader(handle))
    assert table[0] == data.tokens
    np.testing.assert_allclose(np.array(table[1:], dtype=float), data.plan, rtol=1e-6)
    marg = np.load(by_name["patch_marginals_conceptot.npy"])
    np.testing.assert_allclose(marg[:, 0], data.plan.sum(1), rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(marg[:, 1], data.row_reference)
    tok = np.load(by_name["token_marginals_conceptot.npy"])
    np.testing.assert_array_equal(tok, np.stack([data.col_marginal, data.col_reference], 1))
    heats = np.load(by_name["phrase_heatmaps.npy"])
    np.testing.assert_array_equal(
        heats, np.stack([view.heats[n].reshape(-1) for n in ALIGN_METHODS], 1)
    )
    scores = json.loads(by_name["scores.json"].read_text())
    assert [s["name"] for s in scores["scores"]] == list(SCORED_METHODS)
    for got, row in zip(scores["scores"], view.rows, strict=True):
        assert got["combined"] == pytest.approx(row.combined)
    assert scores["tokens"] == data.tokens and scores["grid"] == list(encoded.grid)
    png = np.asarray(Image.open(by_name["phrase_heatmaps.png"]).convert("RGB"))
    np.testing.assert_array_equal(png, view.grid)
    for figure in ("plan_conceptot", "token_marginals_conceptot", "solver_convergence"):
        assert by_name[f"{figure}.png"].read_bytes()[:4] == b"\x89PNG"  # plotly, as PNG
        assert by_name[f"{figure}.html"].stat().st_size > 0  # and interactive


def test_static_twin_draws_the_plotly_figures_values():
    """The PNG twin of a plotly figure holds its data: heatmap values (on the trace's colour
    limits), grouped bar heights, line points, one panel per stacked y-axis, the titles."""
    import plotly.graph_objects as go

    from otviz.viz.plans import convergence_figure, plan_matrix_figure, token_marginal_figure
    from otviz.viz.plotly_static import static_figure
    from otviz.viz.training import loss_curves_figure

    rng = np.random.default_rng(0)
    plan = rng.random((6, 3))
    twin = static_figure(plan_matrix_figure(plan, (2, 3), ["a", "🐶", "c"], ["a", "b", "c"], "P"))
    np.testing.assert_array_equal(twin.axes[0].images[0].get_array(), plan)
    assert [t.get_text() for t in twin.axes[0].get_xticklabels()] == ["a", "U+1F436", "c"]
    assert twin.axes[0].get_ylim()[0] > twin.axes[0].get_ylim()[1]  # rows top to bottom
    bars = static_figure(token_marginal_figure(np.array([1.0, 2.0]), np.array([3.0, 4.0]),
                                               ["x", "y"], "marginals"))
    assert [r.get_height() for r in bars.axes[0].patches] == [1.0, 2.0, 3.0, 4.0]
    assert bars._suptitle.get_text() == "marginals"
    log = static_figure(convergence_figure(["A", "B"], [1e-3, None]))
    assert log.axes[0].get_yscale() == "log" and log.axes[0].get_ylim()[1] == pytest.approx(1e-2)
    curves = static_figure(loss_curves_figure(
        {"m": [{"step": 1, "loss": 2.0, "local": 0.5}]}, {"m": "M"}))
    assert len(curves.axes) == 2  # loss and local term, stacked
    assert list(curves.axes[0].lines[0].get_ydata()) == [2.0]  # one step: one point
    assert isinstance(static_figure(go.Figure()), matplotlib.figure.Figure)


def test_download_dir_writes_safe_names_and_prunes_old_requests(tmp_path):
    old = DownloadDir(root=tmp_path)
    stale = time.time() - 7200
    os.utime(old.path, (stale, stale))
    new = DownloadDir(root=tmp_path, max_age_s=3600)
    assert not old.path.exists() and new.path.is_dir()
    paths = new.save_array(torch.arange(6.0).reshape(2, 3), "../plan a", columns=["x,1", "y", "z"])
    assert [p.name for p in paths] == ["plan_a.npy", "plan_a.csv"]
    assert all(p.parent == new.path for p in paths)
    with paths[1].open() as handle:
        assert next(csv.reader(handle)) == ["x,1", "y", "z"]
    with pytest.raises(ValueError, match="column names"):
        new.save_array(np.zeros((2, 3)), "bad", columns=["a"])
    with pytest.raises(ValueError, match="1-D or 2-D"):
        new.save_array(np.zeros((2, 3, 4)), "cube")
    j = new.save_json({"a": np.float32(0.5), "b": float("nan"), "t": torch.ones(2)}, "s")
    assert json.loads(j.read_text()) == {"a": 0.5, "b": None, "t": [1.0, 1.0]}
    assert new.files == [*paths, j]


@pytest.fixture(scope="module")
def align_blocks(ctx) -> gr.Blocks:
    from otviz.ui.app import build_shared_inputs

    with gr.Blocks() as demo:
        shared = build_shared_inputs(ctx)
        with gr.Tab(TAB_TITLE):
            build_align_tab(ctx, shared)
    return demo


def test_the_public_api_names_its_parameters_in_words(align_blocks):
    """Gradio's API page and gradio_client's keyword calls use these names."""
    pair = ["image", "caption", "checkpoint", "features", "image_size"]
    expected = {
        "/align": [*pair, "method", "regions", "shared_scale", "lambda_local", "phrase",
                   "token", "came_temperature", "explainers"],
        "/align_phrase": [*pair, "regions", "shared_scale", "phrase", "came_temperature",
                          "explainers", "swapped"],
        "/align_plan": [*pair, "method", "token", "regions", "came_temperature"],
        "/align_token": [*pair, "method", "token", "regions", "came_temperature"],
        "/align_scores": [*pair, "lambda_local", "regions", "came_temperature"],
        "/align_downloads": [*pair, "phrase", "method", "regions", "shared_scale",
                             "lambda_local", "token", "came_temperature", "explainers"],
    }
    if trust_unavailable() is None:  # the Trust panel's endpoint, where Quantus is here
        expected["/align_trust"] = [*pair, "phrase", "explainers"]
    assert api_parameters(align_blocks) == expected
    returns = align_blocks.get_api_info()["named_endpoints"]["/align"]["returns"]
    assert [r["label"] for r in returns] == [
        "Phrase (a word or a parse-tree phrase; or type words)",
        "Token (its plan column on the image)", "Phrase heatmap per method",
        "Transport plan", "Token column on the image", "Patch marginals vs mu",
        "Token marginals vs nu", "Scores per method", "Solver convergence", "CAME quotas",
        "Pair token"]


def test_the_align_click_takes_and_returns_components_by_name(align_blocks, checkpoint,
                                                              sample, tools):
    """The /align callback called with keywords alone returns one value per output
    component, keyed by the component: the same view as :func:`align_view` computes."""
    fn = next(f for f in align_blocks.fns.values() if f.api_name == "align")
    by_name = dict(zip(fn.input_parameter_names, fn.inputs, strict=True))
    assert by_name["phrase"].label.startswith("Phrase") and by_name["token"].label.startswith(
        "Token") and by_name["came_temperature"].label.startswith("QC-Align: CAME")
    image, caption = sample
    shown = fn.fn(image=image, caption=caption, checkpoint=checkpoint, method="dense_uot",
                  came_temperature=None, lambda_local=LAMBDA)
    assert set(map(id, shown)) == set(map(id, fn.outputs))
    by_label = {getattr(c, "label", None): v for c, v in shown.items()}
    view = align_view(*tools, image, caption, method="dense_uot",
                      settings=AlignSettings(lambda_local=LAMBDA))
    np.testing.assert_array_equal(by_label["Phrase heatmap per method"], view.grid)
    assert by_label["Phrase (a word or a parse-tree phrase; or type words)"].value == view.phrase
    pd.testing.assert_frame_equal(by_label["Scores per method"], view.scores)
