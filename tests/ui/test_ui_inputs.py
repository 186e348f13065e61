"""What the views do with uploads and errors: large images scaled down (in the page and for
API callers), huge ones and non-images refused from their header, user errors (also from
generator callbacks) turned into page messages."""

from __future__ import annotations

import io
import re
import time
import uuid
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from gradio.data_classes import FileData, ImageData, ListFiles
from PIL import Image

from otviz.boundary.images import MAX_IMAGE_PIXELS, ImageInputError, header_size
from otviz.explain import InputError
from otviz.ui.context import AppContext
from otviz.ui.inputs import (
    MAX_IMAGE_SIDE,
    CheckedFile,
    CheckedImage,
    fit_image,
    on_upload,
    truncation_note,
    user_errors,
)


def gradient(height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // width, y * 255 // height, (x + y) % 256], -1).astype(np.uint8)


def test_small_images_pass_unchanged():
    image = gradient(224, 300)
    fitted, note = fit_image(image)
    assert fitted is image and note is None
    assert fit_image(None) == (None, None)


def test_large_images_are_scaled_down_keeping_the_aspect_ratio():
    image = gradient(3000, 1500)
    fitted, note = fit_image(image)
    expected = np.asarray(Image.fromarray(image).resize((512, 1024), Image.Resampling.LANCZOS))
    assert fitted.shape == (MAX_IMAGE_SIDE, MAX_IMAGE_SIDE // 2, 3)
    np.testing.assert_array_equal(fitted, expected)
    assert note == "the image was scaled down from 1500x3000 to 512x1024 pixels"
    with pytest.warns(UserWarning, match="scaled down"):  # gr.Warning outside a request
        np.testing.assert_array_equal(on_upload(uploaded(image, "tall.png")), expected)
    assert on_upload(uploaded(gradient(100, 100), "small.png")) == gr.skip()
    assert on_upload(None) == gr.skip()


def huge_file(side: int) -> bytes:
    """A PNG of ``side x side`` black pixels: a few kB on disk."""
    out = io.BytesIO()
    Image.new("1", (side, side)).save(out, format="PNG")
    return out.getvalue()


def uploaded(image: np.ndarray | bytes, name: str) -> dict:
    """``image`` (pixels, or a file's bytes) saved in Gradio's upload cache, as the page's
    upload event sends it (``preprocess=False``)."""
    from gradio.utils import get_upload_folder

    folder = Path(get_upload_folder()) / uuid.uuid4().hex
    folder.mkdir(parents=True)
    path = folder / name
    if isinstance(image, bytes):
        path.write_bytes(image)
    else:
        Image.fromarray(image).save(path)
    return {"path": str(path), "orig_name": name}


def test_a_refused_upload_clears_the_preview_and_its_file_goes_after_the_grace(
        monkeypatch):
    """A refused upload is its message (a warning) and an empty input (no broken preview);
    its file stays for the page's fetch of the preview, then leaves the cache; a path
    outside the upload cache is refused without being read."""
    from otviz.ui import upload_cache

    monkeypatch.setattr(upload_cache, "PREVIEW_GRACE_S", 0.2)
    monkeypatch.setattr("otviz.ui.inputs.PREVIEW_GRACE_S", 0.2)
    payload = uploaded(b"not an image at all", "notes.png")
    with pytest.warns(UserWarning, match="notes.png is not an image this app can read"):
        assert on_upload(payload) is None
    path = Path(payload["path"])
    assert path.is_file()  # the preview's fetch still finds it
    assert "notes.png is not an image" in upload_cache.why_gone(payload["path"])
    for _ in range(50):
        if not path.exists():
            break
        time.sleep(0.05)
    assert not path.exists()
    with pytest.raises(gr.Error, match="not an upload of this page"):
        on_upload({"path": __file__, "orig_name": "x.png"})


def test_huge_images_are_refused_before_any_work():
    side = int(np.sqrt(MAX_IMAGE_PIXELS)) + 1
    huge = np.broadcast_to(np.zeros((1, 1, 3), np.uint8), (side, side, 3))  # no memory
    with pytest.raises(InputError, match="too large"):
        fit_image(huge)
    with pytest.warns(UserWarning, match="huge.png is too large"):
        assert on_upload(uploaded(huge_file(side), "huge.png")) is None
    with pytest.raises(ImageInputError, match="not an image"):
        fit_image(np.zeros(5))


def test_files_are_checked_from_their_header(tmp_path):
    good, text, huge = tmp_path / "good.png", tmp_path / "notes.jpg", tmp_path / "huge.png"
    Image.fromarray(gradient(20, 30)).save(good)
    text.write_text("not an image")
    Image.new("1", (9000, 9000)).save(huge)  # 81 MP, a few kB on disk
    assert header_size(str(good)) == (30, 20)
    with pytest.raises(InputError, match="notes.jpg is not an image this app can read"):
        header_size(str(text))
    with pytest.raises(InputError, match="huge.png is too large \\(9000x9000"):
        header_size(str(huge))
    component = CheckedImage(type="numpy", image_mode="RGB", render=False)
    with pytest.raises(gr.Error, match="not an image"):
        component.preprocess(ImageData(path=str(text), orig_name="notes.jpg"))
    np.testing.assert_array_equal(
        component.preprocess(ImageData(path=str(good), orig_name="good.png")), gradient(20, 30)
    )


def test_api_callers_get_the_same_fitting():
    """The app's explainer encodes a large upload as its scaled-down version (same cache
    entry as the page's fitted image)."""
    ctx = AppContext.default()
    explainer = ctx.explainer(ctx.checkpoint_choices()[0])
    image = gradient(2048, 2048)
    encoded = explainer.encode(image, "a red circle")
    assert encoded.image.shape == (MAX_IMAGE_SIDE, MAX_IMAGE_SIDE, 3)
    assert explainer.encode(fit_image(image)[0], "a red circle") is encoded


def test_user_errors_wrap_callbacks_and_generators(caplog):
    def fails(text):
        raise InputError(f"bad {text}")

    def streams(text):
        yield 1
        raise ImageInputError(f"worse {text}")

    def crashes():
        raise KeyError("a bug, not a user error")

    with pytest.raises(gr.Error, match="bad caption"):
        user_errors(fails)("caption")
    gen = user_errors(streams)("upload")
    assert next(gen) == 1
    with pytest.raises(gr.Error, match="worse upload"):
        next(gen)
    with pytest.raises(gr.Error, match=r"error id [0-9a-f]{8}, KeyError") as caught:
        user_errors(crashes)()  # a bug: a message with an id, never its own text
    assert "a bug" not in str(caught.value)
    error_id = re.search(r"error id ([0-9a-f]{8})", str(caught.value)).group(1)
    assert error_id in caplog.text and "KeyError: 'a bug" in caplog.text  # the server log
    with pytest.raises(gr.Error, match="&lt;h1&gt;x&lt;/h1&gt;"):  # user text escaped
        user_errors(fails)("<h1>x</h1>")


def test_cut_caption_words_are_named():
    ctx = AppContext.default()
    explainer = ctx.explainer(ctx.checkpoint_choices()[0])
    image = gradient(80, 80)
    assert truncation_note(explainer.encode(image, "a red circle")) is None
    words = [f"w{k}" for k in range(explainer.backbone.context_length + 5)]
    encoded = explainer.encode(image, " ".join(words))
    cut = encoded.features.truncated[0]
    assert cut and cut == list(range(cut[0], len(words)))
    assert truncation_note(encoded) == (
        f"the caption is longer than the model reads: only its first {cut[0]} words are used "
        f'({len(cut)} cut, from "w{cut[0]}" on)'
    )


def test_the_image_input_scales_sixteen_bit_uploads(tmp_path):
    """Gradio's own decoding clips a 16-bit greyscale PNG to near-white; the app's image
    input decodes through the boundary, which scales it."""
    ramp = (np.arange(40 * 30, dtype=np.uint32) * 50).astype(np.uint16).reshape(30, 40)
    path = tmp_path / "deep.png"
    Image.fromarray(ramp).save(path)
    shown = CheckedImage(type="numpy", render=False).preprocess(
        ImageData(path=str(path), orig_name="deep.png"))
    expected = np.round(ramp.astype(np.float64) * 255 / 65535).astype(np.uint8)
    np.testing.assert_array_equal(shown, np.stack([expected] * 3, -1))


def test_a_user_error_is_one_log_line_with_its_id(caplog):
    def fails():
        raise InputError("the caption is empty")

    caplog.set_level("INFO", logger="otviz.ui")
    with pytest.raises(gr.Error) as caught:
        user_errors(fails)()
    assert caught.value.print_exception is False  # Gradio prints no traceback either
    records = [r for r in caplog.records if r.name == "otviz.ui"]
    assert len(records) == 1 and records[0].exc_info is None
    assert re.fullmatch(r"user error [0-9a-f]{8} in .*fails: the caption is empty",
                        records[0].getMessage())


def test_gradios_own_refusal_of_a_file_is_a_one_line_user_error(tmp_path, caplog):
    """A file type the input does not take is refused by Gradio's preprocessing, before any
    callback: the app's file input makes it a user error (no traceback printed, one log
    line with its id, the message escaped); files it takes pass as Gradio passes them."""
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    picture = tmp_path / "ok.png"
    Image.fromarray(gradient(8, 8)).save(picture)
    component = CheckedFile(file_count="multiple", file_types=["image"], render=False)
    caplog.set_level("INFO", logger="otviz.ui")
    with pytest.raises(gr.Error) as caught:
        component.preprocess(ListFiles(root=[FileData(path=str(text), orig_name="notes.txt")]))
    assert caught.value.print_exception is False
    assert "Invalid file type" in caught.value.message
    assert "['image']" in caught.value.message
    lines = [r for r in caplog.records if "Invalid file type" in r.getMessage()]
    assert len(lines) == 1 and re.search(r"user error [0-9a-f]{8} in file upload",
                                         lines[0].getMessage())
    assert lines[0].exc_info is None
    taken = component.preprocess(ListFiles(root=[FileData(path=str(picture))]))
    assert [str(f) for f in taken] == [str(picture)]


def test_the_served_app_logs_otviz_info_lines_and_keeps_a_hosts_setup(monkeypatch, capsys):
    """``otviz app`` shows a user error's one line (INFO) on stderr, not other libraries'
    INFO; a root handler the host set up is kept, not doubled."""
    import logging

    from otviz.ui.app import server_logging

    root, otviz_log = logging.getLogger(), logging.getLogger("otviz")
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    monkeypatch.setattr(otviz_log, "level", logging.NOTSET)
    server_logging()
    assert len(root.handlers) == 1
    logging.getLogger("otviz.ui.inputs").info("user error 1a2b3c4d in test: shown")
    logging.getLogger("somelib").info("not shown")
    err = capsys.readouterr().err
    assert "otviz.ui.inputs: user error 1a2b3c4d in test: shown" in err
    assert "not shown" not in err
    server_logging()
    assert len(root.handlers) == 1
