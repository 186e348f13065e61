"""Bad input against the served app (one server for the session, driven through
gradio_client on loopback, so Gradio's own decoding and the queue are in the path):
malformed images, odd captions, phrases and checkpoints, hostile training data and an
oversized upload each end in a result or a readable message, never a bare "Error", never
an unexpected-error message, never unescaped HTML; and no file outside the uploads and
the app's own files is opened (a Python audit hook watches every ``open`` of the server,
which runs in this process)."""

from __future__ import annotations

import io
import struct
import sys
import threading
import zipfile
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest
from gradio.utils import _parse_file_size
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from otviz.ui.app import MAX_UPLOAD
from otviz.ui.examples import load_examples

UNEXPECTED = "Something unexpected"
RAW_HTML = ("<h1", "<a ", "<img", "<script")


class OpenedFiles:
    """Every path ``open``-ed in this process while :meth:`watch` is active."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.active = False
        self.lock = threading.Lock()
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, bytes, Path)):
            with self.lock:
                self.paths.append(str(args[0]))

    def watch(self) -> OpenedFiles:
        self.paths, self.active = [], True
        return self

    def __enter__(self) -> OpenedFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.active = False


_OPENED = OpenedFiles()  # audit hooks cannot be removed: one per test process


@pytest.fixture(scope="module")
def client(live_app) -> Client:
    return Client(live_app.url, verbose=False, download_files=False)


@pytest.fixture(scope="module")
def checkpoint(live_app) -> str:
    return live_app.ctx.checkpoint_choices()[0]


@pytest.fixture(scope="module")
def example() -> tuple[str, str]:
    e = load_examples()[0]
    return str(e.image_path), e.caption


@pytest.fixture(scope="module")
def aligned(client, checkpoint, example) -> tuple[str, str]:
    """The example after an Align click: the phrase and plan endpoints read its results."""
    assert outcome(client, "/align", *view_args("align", handle_file(example[0]), example[1],
                                                checkpoint)) is None
    return example


def view_args(view: str, image, caption: str, checkpoint: str) -> tuple:
    """The positional inputs of each image view's API endpoint."""
    return {
        "align": (image, caption, checkpoint, "conceptot", "grid", True, 0.5, None, None),
        "words": (image, caption, checkpoint),
        "phrases": (image, caption, checkpoint, "grid", None, None),
        "probe": (image, caption, checkpoint, "", 0.5),
        "anchor_maps": (image, caption, checkpoint, 4, [], False),
    }[view]


def outcome(client: Client, api_name: str, *args) -> str | None:
    """None for a result, else the page's message, checked to be readable."""
    try:
        client.predict(*args, api_name=api_name)
    except AppError as e:
        message = str(e)
        assert message.strip() and message.strip() != "Error", api_name
        assert UNEXPECTED not in message, message
        assert not any(tag in message.lower() for tag in RAW_HTML), message
        return message
    return None


# ----------------------------------------------------------------------- images
def _png_header(width: int, height: int) -> bytes:
    """A valid 1-bit PNG that claims ``width x height`` pixels with almost no data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))
            + chunk(b"IEND", b""))


def _save(image: Image.Image, path: Path, **kwargs) -> Path:
    image.save(path, **kwargs)
    return path


def _rgb(size=(64, 48)) -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _truncated(path: Path) -> Path:
    buffer = io.BytesIO()
    _rgb((200, 200)).save(buffer, "PNG")
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    return path


def _exif_rotated(path: Path) -> Path:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    return _save(_rgb(), path, exif=exif.tobytes())


def _palette(path: Path) -> Path:
    return _save(_rgb().convert("P", palette=Image.Palette.ADAPTIVE), path, transparency=0)


MALFORMED = {  # name -> (make file, expected message or None for a result)
    "truncated.png": (_truncated, "is not an image this app can read"),
    "zero.png": (lambda p: (p.write_bytes(b""), p)[1], "is not an image this app can read"),
    "notes.png": (lambda p: (p.write_text("just text"), p)[1], "is not an image this app"),
    "bomb.png": (lambda p: (p.write_bytes(_png_header(30_000, 30_000)), p)[1], "too large"),
    "one.png": (lambda p: _save(Image.new("RGB", (1, 1), "red"), p), None),
    "deep.png": (lambda p: _save(Image.fromarray(
        np.arange(64 * 48, dtype=np.uint16).reshape(48, 64) * 20), p), None),
    "cmyk.jpg": (lambda p: _save(_rgb().convert("CMYK"), p), None),
    "palette.png": (_palette, None),
    "rotated.jpg": (_exif_rotated, None),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_images_are_a_result_or_a_message(client, checkpoint, tmp_path, name):
    make, expected = MALFORMED[name]
    path = make(tmp_path / name)
    message = outcome(client, "/words",
                      *view_args("words", handle_file(str(path)), "a red circle", checkpoint))
    if expected is None:
        assert message is None, message
    else:
        assert message is not None and name in message and expected in message


@pytest.mark.parametrize("view", ["align", "words", "phrases", "probe", "anchor_maps"])
def test_a_truncated_image_is_the_same_message_in_every_view(client, checkpoint, tmp_path,
                                                              view):
    image = handle_file(str(_truncated(tmp_path / "cut.png")))
    message = outcome(client, f"/{view}", *view_args(view, image, "a red circle", checkpoint))
    assert message == "cut.png is not an image this app can read: upload a PNG, JPEG, WebP, " \
                      "BMP, ..."


def test_an_upload_over_the_limit_is_refused(live_app):
    limit = _parse_file_size(MAX_UPLOAD)
    files = {"files": ("big.png", b"\0" * (limit + 1), "image/png")}
    response = httpx.post(f"{live_app.url}gradio_api/upload", files=files, timeout=60)
    assert response.status_code == 413 and "maximum allowed size" in response.text


# ----------------------------------------------------------------------- captions
CAPTIONS = {
    "empty": ("", "caption is empty"),
    "whitespace": (" \t\n ", "caption is empty"),
    "emoji": ("a red circle 🔴 next to a 😀 star", None),
    "right-to-left": ("دائرة حمراء بجانب نجمة زرقاء", None),
    "nul": ("a red\x00 circle", None),
    "html": ('<h1>big</h1> <a href="http://x">red</a> <img src=x onerror=alert(1)> circle',
             None),
}


@pytest.mark.parametrize("name", list(CAPTIONS))
def test_odd_captions_are_a_result_or_a_message(client, checkpoint, example, name):
    caption, expected = CAPTIONS[name]
    message = outcome(client, "/align",
                      *view_args("align", handle_file(example[0]), caption, checkpoint))
    if expected is None:
        assert message is None or "caption" in message, message
    else:
        assert message is not None and expected in message


@pytest.mark.parametrize("view", ["align", "words", "phrases", "probe", "anchor_maps"])
def test_a_400_word_caption_works_in_every_view(client, checkpoint, example, view):
    """400 words (within the 1000-character limit): the words past the context are cut,
    and the 400-leaf parse tree is drawn within the figure encoder's limits."""
    caption = " ".join("ab"[i % 2] for i in range(400))
    assert outcome(client, f"/{view}",
                   *view_args(view, handle_file(example[0]), caption, checkpoint)) is None


def test_html_in_a_message_is_escaped(client, checkpoint, aligned):
    message = outcome(client, "/align_phrase", handle_file(aligned[0]), aligned[1],
                      checkpoint, "grid", True, "<h1>purple</h1> <img src=x>")
    assert message is not None and "&lt;h1&gt;purple&lt;/h1&gt;" in message


def test_phrase_and_plan_reads_before_an_align_click_say_so(client, checkpoint, example):
    """The phrase and plan endpoints are served outside the queue and never encode or
    solve: a pair nobody aligned is a message, not work."""
    image, caption = handle_file(example[0]), example[1] + " never aligned"
    for api, args in (("/align_phrase", (image, caption, checkpoint, "grid", True, "red")),
                      ("/align_plan", (image, caption, checkpoint, "conceptot", 0, "grid"))):
        message = outcome(client, api, *args)
        assert message is not None and "click Align" in message, api


# ----------------------------------------------------------------------- phrases, checkpoints
@pytest.mark.parametrize("phrase", ["", "   ", "x" * 5000, "a\x00b", "🔴"])
def test_odd_phrases_are_a_result_or_a_message(client, checkpoint, aligned, phrase):
    message = outcome(client, "/align_phrase", handle_file(aligned[0]), aligned[1], checkpoint,
                      "grid", True, phrase)
    assert message is None or "click Align" not in message  # the phrase itself was read


@pytest.mark.parametrize(
    "picked", ["", "../../etc/passwd", "/etc/passwd", "<b>x</b> · training-free",
               "otviz-tiny (embedded) · no such heads"])
def test_odd_checkpoints_are_messages(client, example, picked):
    message = outcome(client, "/align",
                      *view_args("align", handle_file(example[0]), example[1], picked))
    assert message is not None and "unknown checkpoint" in message


# ----------------------------------------------------------------------- training data
def _train(client: Client, checkpoint: str, data: str, folder: str, uploads: list) -> str:
    """The message of a refused /train request (the form's other fields at defaults)."""
    message = outcome(client, "/train", checkpoint, data, 64, folder, uploads, "train",
                      ["filip"], 0.05, 0.1, 0.05, 16, 10, 0.5, 1, 1, 1, 2, 1e-3)
    assert message is not None
    return message


@pytest.fixture()
def secret(tmp_path) -> Path:
    """A server file no request may open: an image next to the uploads' folder."""
    path = tmp_path / "secret" / "secret.png"
    path.parent.mkdir()
    _rgb().save(path)
    return path


def _hostile_csv(tmp_path: Path, rows: list[str]) -> list:
    good = tmp_path / "ok.png"
    _rgb().save(good)
    csv_file = tmp_path / "captions.csv"
    csv_file.write_text("ok.png,a red circle\n" + "\n".join(rows) + "\n")
    return [handle_file(str(csv_file)), handle_file(str(good))]


def test_hostile_training_data_opens_no_server_file(client, checkpoint, live_app, tmp_path,
                                                    secret):
    rows = [f"{secret},absolute", "../secret/secret.png,dotdot", "/etc/passwd,system",
            "../../../../../../etc/shadow,system"]
    with _OPENED.watch() as opened:
        message = _train(client, checkpoint, "upload", "", _hostile_csv(tmp_path, rows))
    assert "4 file(s) not found or not allowed" in message
    assert "root:" not in message and "secret.png" in message  # the rows' own text only
    touched = [p for p in opened.paths if "secret" in p or p.startswith("/etc/")]
    assert touched == []
    assert not any((live_app.jobs.runs_root).glob("*/data"))  # nothing left behind


def test_no_server_folder_without_a_data_root(client, checkpoint):
    for folder in ("/etc", "/root/.ssh", "."):
        message = _train(client, checkpoint, "local folder", folder, [])
        assert "not in the list of choices: ['world', 'upload']" in message  # Gradio's check


def test_a_zip_cannot_unpack_outside_its_folder(client, checkpoint, tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("../../escape.csv", "x.png,caption\n")
    message = _train(client, checkpoint, "upload", "", [handle_file(str(archive))])
    assert "points outside" in message and not (tmp_path.parent / "escape.csv").exists()



def _raw_call(url: str, api_name: str, data: list) -> str:
    """The event stream of one API call sent as raw JSON (no client-side upload)."""
    post = httpx.post(f"{url}gradio_api/call/{api_name}", json={"data": data}, timeout=60)
    post.raise_for_status()
    answer = httpx.get(f"{url}gradio_api/call/{api_name}/{post.json()['event_id']}",
                       timeout=120)
    return answer.text


def test_a_server_path_posing_as_an_upload_is_refused(live_app, checkpoint, secret):
    """A request naming a server file as if it were an upload (never sent through the
    upload endpoint) is refused before any callback opens it."""
    posing = {"path": str(secret), "meta": {"_type": "gradio.FileData"}}
    train = [checkpoint, "upload", 64, "", [posing], "train", ["filip"], 0.05, 0.1, 0.05, 16,
             10, 0.5, 1, 1, 1, 2, 1e-3]
    with _OPENED.watch() as opened:
        streams = [_raw_call(live_app.url, "words", [posing, "a red circle", checkpoint]),
                   _raw_call(live_app.url, "train", train)]
    for stream in streams:
        assert "event: error" in stream and "event: complete" not in stream, stream
    assert [p for p in opened.paths if "secret" in p] == []
