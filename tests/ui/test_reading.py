"""The features picker, layer slider and input-size control (issue 41, items 2 and 3, the
app's side; issue 53.4): the choice travels as every endpoint's ``features`` and
``image_size`` parameters, inside the app as the context's value (the entry with the reading
appended), is checked like any input, and every view reads the backbone that way. Each
view's maps on a non-default reading equal those of a context whose backbone *is*
``Backbone.with_features(...)`` (the source's own features) and differ from the default's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from otviz.errors import InputError, UserInputError
from otviz.methods import METHODS
from otviz.suite import WORLD_FIT_CAPTIONS
from otviz.ui.align.views import align_view
from otviz.ui.anchors_tab import anchor_maps_view
from otviz.ui.context import EMBEDDED, AppContext, BackboneChoice
from otviz.ui.examples import load_examples
from otviz.ui.phrases_tab import phrases_view
from otviz.ui.probe_tab import run_probe
from otviz.ui.reading import (
    DEFAULT_READING,
    Reading,
    named_reading,
    offered_sizes,
    split_reading,
    with_reading,
)
from otviz.ui.reading_controls import control_state, reading_of

ENTRY = "otviz-tiny (embedded) · training-free"


@pytest.fixture(scope="module")
def sample() -> tuple[np.ndarray, str]:
    example = load_examples()[0]
    return np.asarray(Image.open(example.image_path).convert("RGB")), example.caption


def test_a_reading_round_trips_through_the_picker_value():
    assert with_reading(ENTRY, DEFAULT_READING) == ENTRY
    value = with_reading(ENTRY, Reading("layer:2", 448))
    assert value == f"{ENTRY} · features layer:2 · 448 px"
    assert split_reading(value) == (ENTRY, Reading("layer:2", 448))
    assert split_reading(f"{ENTRY} · features SCLIP") == (ENTRY, Reading("sclip"))
    assert with_reading(value, Reading("naclip")) == f"{ENTRY} · features naclip"
    assert split_reading(ENTRY) == (ENTRY, DEFAULT_READING)
    assert split_reading(f"{ENTRY} · features layer:-1") == (ENTRY, Reading("layer:-1"))
    assert offered_sizes(224, True) == [224, 336, 448] and offered_sizes(224, False) == [224]


@pytest.mark.parametrize(("tail", "field"), [
    ("features layer:x", "features"), ("features deepest", "features"),
    ("features ", "features"), ("-3 px", "image size"), ("big px", "image size"),
    ("0 px", "image size"),
    # one part of each, sizes and blocks in ASCII digits (issue 50.6, issue 49.5)
    ("features sclip · features layer:2", "features"), ("features layer:\u0663", "features"),
    ("features layer:+1", "features"), ("features layer:1_0", "features"),
    ("\u0662\u0662\u0664 px", "image size"), ("2_24 px", "image size"),
    ("+224 px", "image size"), ("224 px · 448 px", "image size")])
def test_a_bad_reading_is_a_message_naming_its_control(tail, field):
    with pytest.raises(UserInputError, match=f"^{field}:"):
        split_reading(f"{ENTRY} · {tail}")


def test_the_context_checks_the_reading_on_the_backbone(ctx):
    with pytest.raises(InputError, match="image size: 4000 px is not offered"):
        ctx.explainer(f"{ENTRY} · 4000 px")
    with pytest.raises(UserInputError, match="features: .*outside"):
        ctx.explainer(f"{ENTRY} · features layer:40")
    native = ctx.sizes(ENTRY)[0]
    assert ctx.reading(f"{ENTRY} · {native} px")[1] == DEFAULT_READING  # native = default
    assert ctx.explainer(f"{ENTRY} · {native} px") is ctx.explainer(ENTRY)
    read = ctx.explainer(f"{ENTRY} · features sclip")
    assert read is ctx.explainer(f"{ENTRY} · features sclip")  # kept: encodes once
    assert str(read.backbone.features) == "sclip" and read.backbone.model is (
        ctx.explainer(ENTRY).backbone.model)  # a view of the same model


def test_the_controls_keep_what_the_backbone_offers(ctx):
    state = control_state(ctx, ENTRY, reading_of("layer:K", 1, ctx.sizes(ENTRY)[2]))
    assert state.value == with_reading(ENTRY, Reading("layer:1", ctx.sizes(ENTRY)[2]))
    assert state.form == "layer:K" and state.layer == 1
    assert [v for _, v in state.sources] == list(
        ctx.explainer(ENTRY).backbone.image_tower.sources())
    state = control_state(ctx, ENTRY, reading_of("sclip", 0, 999))  # a size not offered
    assert state.value == f"{ENTRY} · features sclip" and state.side == ctx.sizes(ENTRY)[0]


@pytest.fixture(scope="module", params=[("layer:1", 0), ("clearclip", 0), ("sclip", 2)])
def reading(request) -> tuple[str, int]:
    """A feature source and the index of an offered input size (0: native)."""
    return request.param


def test_the_named_parameters_give_the_picker_value_they_read():
    """``features`` and ``image_size`` by name (issue 53.4): empty is the default, the
    native side is the native reading, each checked like the picker's parts."""
    assert named_reading(ENTRY, None, None, 224) == ENTRY
    assert named_reading(ENTRY, "", 224, 224) == ENTRY
    assert named_reading(ENTRY, "SCLIP", 448.0, 224) == with_reading(ENTRY, Reading("sclip", 448))
    assert named_reading(ENTRY, "layer:-1", 0, 224) == with_reading(ENTRY, Reading("layer:-1"))
    with pytest.raises(UserInputError, match="^features:"):
        named_reading(ENTRY, "layer:x", None, 224)
    with pytest.raises(UserInputError, match="^image size:"):
        named_reading(ENTRY, "sclip", 448.5, 224)
    with pytest.raises(UserInputError, match="^image size:"):
        named_reading(ENTRY, "sclip", -1, 224)


@pytest.mark.parametrize("old", [" · features sclip", " · 448 px", " · features sclip · 448 px",
                                 " · features last", " · 224 px"])
def test_a_reading_in_the_checkpoint_is_refused_naming_the_parameters(old):
    """An old-style value (the reading written into the checkpoint) is refused, even the
    reading the parameters name and the default written out: the page's picker names the
    model and head set only."""
    entry, reading = split_reading(ENTRY + old)
    assert entry == ENTRY
    for features, side in ((None, None), ("naclip", 336), (reading.features, reading.image_size)):
        with pytest.raises(UserInputError, match="^checkpoint:.*features and image_size param"):
            named_reading(ENTRY + old, features, side, 224)


@pytest.fixture(scope="module")
def contexts(ctx, reading, tmp_path_factory):
    """``(ctx, value, reference)``: the app's context and the picker value asking for
    ``reading``, and a context whose only backbone is the embedded one already read so
    (``with_features``), picked by ``ENTRY``."""
    source, size = reading
    side = ctx.sizes(ENTRY)[size] if size else None
    read = ctx.explainer(ENTRY).backbone.with_features(source, side)
    reference = AppContext([BackboneChoice(EMBEDDED, lambda: read, WORLD_FIT_CAPTIONS,
                                           knows_only_world=True)])
    return ctx, with_reading(ENTRY, Reading(source, side)), reference


def test_the_encoded_features_are_the_sources_own(contexts, sample):
    ctx, value, reference = contexts
    backbone = reference.explainer(ENTRY).backbone
    got = ctx.explainer(value).encode(*sample).features
    with torch.no_grad():
        own = backbone.encode([sample[0]], [sample[1]])
    torch.testing.assert_close(got.patches, own.patches, rtol=0, atol=0)
    last = ctx.explainer(ENTRY).encode(*sample).features
    assert got.grid == own.grid
    assert got.grid != last.grid or not torch.allclose(got.patches, last.patches)


def test_every_view_draws_the_sources_maps(contexts, sample):
    """Align (every method's heatmap), Words (per-word maps), Anchors (ConceptOT's anchor
    kernels), Phrases (PowerCLIP's region-node scores) and Probe (every method's combined
    score of the caption and its edits): on the reading, equal to the reference context's;
    on the default, different. (Zero-shot reads the pooled embeddings only, which no
    feature source changes.)"""
    ctx, value, reference = contexts

    def views(c: AppContext, checkpoint: str) -> dict[str, np.ndarray]:
        explainer = c.explainer(checkpoint)
        aligned = align_view(explainer, c.suite(checkpoint), *sample)
        encoded = explainer.encode(*sample)
        out = {f"align {m}": np.asarray(h, dtype=float) for m, h in aligned.heats.items()
               if not METHODS[m].flat_map}  # a flat map is the same on any features
        out["words"] = explainer.word_similarity(encoded).numpy()
        out["anchors"] = anchor_maps_view(c, checkpoint, *sample).kernel
        out["phrases"] = phrases_view(c, checkpoint, *sample).q
        out["probe"] = run_probe(explainer, c.suite(checkpoint), *sample).combined()
        return out

    got, want, default = views(ctx, value), views(reference, ENTRY), views(ctx, ENTRY)
    assert got.keys() == want.keys() and len(got) > 4
    changed = set()
    for name in got:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)
        if got[name].shape != default[name].shape or not np.allclose(got[name], default[name]):
            changed.add(name.split()[0])
    # every view changes (a map may not: PowerCLIP's subset can be every region either way)
    assert changed == {"align", "words", "anchors", "phrases", "probe"}


def test_a_control_change_writes_the_named_reading_and_leaves_the_picker(ctx):
    """The controls' page events (no API endpoint): block K shows the slider and writes
    ``layer:K``; another backbone pick keeps the choice; the size control writes its side;
    the picker is no output of theirs (its value names the model and head set only)."""
    import gradio as gr

    from otviz.ui.reading_controls import build_reading_controls

    with gr.Blocks() as blocks:
        picker = gr.Dropdown([ENTRY], value=ENTRY, allow_custom_value=True)
        controls = build_reading_controls(ctx, picker)
    events = [f for f in blocks.fns.values() if f.fn is not None]
    assert len(events) == 4 and all(f.api_visibility == "private" for f in events)
    assert all(picker._id not in [c._id for c in f.outputs] for f in events)
    on_change = events[0].fn
    assert controls.features.value == "last" and not controls.layer.visible
    assert (controls.features_value.value, controls.size_value.value) == ("last", 0)
    side = ctx.sizes(ENTRY)[1]
    features, layer, size, _, *named = on_change(ENTRY, "layer:K", 3, side)
    assert named == ["layer:3", side]  # every endpoint's features and image_size
    assert layer.visible and layer.value == 3 and features.value == "layer:K"
    assert size.value == side
    picked = f"{ENTRY.split(' · ')[0]} · training-free, ConceptOT faithful"
    assert on_change(picked, "layer:K", 3, side)[-2:] == ("layer:3", side)  # a pick keeps it
    _, layer, size, _, *named = on_change(picked, "maskclip", 3, ctx.sizes(ENTRY)[0])
    assert not layer.visible and named == ["maskclip", 0]  # the native side: 0
