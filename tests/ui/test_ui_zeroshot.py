"""The Zero-shot view on the shipped checkpoint: the embeddings are the backbone's pooled
ones, every prediction equals what otviz.ot.zeroshot gives on them, accuracies and the
selective curve are the metrics of those predictions, rate 1 accepts all, the long-tailed
batch and prior follow long_tailed_counts, downloads load back, and bad input (no images,
non-images, an empty class list, a prior that does not parse or has the wrong length, a
rate out of range) gives clean errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gradio as gr
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure
from PIL import Image

from otviz.eval.classification_metrics import accuracy, selective_accuracy
from otviz.eval.classification_tables import (
    pooled_image_embeddings,
    pooled_text_embeddings,
    temperature,
)
from otviz.eval.zero_shot_run import CURVE_RATES, run_zero_shot
from otviz.explain import InputError
from otviz.ot.zeroshot import (
    LONG_TAILED_RULES,
    long_tailed_predict,
    selective_predict,
    zero_shot_predict,
)
from otviz.ui.app import build_shared_inputs
from otviz.ui.zeroshot_tab import (
    CUSTOM,
    LAYOUTS,
    LONG_TAILED,
    PRIOR_RULES,
    RULE_LABELS,
    SELECTIVE_RULES,
    TAB_TITLE,
    TEMPLATE,
    UNIFORM,
    UPLOAD,
    WORLD,
    ZERO_SHOT_RULES,
    build_zeroshot_tab,
    class_prompts,
    label_prior,
    load_images,
    parse_classes,
    parse_prior,
    world_batch,
    world_classes,
    zero_shot_view,
)
from otviz.world import ClassificationView, long_tailed_counts
from tests.helpers import api_parameters

N_IMAGES = 24


@pytest.fixture(scope="module")
def backbone(ctx, checkpoint):
    return ctx.explainer(checkpoint).backbone


@pytest.fixture(scope="module")
def batch():
    return world_batch("shape", 0, N_IMAGES)


@pytest.fixture(scope="module")
def embeddings(backbone, batch):
    images, _, classes = batch
    prompts = class_prompts(classes)
    return pooled_image_embeddings(backbone, images), pooled_text_embeddings(backbone, prompts)


@pytest.fixture(scope="module")
def view(backbone):
    return zero_shot_view(backbone, WORLD, None, "shape", 0, N_IMAGES, LAYOUTS[0],
                          "\n".join(world_classes("shape")), TEMPLATE, CUSTOM,
                          "1, 2, 3, 4, 5, 6, 7, 8", 0.5)


def test_embeddings_are_the_backbones_pooled_ones(backbone, batch, embeddings):
    images, _, classes = batch
    prompts = class_prompts(classes)
    image_emb, class_emb = embeddings
    pairs = backbone.encode(images[: len(prompts)], prompts)
    torch.testing.assert_close(image_emb[: len(prompts)], pairs.image_global.float())
    torch.testing.assert_close(class_emb, pairs.text_global.float())
    scale = float(backbone.model.logit_scale.detach().exp())
    assert temperature(backbone) == pytest.approx(1 / scale)


def test_world_batch_and_prompts():
    images, labels, classes = world_batch("shape", 0, N_IMAGES)
    ref_images, ref_labels = ClassificationView("shape", "test", 0).batch(range(N_IMAGES))
    np.testing.assert_array_equal(np.stack(images), ref_images)
    np.testing.assert_array_equal(labels, ref_labels)
    for task in ("shape", "colour", "colour_shape"):
        view = ClassificationView(task, template="a photo of {}")
        assert class_prompts(world_classes(task), TEMPLATE) == view.prompts()
    assert class_prompts(["apple", "Owl", "cat"], "an image of a {}.") == [
        "an image of an apple.", "an image of an Owl.", "an image of a cat."
    ]
    assert class_prompts(["apple"], "{} photo") == ["apple photo"]
    # long-tailed layout: the smallest imbalance-10 set with at least N images
    _, lt_labels, _ = world_batch("shape", 0, 40, LAYOUTS[1])
    counts = np.bincount(lt_labels, minlength=8).tolist()
    n_max = counts[0]
    assert counts == long_tailed_counts(8, n_max, 10.0)
    assert sum(counts) >= 40 > sum(long_tailed_counts(8, n_max - 1, 10.0))


def test_predictions_equal_the_classify_outputs(backbone, batch, embeddings):
    images, labels, classes = batch
    image_emb, class_emb = embeddings
    eps = temperature(backbone)
    prior = torch.arange(1.0, 9.0, dtype=torch.float64)
    run = run_zero_shot(backbone, images, classes, class_prompts(classes), prior=prior,
                        rate=0.5, labels=labels, label_names=classes)
    for rule in ZERO_SHOT_RULES:
        ref = zero_shot_predict(image_emb, class_emb, rule, eps=eps)
        torch.testing.assert_close(run.predictions[rule].labels, ref.labels)
        torch.testing.assert_close(run.predictions[rule].scores, ref.scores)
    assert set(run.predictions) == {*ZERO_SHOT_RULES, *PRIOR_RULES}
    for rule, alpha0 in LONG_TAILED_RULES.items():
        ref = long_tailed_predict(image_emb, class_emb, prior.float(), eps=eps, alpha0=alpha0)
        torch.testing.assert_close(run.predictions[rule].scores, ref.scores)
    for rule in SELECTIVE_RULES:
        ref = selective_predict(image_emb, class_emb, 0.5, rule, eps=eps)
        torch.testing.assert_close(run.selective[rule].accepted, ref.accepted)
        torch.testing.assert_close(run.selective[rule].labels, ref.labels)
        assert int(ref.accepted.sum()) == N_IMAGES // 2
    truth = torch.from_numpy(labels)
    assert run.accuracy() == {r: accuracy(p.labels, truth) for r, p in run.predictions.items()}
    torch.testing.assert_close(run.prior, prior / prior.sum())
    # the selective curve: one point per rate, each the metric of that rate's prediction
    for rule, (coverage, acc) in run.curves.items():
        expected = [selective_accuracy(p.labels, truth, p.accepted) for p in (
            selective_predict(image_emb, class_emb, r, rule, eps=eps) for r in CURVE_RATES)]
        expected = [e for e in expected if not math.isnan(e["accuracy"])]
        assert coverage == [e["coverage"] for e in expected]
        assert acc == [e["accuracy"] for e in expected]


def test_rate_one_accepts_all_and_zero_none(backbone, batch):
    images, labels, classes = batch
    everything = run_zero_shot(backbone, images, classes, class_prompts(classes), rate=1.0,
                               labels=labels, label_names=classes)
    assert all(bool(p.accepted.all()) for p in everything.selective.values())
    softmax = everything.predictions["softmax"].labels
    for rule, s in everything.selective_accuracy().items():
        assert s["coverage"] == 1.0 and s["n_accepted"] == N_IMAGES
        # no class constraint: every rule labels an image by its softmax argmax
        torch.testing.assert_close(everything.selective[rule].labels, softmax)
        assert s["accuracy"] == everything.accuracy()["softmax"]
    nothing = run_zero_shot(backbone, images, classes, class_prompts(classes), rate=0.0)
    assert not any(bool(p.accepted.any()) for p in nothing.selective.values())


def test_view_outputs_and_downloads(view, backbone):
    summary, table, acc_fig, sel_fig, gallery, pending = view
    files = pending.write()
    images, labels, classes = world_batch("shape", 0, N_IMAGES)
    prior = torch.arange(1.0, 9.0, dtype=torch.float64)
    run = run_zero_shot(backbone, images, classes, class_prompts(classes), prior=prior,
                        rate=0.5, labels=labels, label_names=classes)
    assert len(table) == N_IMAGES == len(gallery)
    assert list(table["true"]) == [classes[k] for k in labels]
    for rule, pred in run.predictions.items():
        assert list(table[RULE_LABELS[rule]]) == [classes[k] for k in pred.labels.tolist()]
    for rule, pred in run.selective.items():
        assert list(table[f"accepted by {SELECTIVE_RULES[rule]}"] == "yes") == \
            pred.accepted.tolist()
    for rule, acc in run.accuracy().items():
        assert f"{RULE_LABELS[rule]} **{acc:.3f}**" in summary
    assert isinstance(acc_fig, Figure) and isinstance(sel_fig, Figure)
    heights = [p.get_height() for p in acc_fig.axes[0].patches]
    np.testing.assert_allclose(heights, list(run.accuracy().values()))
    lines = [line for line in sel_fig.axes[0].get_lines() if line.get_label() in
             SELECTIVE_RULES.values()]
    assert len(lines) == 3
    assert gallery[0][1].startswith(f"#0 | true: {classes[labels[0]]}")
    names = [Path(f).name for f in files]
    assert names == ["zero_shot_accuracy.png", "selective_curve.png",
                     "zero_shot_predictions.csv", "zero_shot.json"]
    assert Image.open(files[0]).size[0] > 100
    pd.testing.assert_frame_equal(pd.read_csv(files[2]), table, check_dtype=False)
    saved = json.loads(Path(files[3]).read_text())
    assert saved["classes"] == classes
    assert saved["predictions"]["fgw_pgd"] == run.predictions["fgw_pgd"].labels.tolist()
    np.testing.assert_allclose(saved["label_prior"], (prior / prior.sum()).numpy())


def test_uploads_have_predictions_only(backbone, tmp_path):
    images, _, classes = world_batch("colour", 1, 3)
    paths = []
    for k, im in enumerate(images):
        paths.append(tmp_path / f"up{k}.png")
        Image.fromarray(im).save(paths[-1])
    summary, table, acc_fig, sel_fig, gallery, files = zero_shot_view(
        backbone, UPLOAD, [str(p) for p in paths], "shape", 0, 8, LAYOUTS[0],
        "\n".join(classes), TEMPLATE, UNIFORM, "", 0.5,
    )
    assert "Labels unknown" in summary and "true" not in table.columns and len(table) == 3
    image_emb = pooled_image_embeddings(backbone, [np.asarray(Image.open(p)) for p in paths])
    class_emb = pooled_text_embeddings(backbone, class_prompts(classes))
    ref = zero_shot_predict(image_emb, class_emb, "softmax", eps=temperature(backbone))
    assert list(table[RULE_LABELS["softmax"]]) == [classes[k] for k in ref.labels.tolist()]
    assert not acc_fig.axes[0].patches  # a message, no bars
    np.testing.assert_array_equal(load_images([str(paths[0])])[0], images[0])


def test_class_list_without_the_world_classes_shows_no_accuracy(backbone):
    summary, table, *_ = zero_shot_view(backbone, WORLD, None, "shape", 0, 6, LAYOUTS[0],
                                        "dog, cat", TEMPLATE, UNIFORM, "", 0.5)
    assert "accuracy not shown" in summary and "true" not in table.columns


def test_priors():
    classes = ["circle", "square", "star"]
    torch.testing.assert_close(parse_prior("star: 1, circle:4,square :2", classes),
                               torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(parse_prior("4\n2\n1", classes),
                               torch.tensor([4.0, 2.0, 1.0], dtype=torch.float64))
    uniform = label_prior(UNIFORM, "", classes)
    torch.testing.assert_close(uniform, torch.ones(3, dtype=torch.float64))
    lt = label_prior(LONG_TAILED, "", world_classes("shape"))
    np.testing.assert_allclose(lt / lt.sum(), np.array(long_tailed_counts(8, 1000, 10.0))
                               / sum(long_tailed_counts(8, 1000, 10.0)))
    assert float(lt[0] / lt[-1]) == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("1, 2", "2 weights for 3 classes"),
        ("1, 2, 3, 4", "4 weights for 3 classes"),
        ("circle:1, square:2", "missing"),
        ("circle:1, square:2, star:1, moon:3", "unknown"),
        ("circle:1, square:2, circle:3", "once"),
        ("circle:1, 2, 3", "either"),
        ("1, two, 3", "numbers"),
        ("1, -2, 3", ">= 0"),
        ("0, 0, 0", "not all 0"),
        ("1, inf, 3", "finite"),
    ],
)
def test_bad_priors(text, message):
    with pytest.raises(InputError, match=message):
        parse_prior(text, ["circle", "square", "star"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source": UPLOAD, "files": None}, "no images"),
        ({"source": UPLOAD, "files": []}, "no images"),
        ({"classes_text": " \n , "}, "class list is empty"),
        ({"classes_text": "circle"}, "at least two"),
        ({"classes_text": "circle, square, circle"}, "repeated"),
        ({"rate": 1.5}, "between 0 and 1"),
        ({"rate": -0.1}, "between 0 and 1"),
        ({"prior_preset": CUSTOM, "prior_text": "1, 2"}, "2 weights for 8 classes"),
        ({"prior_preset": CUSTOM, "prior_text": "circle:x"}, "prior"),
        ({"template": "a photo"}, "template"),
        ({"n_images": 0}, "number of images"),
        ({"n_images": 1000}, "number of images"),
        ({"task": "texture"}, "task"),
    ],
)
def test_errors_are_clean(backbone, overrides, message):
    args = {
        "source": WORLD, "files": None, "task": "shape", "seed": 0, "n_images": 4,
        "layout": LAYOUTS[0], "classes_text": "\n".join(world_classes("shape")),
        "template": TEMPLATE, "prior_preset": UNIFORM, "prior_text": "", "rate": 0.5,
    }
    args.update(overrides)
    with pytest.raises(InputError, match=message):
        zero_shot_view(backbone, **args)


def test_non_image_and_huge_uploads_are_refused(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    with pytest.raises(InputError, match="notes.txt is not an image"):
        load_images([str(text)])
    huge = tmp_path / "huge.png"
    Image.new("1", (9000, 6000)).save(huge)  # 54 MP, a few kB
    with pytest.raises(InputError, match="too large"):
        load_images([str(huge)])
    with pytest.raises(InputError, match="empty"):
        parse_classes("")


def test_builder_wires_the_tab(ctx):
    with gr.Blocks() as demo:
        shared = build_shared_inputs(ctx)
        with gr.Tab(TAB_TITLE):
            build_zeroshot_tab(ctx, shared)
    # the task's classes and the run (its downloads step is not an endpoint)
    assert api_parameters(demo) == {
        "/zero_shot_classes": ["task"],
        "/zero_shot": ["checkpoint", "features", "image_size", "source", "files", "task", "seed",
                       "n_images", "layout", "classes", "template", "prior_preset", "prior_text",
                       "rate"],
    }
