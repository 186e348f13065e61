"""Smaller defects of issue 35: the Probe's message for a caption with no letter or digit is
every view's; Browse says why a localisation metric's column is blank on an upload; a
server without Quantus hides the trust controls behind one line instead of offering them
and answering "pip install"."""

from __future__ import annotations

import importlib.util
import sys

import gradio as gr
import pytest

from otviz.boundary.text import check_caption
from otviz.explain import InputError
from otviz.ui import trust_browse
from otviz.ui.examples import load_examples
from otviz.ui.probe_tab import run_probe

EMOJI_ONLY = "🙂🐱 🌈"


def test_probe_gives_every_views_message_for_an_emoji_only_caption(tools):
    explainer, suite = tools
    with pytest.raises(InputError) as expected:
        check_caption(EMOJI_ONLY)
    with pytest.raises(InputError) as align:
        explainer.encode(load_examples()[0].image_path, EMOJI_ONLY)
    with pytest.raises(InputError) as probe:
        run_probe(explainer, suite, load_examples()[0].image_path, EMOJI_ONLY)
    assert str(probe.value) == str(align.value) == str(expected.value)
    assert "no letter or digit" in str(probe.value)


def test_browse_says_why_a_localisation_column_is_blank_on_an_upload(tools, tmp_path):
    from otviz.data.datasets import load_image_captions
    from otviz.eval.browse import first_captions, folder_browse
    from tests.helpers import write_caption_folder

    _, suite = tools
    folder = write_caption_folder(tmp_path / "upload", 2)
    table = folder_browse(suite, first_captions(load_image_captions(folder), 2),
                          tmp_path / "features")
    assert table.gold is None
    values = trust_browse.TrustValues()
    pointing = next(label for label, key in trust_browse.METRIC_CHOICES.items()
                    if key == "pointing")
    sort = trust_browse.trust_sort(values, suite, table, "conceptot", pointing, "all rows")
    assert bool(sort.values.isnan().all())  # blank: no gold boxes
    assert sort.note == trust_browse.NO_BOXES.format(metric=pointing)
    assert "gold box" in sort.note and "world splits" in sort.note


@pytest.fixture()
def without_quantus(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "quantus" else real(name, *a))


def test_without_quantus_the_trust_controls_are_hidden_with_one_line(ctx, without_quantus):
    from otviz.ui.trust_panel import build_trust_panel

    with gr.Blocks() as blocks:
        inputs = [gr.Image(), gr.Textbox(), gr.Textbox(), gr.Textbox(), gr.Checkbox()]
        build_trust_panel(ctx, inputs, lambda encoded, phrase: [0])
        metric, keep = trust_browse.trust_controls()
    lines = [b for b in blocks.blocks.values() if isinstance(b, gr.Markdown)]
    assert [line.elem_id for line in lines] == ["align-trust-unavailable",
                                                "browse-trust-unavailable"]
    assert all(line.value == trust_browse.UNAVAILABLE for line in lines)
    assert "pip install" not in trust_browse.UNAVAILABLE
    assert not metric.visible and not keep.visible
    assert not any(isinstance(b, gr.Accordion) for b in blocks.blocks.values())
    assert "align_trust" not in {fn.api_name for fn in blocks.fns.values()}


def test_a_quantus_whose_cv2_does_not_load_is_said_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # `import cv2` raises ImportError
    line = trust_browse.trust_unavailable()
    assert line is not None and line.startswith("*Trust metrics are not offered")
    assert "Quantus is installed but OpenCV" in line and "cv2" in line


def test_with_quantus_the_trust_controls_are_offered(ctx):
    assert trust_browse.trust_unavailable() is None  # the test venv has Quantus
    with gr.Blocks():
        metric, keep = trust_browse.trust_controls()
    assert metric.visible and keep.visible


def test_a_folders_bad_images_are_reported_together(ctx, tmp_path):
    """Browse on an upload with four bad images among good ones: one refusal names the
    first three and counts the fourth (the old code needed four tries, one per image)."""
    import shutil

    import numpy as np
    from PIL import Image

    from otviz.eval.browse import BrowseCache
    from otviz.ui.browse_tab import UPLOAD_SOURCE, BrowseSources, load_table
    from tests.helpers import png_header

    folder = tmp_path / "upload"
    folder.mkdir()
    good = load_examples()[0]
    shutil.copy(good.image_path, folder / "good.png")
    Image.fromarray(np.zeros((1, 400, 3), np.uint8)).save(folder / "thin.png")
    (folder / "bomb.png").write_bytes(png_header(30_000, 30_000))
    (folder / "text.png").write_text("not an image")
    Image.fromarray(np.zeros((400, 2, 3), np.uint8)).save(folder / "tall.png")
    names = ["good.png", "thin.png", "bomb.png", "text.png", "tall.png"]
    (folder / "captions.csv").write_text(
        "path,caption\n" + "".join(f"{n},a red circle\n" for n in names))
    sources = BrowseSources(BrowseCache(), tmp_path / "features", tmp_path / "uploads")
    files = [str(folder / n) for n in [*names, "captions.csv"]]
    with pytest.raises(InputError) as refused:
        load_table(ctx, sources, ctx.checkpoint_choices()[0], UPLOAD_SOURCE, files=files)
    message = str(refused.value)
    assert message.startswith("4 of 5 images cannot be used: thin.png is too thin")
    assert "bomb.png is too large" in message and "text.png" in message
    assert "tall.png" in message and "more)" not in message and "good.png" not in message


HTML_NAMES = ["<b>bold<b>.png", "<img src=x onerror=alert(1)>.png"]


def test_an_upload_keeps_the_name_it_was_uploaded_under():
    from gradio.utils import NamedString

    from otviz.boundary.paths import upload_name

    def named(orig):
        path = NamedString("/cache/abc/bboldb.png")
        path.orig_name = orig
        return path

    assert upload_name(named("<b>bold<b>.png")) == "<b>bold<b>.png"
    for bad in ("../x.png", "a/b.png", "a\\b.png", "..", "", "a\nb.png", None):
        assert upload_name(named(bad)) == "bboldb.png"
    assert upload_name("/cache/abc/plain.png") == "plain.png"


@pytest.mark.parametrize("name", HTML_NAMES)
def test_browse_reads_an_image_named_with_html_as_align_does(live_app, tmp_path, name):
    """Gradio's cache stores ``<b>bold<b>.png`` as ``bboldb.png``: Browse, reading the
    captions file's names, used to refuse the image Align, Words and Zero-shot accept."""
    from tests.helpers import file_data, raw_api_call, upload

    e = load_examples()[0]
    url, checkpoint = live_app.url, live_app.ctx.checkpoint_choices()[0]
    image = upload(url, name, e.image_path.read_bytes())
    csv = upload(url, "captions.csv", f'path,caption\n"{name}",{e.caption}\n'.encode())
    files = [file_data(image, name), file_data(csv, "captions.csv")]
    browse = raw_api_call(url, "browse", [
        checkpoint, "last", 0, "uploaded folder", 8, "test", files, ["conceptot"], "conceptot",
        "filip", "all rows", [], "set order", "no trust metric", "all rows", 1, 4])
    align = raw_api_call(url, "words", [file_data(image, name), e.caption, checkpoint, "last",
                                        0])
    assert "event: complete" in align, align
    assert "event: complete" in browse, browse
