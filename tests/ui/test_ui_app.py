"""The whole app: every view mounted in order with its how-to-read text, all reading the one
shared image / caption / checkpoint, and their callbacks working together on one served app
(through Gradio's own pre- and postprocessing, via gradio_client); bad input comes back as
a message, never a traceback; the picker (real CLIPs only with network, head sets)."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import gradio as gr
import httpx
import numpy as np
import pytest
import torch
from gradio_client import handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from otviz.checkpoints.heads import save_method_checkpoint
from otviz.explain import InputError
from otviz.methods import METHODS, MethodConfig
from otviz.suite import ALIGN_METHODS
from otviz.ui import context as context_module
from otviz.ui.app import BROWSE_TITLE, TRAIN_TITLE, VIEWS, build_app
from otviz.ui.context import (
    EMBEDDED,
    REMOTE_MODELS,
    SHIPPED_HEADS,
    TRAINING_FREE,
    TRAINING_FREE_FAITHFUL,
    AppContext,
    BackboneChoice,
    find_heads,
    remote_models,
)
from tests.helpers import PLAIN_HTTP, api_parameters

HOW_TO_READ = "**How to read this view.**"


def _walk(block):
    for child in getattr(block, "children", []):
        yield child
        yield from _walk(child)


@pytest.fixture(scope="module")
def built():
    ctx = AppContext.default()
    return ctx, build_app(ctx)


def test_views_in_order_each_with_how_to_read(built):
    _, app = built
    tabs = [b for b in app.blocks.values() if isinstance(b, gr.Tab)]
    assert [t.label for t in tabs] == [title for title, _ in VIEWS] + [BROWSE_TITLE, TRAIN_TITLE]
    assert tabs[0].label == "Align"
    for tab in tabs:
        notes = [b.value for b in _walk(tab) if isinstance(b, gr.Markdown)]
        assert any(str(n).startswith(HOW_TO_READ) for n in notes), tab.label


def test_every_view_reads_the_shared_inputs(built):
    ctx, app = built
    fns = {fn.api_name: fn for fn in app.fns.values()}
    image = next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == "shared-image")
    caption = next(b for b in app.blocks.values()
                   if getattr(b, "elem_id", None) == "shared-caption")
    picker = next(b for b in app.blocks.values()
                  if getattr(b, "elem_id", None) == "shared-checkpoint")
    assert picker.choices[0][0] == f"{EMBEDDED} · {TRAINING_FREE}"
    for name in ("align", "align_phrase", "anchor_maps", "phrases", "probe", "words"):
        ids = [c._id for c in fns[name].inputs]
        assert ids[:3] == [image._id, caption._id, picker._id], name
    for name in ("anchors", "zero_shot", "train"):
        assert picker._id in [c._id for c in fns[name].inputs], name
    assert picker._id in [c._id for c in fns["train"].outputs]  # new heads reach the picker
    # the reading: the controls' hidden fields, right after the picker, on every reader
    hidden = [b for b in app.blocks.values() if getattr(b, "label", None) in (
        "features", "image_size") and b.visible is False]
    assert [type(b) for b in hidden] == [gr.Textbox, gr.Number]
    readers = [fn for fn in app.fns.values() if picker._id in [c._id for c in fn.inputs]
               and "shared-features" not in [c.elem_id for c in fn.inputs]]  # not the controls'
    assert len(readers) > 20
    for fn in readers:
        ids = [c._id for c in fn.inputs]
        at = ids.index(picker._id)
        assert ids[at:at + 3] == [picker._id, *(b._id for b in hidden)], fn.name


#: Names an endpoint's parameter must not have: Gradio's positional ``param_N`` (a callback
#: taking ``*args``), and the abbreviations the tabs once exposed.
UNNAMED = re.compile(r"param_\d+")
ABBREVIATIONS = {"img", "text", "proj", "src", "spl", "fls", "meth", "ma", "mb", "hf", "kd",
                 "od", "tm", "tk", "pg", "pp", "top", "pick", "weight", "n", "name"}
#: ``*_v`` is a value's suffix, but the Train form's ``tau_v`` is TrainConfig's field: the
#: vision temperature tau_v of the papers.
SUFFIX_V_ALLOWED = {"tau_v"}


def test_every_public_endpoint_names_its_parameters_in_words(built):
    """Gradio's API page and gradio_client's keyword calls show each public endpoint's
    parameters by its callback's parameter names: none is positional or an abbreviation."""
    _, app = built
    bad = {
        endpoint: [p for p in params
                   if UNNAMED.fullmatch(p) or p in ABBREVIATIONS
                   or (p.endswith("_v") and p not in SUFFIX_V_ALLOWED)]
        for endpoint, params in api_parameters(app).items()
    }
    assert {endpoint: names for endpoint, names in bad.items() if names} == {}
    # the inputs the views share have the Align tab's names wherever they are read
    readers = {e: p[:3] for e, p in api_parameters(app).items() if "image" in p}
    assert len(readers) >= 10
    assert set(map(tuple, readers.values())) == {("image", "caption", "checkpoint")}

def test_the_views_downloads_are_written_after_their_pictures(built):
    """Probe, Zero-shot, Phrases and the two Anchors boxes are filled by the write step that
    follows each of their views' events (``offer_downloads``), never by the view itself."""
    from otviz.ui.downloads import write_downloads

    _, app = built
    boxes = {b._id: b.elem_id for b in app.blocks.values()
             if isinstance(b, gr.File) and (b.elem_id or "").endswith("-downloads")}
    assert sorted(boxes.values()) == ["anchors-bank-downloads", "anchors-maps-downloads",
                                      "phrases-downloads", "probe-downloads",
                                      "zeroshot-downloads"]
    steps = [fn for fn in app.fns.values()
             if fn.fn is not None and inspect.unwrap(fn.fn) is write_downloads]
    for fn in app.fns.values():
        assert not {c._id for c in fn.outputs} & set(boxes) or fn in steps
    for step in steps:
        before = app.fns[step.trigger_after]
        assert [c._id for c in step.inputs] == [step.outputs[1]._id]  # the view's state only
        assert step.outputs[1]._id in {c._id for c in before.outputs}
    assert {step.outputs[0].elem_id for step in steps} == set(boxes.values())


def test_clicking_an_example_runs_align(built):
    """The examples' loader (a click on a sample) is followed, on success, by the Align
    click itself: the same callback, inputs and outputs as the Align button's."""
    _, app = built
    align = app.fns[next(k for k, f in app.fns.items() if f.api_name == "align")]
    examples = next(b for b in app.blocks.values() if isinstance(b, gr.Dataset))
    loads = [k for k, f in app.fns.items() if (examples._id, "click") in
             [(t[0], t[1]) for t in f.targets]]
    follows = [f for f in app.fns.values() if f.trigger_after in loads
               and f.trigger_only_on_success and f.fn is not None
               and inspect.unwrap(f.fn) == inspect.unwrap(align.fn)]
    assert len(loads) == 1 and len(follows) == 1
    assert follows[0].inputs == align.inputs and follows[0].outputs == align.outputs
    assert follows[0].api_visibility == "private"


def test_every_callback_turns_errors_into_page_messages(built):
    _, app = built
    callbacks = [fn.fn for fn in app.fns.values() if fn.fn is not None]
    assert len(callbacks) > 20
    assert all(getattr(fn, "page_errors", False) for fn in callbacks)


def test_callbacks_work_together_on_one_server(client, example, live_app):
    """One image and caption through every view of one served app: the Align click fills
    the feature cache the others read, the phrase change reuses it."""
    path, caption = example
    checkpoint = live_app.ctx.checkpoint_choices()[0]
    img = handle_file(path)
    out = client.predict(image=img, caption=caption, checkpoint=checkpoint, method="conceptot",
                         regions="grid", shared_scale=True, lambda_local=0.5, api_name="/align")
    (phrase, token, grid, plan, token_map, patch_marg, token_marg, scores, convergence, quotas,
     pair) = out
    assert len(pair) == 16 and int(pair, 16) >= 0  # the token the page's phrase swaps check
    assert "CAME quotas: max" in quotas
    width = Image.open(path).width
    assert Image.open(grid["path"]).width > 4 * min(width, 100)  # eight panels side by side
    plan_fig = json.loads(plan["plot"])
    assert plan_fig["data"][0]["type"] == "heatmap"
    assert len(scores["data"]) == len(ALIGN_METHODS) + 1  # + Global-only
    choices = [v for _, v in phrase["choices"]]
    assert phrase["value"] in choices

    encoded_before = len(live_app.ctx.explainer(checkpoint)._cache)
    other = client.predict(image=img, caption=caption, checkpoint=checkpoint, regions="grid",
                           shared_scale=True, phrase=choices[-1], api_name="/align_phrase")
    assert Path(other["path"]).is_file()
    assert len(live_app.ctx.explainer(checkpoint)._cache) == encoded_before  # no re-encode

    shared = {"image": img, "caption": caption, "checkpoint": checkpoint}
    words = client.predict(**shared, api_name="/words")
    assert words[0]["choices"]
    anchors = client.predict(checkpoint=checkpoint, words="red, circle, square",
                             projection="PCA", api_name="/anchors")
    assert anchors[3]["data"]  # one row per anchor
    maps = client.predict(**shared, top_k=4, picked=[], per_map_scale=False,
                          api_name="/anchor_maps")
    assert maps["type"] == "matplotlib" and maps["plot"]  # downloads follow in the page
    phrases = client.predict(**shared, regions="grid", node=None, tau=None,
                             api_name="/phrases")
    assert phrases[0]["choices"] and "parser" in phrases[6]
    probe = client.predict(**shared, variants="", lambda_local=0.5, api_name="/probe")
    assert "true" in json.dumps(probe[1])


def test_align_draws_the_reading_its_parameters_name(client, example, live_app):
    """``/align``'s ``features`` and ``image_size`` parameters (issue 53.4): the score table
    at features="sclip" is the in-process view's at that reading, not the default's; the
    reading written into the checkpoint the old way is refused, naming the parameters."""
    from otviz.ui.align.views import align_view
    from otviz.ui.reading import Reading, with_reading

    path, caption = example
    checkpoint = live_app.ctx.checkpoint_choices()[0]
    ctx, rgb = live_app.ctx, np.asarray(Image.open(path).convert("RGB"))

    def table(value: str) -> list[list]:
        frame = align_view(ctx.explainer(value), ctx.suite(value), rgb, caption).scores
        return json.loads(frame.to_json(orient="values"))

    out = client.predict(image=handle_file(path), caption=caption, checkpoint=checkpoint,
                         features="sclip", api_name="/align")
    sclip = table(with_reading(checkpoint, Reading("sclip")))
    assert out[7]["data"] == sclip
    assert sclip != table(checkpoint)
    with pytest.raises(AppError, match="features and image_size parameters"):
        client.predict(image=handle_file(path), caption=caption,
                       checkpoint=with_reading(checkpoint, Reading("sclip")),
                       api_name="/align")


#: The public endpoints that read a backbone (checked against the app's API info).
BACKBONE_READERS = ["/align_trust", "/align", "/align_phrase", "/align_plan", "/align_token",
                    "/align_scores", "/align_downloads", "/anchors", "/anchor_maps",
                    "/default_words", "/phrases", "/phrases_node", "/probe", "/probe_batch",
                    "/zero_shot", "/words", "/words_pick", "/browse", "/browse_page", "/train"]


def test_every_endpoint_taking_a_checkpoint_takes_the_reading_by_name(built):
    """Issue 53.4: every public endpoint of the app's API info with a ``checkpoint``
    parameter lists ``features`` and ``image_size`` right after it, with /align's types and
    defaults (``last``; 0, the native side); :data:`BACKBONE_READERS` is that list."""
    from otviz.ui.trust_browse import trust_unavailable

    info = built[1].get_api_info()["named_endpoints"]
    takers = [name for name, e in info.items()
              if "checkpoint" in [p["parameter_name"] for p in e["parameters"]]]
    readers = [n for n in BACKBONE_READERS if n != "/align_trust" or trust_unavailable() is None]
    assert sorted(takers) == sorted(readers)

    def reading(name: str) -> list[dict]:
        params = info[name]["parameters"]
        at = [p["parameter_name"] for p in params].index("checkpoint")
        return params[at + 1:at + 3]

    align = reading("/align")
    assert [(p["parameter_name"], p["parameter_default"], p["python_type"]["type"])
            for p in align] == [("features", "last", "str"), ("image_size", 0, "int")]
    assert {name: reading(name) for name in takers} == dict.fromkeys(takers, align)


#: A checkpoint value with the reading written into it the old way.
OLD_STYLE = " · features sclip · 448 px"


@pytest.mark.parametrize("endpoint", BACKBONE_READERS)
def test_every_endpoint_refuses_a_reading_in_the_checkpoint(client, example, live_app,
                                                            endpoint):
    """A suffixed checkpoint sent to any endpoint that reads a backbone is refused with the
    message naming the ``features`` and ``image_size`` parameters (nothing else computed:
    every other required parameter is left empty), never read as that reading."""
    from otviz.ui.reading import READING_IN_CHECKPOINT

    info = live_app.blocks.get_api_info()["named_endpoints"]
    if endpoint not in info:
        pytest.skip(f"{endpoint} is not served here (no Quantus)")
    path, caption = example
    given = {"image": handle_file(path), "caption": caption}
    required = {p["parameter_name"]: given.get(p["parameter_name"])
                for p in info[endpoint]["parameters"] if not p["parameter_has_default"]}
    checkpoint = live_app.ctx.checkpoint_choices()[0] + OLD_STYLE
    with pytest.raises(AppError) as refused:
        client.predict(**required, checkpoint=checkpoint, features="sclip", image_size=448,
                       api_name=endpoint)
    assert READING_IN_CHECKPOINT in str(refused.value), str(refused.value)


def test_a_view_draws_the_reading_its_parameters_name(client, example, live_app):
    """Probe's endpoint at ``features="sclip"``, ``image_size`` the doubled side: the score
    table is the in-process view's at that reading, not the default's (Align's own:
    :func:`test_align_draws_the_reading_its_parameters_name`)."""
    from otviz.ui.probe_tab import probe_view
    from otviz.ui.reading import Reading, with_reading

    path, caption = example
    ctx, rgb = live_app.ctx, np.asarray(Image.open(path).convert("RGB"))
    checkpoint = ctx.checkpoint_choices()[0]
    side = ctx.sizes(checkpoint)[2]

    def table(value: str) -> list[list]:
        frame = probe_view(ctx.explainer(value), ctx.suite(value), rgb, caption, "", 0.5)[2]
        return json.loads(frame.to_json(orient="values"))

    out = client.predict(image=handle_file(path), caption=caption, checkpoint=checkpoint,
                         features="sclip", image_size=side, variants="", lambda_local=0.5,
                         api_name="/probe")
    read = table(with_reading(checkpoint, Reading("sclip", side)))
    assert out[2]["value"]["data"] == read and read != table(checkpoint)


def test_no_monitoring_page_and_no_summary_rebuilt_per_event(client, example, live_app,
                                                             monkeypatch):
    """Gradio's monitoring pages are off on the served app (its summary lists every event's
    timings to anyone), and no event rebuilds that summary (a pandas table of up to 10,000
    events, after every event)."""
    from gradio.queueing import Queue

    for path in ("monitoring", "monitoring/summary"):
        response = httpx.get(f"{live_app.url}{path}", timeout=30, **PLAIN_HTTP)
        assert response.status_code == 403, (path, response.status_code)
    tables = []
    monkeypatch.setattr(Queue, "_get_df", staticmethod(lambda records: tables.append(records)))
    client.predict(handle_file(example[0]), example[1], live_app.ctx.checkpoint_choices()[0],
                   api_name="/words")
    assert tables == []
    assert live_app.blocks._queue.event_analytics  # the events are still recorded


@pytest.mark.parametrize(
    ("image_kind", "caption", "message"),
    [
        ("none", "a red circle", "no image"),
        ("example", "   ", "caption is empty"),
        ("example", "a red circle " * 100, "over 1000 characters"),
        ("text", "a red circle", "notes.png is not an image"),
        ("huge", "a red circle", "too large"),
    ],
)
def test_bad_input_is_a_message_on_the_page(client, example, live_app, tmp_path, image_kind,
                                            caption, message):
    path = {"none": None, "example": example[0]}.get(image_kind)
    if image_kind == "text":
        path = tmp_path / "notes.png"
        path.write_text("not an image")
    if image_kind == "huge":  # 64 MP, a few kB as PNG: refused from its header
        path = tmp_path / "huge.png"
        Image.new("L", (8000, 8000)).save(path)
    img = handle_file(str(path)) if path else None
    checkpoint = live_app.ctx.checkpoint_choices()[0]
    with pytest.raises(AppError, match=message):
        client.predict(image=img, caption=caption, checkpoint=checkpoint, api_name="/align")


def test_phrase_not_in_the_caption_and_unknown_checkpoint(client, example, live_app):
    img = handle_file(example[0])
    checkpoint = live_app.ctx.checkpoint_choices()[0]
    # the phrase endpoint reads an Align click's results
    client.predict(image=img, caption=example[1], checkpoint=checkpoint, api_name="/align")
    with pytest.raises(AppError, match="purple elephant"):
        client.predict(image=img, caption=example[1], checkpoint=checkpoint,
                       phrase="purple elephant", api_name="/align_phrase")
    with pytest.raises(AppError, match="unknown checkpoint"):
        client.predict(image=img, caption=example[1],
                       checkpoint="ViT-H-14 / nowhere · training-free", api_name="/words")


def _foreign_head(path: Path, backbone_name: str = "otviz-tiny") -> Path:
    """A FILIP head whose recorded backbone has other weights than the shipped one."""
    method = METHODS["filip"](64, 64, MethodConfig(trainable=True))
    identity = {"weights": "0" * 32, "name": backbone_name, "tags": {}, "space": "width",
                "context_length": 32, "grid": [10, 10]}
    return save_method_checkpoint(path, method, identity)


def test_head_of_another_backbone_is_refused_with_a_message(client, example, live_app,
                                                            tmp_path, monkeypatch):
    # the foreign entry leaves with the test: the served app is shared by the session
    monkeypatch.setattr(live_app.ctx, "head_sets", list(live_app.ctx.head_sets))
    entry = live_app.ctx.add_head_set(EMBEDDED, "foreign", {"filip": _foreign_head(tmp_path)})
    with pytest.raises(AppError, match="These heads were trained on .*, but this entry loads"):
        client.predict(image=handle_file(example[0]), caption=example[1], checkpoint=entry,
                       method="filip", api_name="/align")


def test_shipped_heads_are_offered_per_backbone(tmp_path, monkeypatch):
    head = _foreign_head(tmp_path / "filip")
    _foreign_head(tmp_path / "other" / "head", backbone_name="ViT-B-16")
    assert [(m, p) for m, _, p in find_heads(tmp_path)] == [
        ("filip", head), ("filip", tmp_path / "other" / "head")
    ]
    ctx = AppContext.default(heads_root=tmp_path)
    assert ctx.checkpoint_choices() == [f"{EMBEDDED} · {TRAINING_FREE}",
                                        f"{EMBEDDED} · {TRAINING_FREE_FAITHFUL}",
                                        f"{EMBEDDED} · {SHIPPED_HEADS}"]
    assert ctx.head_sets[0].heads == {"filip": head}
    assert ctx.add_head_set(EMBEDDED, SHIPPED_HEADS, {}) == f"{EMBEDDED} · {SHIPPED_HEADS} #2"


def test_heads_replace_their_method_in_the_suite(tmp_path):
    """A head trained on this backbone takes its method's place (on raw width features);
    the other methods stay training-free, and the suite's label keys its own cached runs."""
    ctx = AppContext.default(heads_root=tmp_path)
    free_entry = ctx.checkpoint_choices()[0]
    backbone = ctx.explainer(free_entry).backbone
    torch.manual_seed(0)
    method = METHODS["filip"](backbone.patch_dim, backbone.token_dim,
                              MethodConfig(trainable=True))
    path = save_method_checkpoint(tmp_path / "filip", method, backbone)
    entry = ctx.add_head_set(EMBEDDED, "mine", {"filip": path})
    suite, free = ctx.suite(entry), ctx.suite(free_entry)
    assert suite.methods["filip"].space == "width"
    assert suite.methods["filip"].source.startswith("trained")
    assert suite.methods["conceptot"] is free.methods["conceptot"]
    assert suite.label != free.label
    for a, b in zip(suite.methods["filip"].method.state_dict().values(),
                    method.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)


def test_real_clip_entries_need_the_network(monkeypatch, tmp_path):
    monkeypatch.delenv(context_module.REMOTE_ENV, raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert remote_models(lambda: True) == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert remote_models(lambda: False) == []
    assert remote_models(lambda: True) == REMOTE_MODELS
    monkeypatch.setenv("SPACE_ID", "someone/otviz")  # a Space that cannot reach the hub
    assert remote_models(lambda: False) == []  # offers none (each failed after 47 s)
    assert remote_models(lambda: True) == REMOTE_MODELS
    monkeypatch.setenv(context_module.REMOTE_ENV, "ViT-B-32/laion2b_s34b_b79k, ViT-B-16/openai")
    assert remote_models() == [("ViT-B-32", "laion2b_s34b_b79k"), ("ViT-B-16", "openai")]
    monkeypatch.setenv(context_module.REMOTE_ENV, "")
    assert remote_models() == []
    ctx = AppContext.default([("ViT-B-16", "openai")], heads_root=tmp_path)
    assert ctx.checkpoint_choices()[2] == (
        f"ViT-B-16 / openai ({context_module.REMOTE_NOTES[('ViT-B-16', 'openai')]}; "
        f"downloaded at first pick) · {TRAINING_FREE}")
    choice = ctx.backbones[1]
    assert choice.train_backbone == {"open_clip_model": "ViT-B-16", "pretrained": "openai"}
    assert choice.takes_heads_of({"name": "ViT-B-16", "tags": {"pretrained": "openai"}})
    assert not choice.takes_heads_of({"name": "otviz-tiny", "tags": {}})


def test_a_real_clip_fails_fast_when_the_hub_is_unreachable(monkeypatch):
    """Picked while the hub cannot be reached: a message at once, no download tried."""
    import time

    from otviz.backbone import Backbone

    tried = []
    monkeypatch.setattr(Backbone, "from_pretrained", lambda *a, **kw: tried.append(a))
    start = time.perf_counter()
    with pytest.raises(InputError, match="cannot reach now: pick the embedded model"):
        context_module.load_remote("ViT-B-16", "openai", probe=lambda: False)
    assert time.perf_counter() - start < 1 and tried == []
    context_module.load_remote("ViT-B-16", "openai", probe=lambda: True)
    assert tried == [("ViT-B-16", "openai")]


def test_an_unreachable_real_clip_is_a_message(monkeypatch):
    from otviz.backbone import BackboneLoadError
    from otviz.ui.inputs import user_errors

    def offline():
        raise BackboneLoadError("could not load ViT-B-16 with weights 'openai': no network")

    ctx = AppContext([BackboneChoice("ViT-B-16 / openai", offline, [])])
    with pytest.raises(gr.Error, match="no network"):
        user_errors(ctx.explainer)(ctx.checkpoint_choices()[0])


def test_the_config_names_no_server_folder(live_app, client, example):
    """The page's /config (what every visitor's browser reads) carries the examples
    gallery as inline thumbnails, not as Gradio's cached copies by absolute path (on a Space,
    the server's folders; issue 50.7); a pick still loads the example itself."""
    import os
    import sys
    import tempfile

    from otviz.ui.examples import THUMBNAIL_PX, load_examples

    config = httpx.get(f"{live_app.url}config", timeout=60, **PLAIN_HTTP).json()
    text = json.dumps(config)
    for root in {tempfile.gettempdir(), os.getcwd(), str(Path.home()), sys.prefix,
                 str(Path(gr.utils.get_upload_folder()))}:
        assert root not in text, root
    [dataset] = [c for c in config["components"] if c["type"] == "dataset"]
    shown = [value for sample in dataset["props"]["samples"] for value in sample
             if isinstance(value, dict)]
    examples = load_examples()
    assert [v["path"] for v in shown] == [e.image_path.name for e in examples]
    from base64 import b64decode
    from io import BytesIO

    first = Image.open(BytesIO(b64decode(shown[0]["url"].split(",", 1)[1])))
    assert max(first.size) <= THUMBNAIL_PX
    full = Image.open(examples[0].image_path).convert("RGB")
    assert first.size == tuple(round(s * max(first.size) / max(full.size)) for s in full.size)
    # a pick (the gallery's click sends the index) loads the full example
    image, caption = client.predict(0, api_name="/load_example")  # component updates
    assert caption["value"] == examples[0].caption
    loaded = Image.open(image["value"]["path"]).convert("RGB")
    assert np.array_equal(np.asarray(loaded), np.asarray(full))
