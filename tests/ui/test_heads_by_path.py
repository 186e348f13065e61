"""Trained heads in the app by path (issue 51, items 1 and 2): ``otviz app --heads DIR``,
``$OTVIZ_HEADS`` and a Space's ``heads/`` folder offer a folder that ``otviz train --publish``
wrote, named with its provenance and opened at the reading it was trained on; every view
reads it; beside other weights it is one message naming both, and the other entries keep
working. On a head-set entry, a reading the heads were not trained on draws the
training-free methods, and the line under the picker says why."""

from __future__ import annotations

import json
import os
import runpy
import shutil
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from PIL import Image

import otviz.ui.app
from otviz.checkpoints.head_folders import read_head_folder
from otviz.checkpoints.heads import head_meta, load_method_checkpoint
from otviz.checkpoints.manifest import read_manifest
from otviz.cli import main as otviz_main
from otviz.errors import InputError
from otviz.eval.browse import BrowseCache
from otviz.methods import METHODS
from otviz.suite import ALIGN_METHODS
from otviz.ui.align.choices import resolve_phrase
from otviz.ui.align.views import align_view
from otviz.ui.anchors_tab import anchor_maps_view
from otviz.ui.browse_tab import WORLD_SOURCE, BrowseSources, load_table
from otviz.ui.context import (
    EMBEDDED,
    SEPARATOR,
    SHIPPED_HEADS,
    TRAINING_FREE,
    AppContext,
)
from otviz.ui.examples import load_examples
from otviz.ui.model_sources import HEADS_ENV, ModelSource
from otviz.ui.probe_tab import run_probe
from otviz.ui.reading import DEFAULT_READING, Reading, split_reading, with_reading
from otviz.ui.reading_controls import (
    LAYER_FORM,
    best_block,
    build_reading_controls,
    control_state,
)
from tests.helpers import ROOT
from tests.shared_artifacts import TRAINED_ON, VIT, VitFiles, VitHeads, train_heads

FREE = f"{EMBEDDED}{SEPARATOR}{TRAINING_FREE}"
SHIPPED = f"{EMBEDDED}{SEPARATOR}{SHIPPED_HEADS}"


@pytest.fixture(scope="module")
def tiny_heads(tmp_path_factory) -> Path:
    """ConceptOT heads trained for 2 steps at ``clearclip`` on the embedded tiny CLIP, the
    head started random."""
    return train_heads(tmp_path_factory.mktemp("tiny"), "--start", "random")


@pytest.fixture(scope="module")
def sample() -> tuple[np.ndarray, str]:
    example = load_examples()[0]
    return np.asarray(Image.open(example.image_path).convert("RGB")), example.caption


@pytest.fixture(scope="module")
def by_path(tiny_heads, tmp_path_factory) -> tuple[AppContext, str]:
    """A context with the tiny heads given as ``otviz app --heads DIR`` (before any --model:
    the embedded model) and its new picker entry."""
    ctx = AppContext.default(heads=[(0, str(tiny_heads))], found_heads=[],
                             heads_root=tmp_path_factory.mktemp("no-shipped"))
    entries = [e for e in ctx.checkpoint_choices() if "my-heads" in e]
    assert len(entries) == 1
    return ctx, entries[0]


def _events(ctx: AppContext, value: str) -> tuple[list, object]:
    """The reading controls' page events on a picker showing ``value``, and the controls."""
    with gr.Blocks() as blocks:
        picker = gr.Dropdown([value], value=value, allow_custom_value=True)
        controls = build_reading_controls(ctx, picker)
    return [f for f in blocks.fns.values() if f.fn is not None], controls


def test_the_picker_names_the_heads_with_their_provenance(by_path, tiny_heads):
    ctx, entry = by_path
    meta = head_meta(tiny_heads / "conceptot")
    created = read_manifest(tiny_heads.parent / "manifest.json")["checkpoints"][
        "my-heads/conceptot"]["created"][:10]
    assert meta["metrics"]["steps"] == 2 and meta["backbone"]["features"] == TRAINED_ON
    assert entry == (f"{EMBEDDED}{SEPARATOR}my-heads: conceptot (world, 8 pairs, 2 steps, "
                     f"features {TRAINED_ON}, {created})")
    assert str(tiny_heads.parent) not in entry  # the folder by its last part only
    assert ctx.head_set(entry).reading == Reading(TRAINED_ON)


def test_a_pick_opens_the_heads_at_their_reading(by_path):
    """The picker's event: a pick of the head set moves the features control to the source
    it was trained on and shows its provenance; a pick of a training-free entry keeps the
    reading the controls show."""
    ctx, entry = by_path
    with gr.Blocks() as blocks:
        picker = gr.Dropdown([FREE, entry], value=FREE, allow_custom_value=True)
        controls = build_reading_controls(ctx, picker)
    on_pick = next(f.fn for f in blocks.fns.values() if f.fn is not None)
    assert not controls.note.visible
    features, _, _, note, named, side = on_pick(entry, "last", 0, None)
    assert (named, side) == (TRAINED_ON, 0) and features.value == TRAINED_ON
    assert note.visible and note.value.startswith("Trained heads (conceptot): world, 8 pairs")
    features, _, _, note, named, _ = on_pick(FREE, TRAINED_ON, 0, None)
    assert named == TRAINED_ON and not note.visible


def test_every_view_reads_the_heads_by_path(by_path, tiny_heads, sample, tmp_path):
    """Align, Anchors, Probe and Browse (the views that read ConceptOT) on the entry at its
    reading use the trained head: Align's map equals the head's own plan read directly, and
    every view differs from the training-free entry at the same reading. (Trust takes its
    methods from the same ``ctx.suite``.)"""
    ctx, entry = by_path
    value = with_reading(entry, Reading(TRAINED_ON))
    free = with_reading(FREE, Reading(TRAINED_ON))
    suite, explainer = ctx.suite(value), ctx.explainer(value)
    assert suite.methods["conceptot"].source.startswith("trained (my-heads: conceptot")
    head = load_method_checkpoint(tiny_heads / "conceptot", explainer.backbone)
    encoded = explainer.encode(*sample)
    with torch.no_grad():
        own = head(explainer.pair_batch(encoded, "width"))
    shown = align_view(explainer, suite, *sample)
    words = resolve_phrase(encoded, shown.phrase)
    want = own.heatmap(encoded.token_select(words))[0].reshape(encoded.grid).numpy()
    got = np.asarray(shown.heats["conceptot"], dtype=float)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    sources = BrowseSources(BrowseCache(), tmp_path / "features", tmp_path / "uploads")

    def browsed(checkpoint: str) -> np.ndarray:
        table = load_table(ctx, sources, checkpoint, WORLD_SOURCE, 2, "test")
        return table.heatmaps[:, table.methods.index("conceptot")].numpy()

    trained = {"align": got, "anchors": anchor_maps_view(ctx, value, *sample).kernel,
               "probe": run_probe(explainer, suite, *sample).combined(),
               "browse": browsed(value)}
    untrained = {"align": np.asarray(align_view(ctx.explainer(free), ctx.suite(free),
                                                *sample).heats["conceptot"], dtype=float),
                 "anchors": anchor_maps_view(ctx, free, *sample).kernel,
                 "probe": run_probe(ctx.explainer(free), ctx.suite(free), *sample).combined(),
                 "browse": browsed(free)}
    for view, maps in trained.items():
        other = untrained[view]
        assert maps.shape != other.shape or not np.allclose(maps, other, atol=1e-4), view


def _offered(ctx: AppContext, checkpoint: str) -> list[Reading]:
    """Every reading the controls offer on ``checkpoint``'s backbone, one control at a time:
    each source (block K at every block), each input size."""
    tower = ctx.explainer(checkpoint).backbone.image_tower
    readings = []
    for source in tower.sources():
        if source == LAYER_FORM:
            readings += [Reading(f"layer:{k}") for k in range(tower.depth)]
        else:
            readings.append(Reading(source))
    return readings + [Reading("last", side) for side in ctx.sizes(checkpoint)[1:]]


def test_every_offered_reading_of_the_default_heads_entry_draws(ctx, sample):
    """On the default entry (the shipped trained heads), every offered block, dense path and
    size draws every method; where the heads were not trained on the reading, the maps are
    the training-free entry's own and the line under the picker says why in one sentence
    (no command-line advice in a web page)."""
    assert ctx.default_checkpoint() == SHIPPED
    offered = _offered(ctx, SHIPPED)
    assert len(offered) >= 10  # 4 blocks, 5 sources, 2 more sizes on the tiny CLIP
    for reading in offered:
        state = control_state(ctx, SHIPPED, reading)
        assert split_reading(state.value)[1] == reading, reading
        suite = ctx.suite(state.value)
        shown = align_view(ctx.explainer(state.value), suite, *sample)
        assert set(ALIGN_METHODS) <= set(shown.heats), reading
        for name, heat in shown.heats.items():
            assert np.isfinite(np.asarray(heat, dtype=float)).all(), (reading, name)
        if reading == DEFAULT_READING:
            assert state.note.startswith("Trained heads (")
            assert suite.methods["conceptot"].source == f"trained ({SHIPPED_HEADS})"
            continue
        assert state.note == ("These heads were trained on features last at the native "
                              f"size; read with {_said(reading, ctx)}, the methods are "
                              "drawn training-free."), reading
        assert "otviz" not in state.note and "\n" not in state.note
        assert {m.source for m in suite.methods.values()} == {"training-free"}
        free = with_reading(FREE, reading)
        want = align_view(ctx.explainer(free), ctx.suite(free), *sample).heats
        for name in ALIGN_METHODS:
            np.testing.assert_array_equal(np.asarray(shown.heats[name], dtype=float),
                                          np.asarray(want[name], dtype=float))


def _said(reading: Reading, ctx: AppContext) -> str:
    side = f"{reading.image_size} px" if reading.image_size else "the native size"
    return f"features {reading.features} at {side}"


def test_the_block_slider_starts_mid_network(ctx):
    """The slider starts at the tower's middle block (the embedded model: block 2 of 4, its
    best-pointing intermediate block), not the last; picking "block K" reads it."""
    tower = ctx.explainer(SHIPPED).backbone.image_tower
    assert tower.depth == 4 and best_block(tower.depth) == 2 and best_block(12) == 6
    events, controls = _events(ctx, SHIPPED)
    assert controls.layer.value == 2 and not controls.layer.visible
    on_change = events[1].fn  # the features control's
    features, layer, _, note, named, _ = on_change(SHIPPED, LAYER_FORM, controls.layer.value,
                                                   ctx.sizes(SHIPPED)[0])
    assert named == "layer:2" and layer.visible
    assert note.visible and "drawn training-free" in note.value


def test_heads_on_other_weights_are_one_message_and_the_rest_works(tiny_heads, tmp_path,
                                                                  sample):
    """The same heads given for a tiny CLIP with other weights: the line under the picker
    and every view say, in one message, which weights they were trained on and which are
    loaded; that backbone's training-free entry and the embedded model keep working."""
    from tests.helpers import random_tiny_clip

    other = random_tiny_clip(tmp_path / "other-tiny", 7)
    ctx = AppContext.default(heads=[(0, str(tiny_heads))], found_heads=[],
                             heads_root=tmp_path / "none")
    from otviz.backbone import Backbone
    from otviz.suite import WORLD_FIT_CAPTIONS
    from otviz.ui.context import BackboneChoice

    ctx.backbones.append(BackboneChoice("other tiny", lambda: Backbone.from_checkpoint(other),
                                        WORLD_FIT_CAPTIONS))
    entry = ctx.add_head_folder("other tiny", read_head_folder(tiny_heads)[0])
    value = with_reading(entry, Reading(TRAINED_ON))
    loaded = ctx.loaded_weights(value)["weights"][:8]
    trained = head_meta(tiny_heads / "conceptot")["backbone"]["weights"][:8]
    message = (f"These heads were trained on otviz-tiny with weights {trained}, but this "
               f"entry loads other tiny with weights {loaded}: their features would mean "
               "something else")
    assert control_state(ctx, value, Reading(TRAINED_ON)).note.startswith(message)
    with pytest.raises(InputError) as caught:
        ctx.suite(value)
    assert str(caught.value).startswith(message) and str(tmp_path) not in str(caught.value)
    free = with_reading(f"other tiny{SEPARATOR}{TRAINING_FREE}", Reading(TRAINED_ON))
    assert align_view(ctx.explainer(free), ctx.suite(free), *sample).heats
    mine = next(e for e in ctx.checkpoint_choices() if e.startswith(EMBEDDED) and "my-heads"
                in e)
    assert ctx.suite(with_reading(mine, Reading(TRAINED_ON))).methods[
        "conceptot"].source.startswith("trained")


def test_heads_folders_from_the_environment_and_a_space(tiny_heads, tmp_path, monkeypatch,
                                                        caplog):
    """``$OTVIZ_HEADS`` (folders separated by ``os.pathsep``): each set beside the entries
    whose weights it records, a Hugging Face snapshot folder named by its repository, a
    folder that is not one of heads logged and skipped; a Space's ``heads/`` beside its
    ``app.py`` is added to the variable at start."""
    snapshot = tmp_path / "models--me--tiny-heads" / "snapshots" / "abc123"
    shutil.copytree(tiny_heads, snapshot / "heads")
    monkeypatch.setenv(HEADS_ENV, os.pathsep.join([str(snapshot), str(tmp_path / "nothing")]))
    ctx = AppContext.default(heads_root=tmp_path / "none")
    added = [e for e in ctx.checkpoint_choices() if "me/tiny-heads" in e]
    assert len(added) == 1 and added[0].startswith(f"{EMBEDDED}{SEPARATOR}me/tiny-heads: ")
    assert f"trained heads {tmp_path / 'nothing'} not offered" in caplog.text
    foreign = tmp_path / "foreign"  # heads that record weights no entry loads
    shutil.copytree(tiny_heads, foreign)
    record = json.loads((foreign / "conceptot" / "config.json").read_text())
    record["meta"]["backbone"].update(name="ViT-B-16", tags={"pretrained": "openai"})
    (foreign / "conceptot" / "config.json").write_text(json.dumps(record))
    assert AppContext.default(heads_root=tmp_path / "none",
                              found_heads=[str(foreign)]).head_sets == []
    assert "which no picker entry loads" in caplog.text and "ViT-B-16 / openai" in caplog.text
    space = tmp_path / "space"
    (space / "heads").mkdir(parents=True)
    shutil.copy(ROOT / "app.py", space / "app.py")
    monkeypatch.setenv(HEADS_ENV, "elsewhere")
    launched = []
    monkeypatch.setattr(otviz.ui.app, "launch", lambda *a, **kw: launched.append(kw))
    monkeypatch.setattr("sys.argv", ["app.py"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(space / "app.py"), run_name="__main__")
    assert launched and os.environ[HEADS_ENV] == os.pathsep.join(
        ["elsewhere", str(space / "heads")])


def test_the_command_line_gives_each_folder_to_the_model_before_it(tiny_heads, monkeypatch,
                                                                   capsys, tmp_path):
    launched = []
    monkeypatch.setattr(otviz.ui.app, "launch", lambda *a, **kw: launched.append(kw))
    argv = ["app", "--heads", str(tiny_heads), "--model", "ViT-B-16", "--pretrained",
            "a.pt", "--heads", str(tiny_heads), "--model", "RN50", "--pretrained", "openai"]
    assert otviz_main(argv) == 0
    assert launched[0]["heads"] == [(0, str(tiny_heads)), (1, str(tiny_heads))]
    assert [m.source for m in launched[0]["models"]] == ["a.pt", "openai"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as stop:
        otviz_main(["app", "--heads", str(tmp_path / "empty")])
    assert stop.value.code == 2 and "no trained heads in it" in capsys.readouterr().err
    assert len(launched) == 1


# ------------------------------------------------------------------------ a real CLIP file
@pytest.fixture(scope="module")
def vit(vit_files: VitFiles, vit_heads: VitHeads) -> dict:
    """The run's random full-size ViT-B-16 saved to two weight files of different seeds, and
    ConceptOT heads trained for 2 steps on the first at ``clearclip`` (started from its own
    projections, the default) from world samples written as webdataset shards, streamed
    (``otviz train --open-clip-model NAME --pretrained FILE --data SHARDS ... --publish
    DIR``: issue 51's end-to-end route; the streamed run writes no feature cache):
    :mod:`tests.shared_artifacts`, made once a run."""
    assert not vit_heads.cache.exists()
    return {"name": VIT, "files": list(vit_files.files), "heads": vit_heads.heads}


def test_the_served_app_draws_the_heads_at_their_reading_and_refuses_other_weights(
        vit_app, vit, sample, tmp_path, monkeypatch):
    """The app served as ``otviz app --model NAME --pretrained vit-0.pt --heads DIR --model
    NAME --pretrained vit-1.pt --heads DIR`` (:func:`tests.shared_artifacts.vit_app`, which
    serves a truncated file after them too)."""
    ctx, client = vit_app
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    good, bad = (next(e for e in ctx.checkpoint_choices()
                      if e.startswith(f"{vit['name']} / {f.name}") and "my-heads" in e)
                 for f in vit["files"])
    assert control_state(ctx, good, ctx.head_set(good).reading).value == (
        f"{good}{SEPARATOR}features {TRAINED_ON}")
    value = f"{good}{SEPARATOR}features {TRAINED_ON}"
    path = tmp_path / "example.png"
    Image.fromarray(sample[0]).save(path)
    out = client.predict(image=handle_file(str(path)), caption=sample[1], checkpoint=good,
                         features=TRAINED_ON, api_name="/align")
    sources = {row[0]: row for row in out[7]["data"]}
    label = METHODS["conceptot"].display_label()
    assert any("trained (my-heads" in str(cell) for cell in sources[label]), sources[label]
    free = with_reading(good.split(SEPARATOR)[0] + SEPARATOR + TRAINING_FREE,
                        Reading(TRAINED_ON))
    heat = np.asarray(align_view(ctx.explainer(value), ctx.suite(value), *sample)
                      .heats["conceptot"], dtype=float)
    untrained = np.asarray(align_view(ctx.explainer(free), ctx.suite(free), *sample)
                           .heats["conceptot"], dtype=float)
    assert not np.allclose(heat, untrained, atol=1e-4)
    with pytest.raises(AppError) as caught:
        client.predict(image=handle_file(str(path)), caption=sample[1],
                       checkpoint=bad, features=TRAINED_ON, api_name="/align")
    message = str(caught.value)
    assert f"trained on {vit['name']} / vit-0.pt with weights " in message
    assert f"loads {vit['name']} / vit-1.pt (local weight file) with weights " in message
    assert message.count("These heads were") == 1  # one message, not one per head
    assert "server-only-folder" not in message and "Traceback" not in message
    out = client.predict(image=handle_file(str(path)), caption=sample[1],
                         checkpoint=bad.split(SEPARATOR)[0] + SEPARATOR + TRAINING_FREE,
                         api_name="/align")
    assert len(out[7]["data"]) == len(ALIGN_METHODS) + 1  # the other entries still served
    assert json.dumps(out[7]).count("training-free") >= len(ALIGN_METHODS)


def test_listed_heads_go_beside_the_weights_they_record(vit, tmp_path):
    """``$OTVIZ_HEADS`` heads trained on ``.../vit-0.pt`` are offered beside a server's
    ``vit-0.pt`` in another folder (the same file name), not beside ``vit-1.pt``."""
    moved = tmp_path / "elsewhere" / "vit-0.pt"
    moved.parent.mkdir()
    os.link(vit["files"][0], moved)
    models = [ModelSource(vit["name"], str(moved)), ModelSource(vit["name"],
                                                                str(vit["files"][1]))]
    ctx = AppContext.default(models, heads_root=tmp_path / "none",
                             found_heads=[str(vit["heads"])])
    assert [h.backbone for h in ctx.head_sets] == [f"{vit['name']} / vit-0.pt (local weight file)"]
    assert ctx.head_sets[0].heads == {"conceptot": vit["heads"] / "conceptot"}
