"""The input boundary: images decoded once with the pixel limit and the aspect-ratio bound
from the header and high bit depths scaled (checked against the closed form), text checks
(letters of any script) for text boxes and captions in files alike, path confinement and
unpacking (lying zip headers), and server paths (only those) cut from messages."""

from __future__ import annotations

import io
import json
import os
import struct
import tempfile
import warnings
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from otviz.boundary.images import (
    MAX_ASPECT_RATIO,
    MAX_IMAGE_PIXELS,
    ImageInputError,
    decode_image,
    header_size,
    to_rgb,
)
from otviz.boundary.paths import (
    MAX_UPLOAD_BYTES,
    confine,
    scrub_server_paths,
    unpack_uploads,
)
from otviz.boundary.text import MAX_CAPTION_CHARS, check_caption, check_phrase, parse_word_list
from otviz.data.datasets import MalformedDatasetError, load_image_captions
from otviz.errors import InputError
from tests.helpers import png_header


def test_sixteen_bit_images_are_scaled_not_clipped(tmp_path):
    ramp = (np.arange(64 * 48, dtype=np.uint32) * 21).astype(np.uint16).reshape(48, 64)
    path = tmp_path / "deep.png"
    Image.fromarray(ramp).save(path)
    rgb = np.asarray(decode_image(path))
    expected = np.round(ramp.astype(np.float64) * 255 / 65535).astype(np.uint8)
    assert rgb.shape == (48, 64, 3)
    for c in range(3):
        np.testing.assert_array_equal(rgb[..., c], expected)
    assert (rgb < 250).mean() > 0.9  # a 16-bit ramp, not a near-white clip
    np.testing.assert_array_equal(np.asarray(to_rgb(ramp)), rgb)  # arrays alike


def test_the_pixel_limit_is_read_from_the_header(tmp_path):
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(png_header(30_000, 30_000))  # 900 MP: Pillow's own check refuses it
    mid = tmp_path / "mid.png"
    mid.write_bytes(png_header(10_000, 10_000))  # 100 MP: under Pillow's check, over ours
    assert bomb.stat().st_size < 200
    for call in (header_size, decode_image, to_rgb):
        with pytest.raises(ImageInputError, match=r"bomb.png is too large \(at most 50 MP"):
            call(bomb)
        with pytest.raises(ImageInputError, match=r"mid.png is too large \(10000x10000"):
            call(mid)
    side = int(MAX_IMAGE_PIXELS ** 0.5)
    assert header_size(png_header(side, side)) == (side, side)


def test_a_header_over_pillows_warning_is_refused_without_a_warning_on_any_thread():
    """The served app opens uploads on several threads: a 144 MP header (over Pillow's
    warning at 89 MP, under its error at 179 MP) opened on eight at once is refused as too
    large, and Pillow's warning is silenced on every thread."""
    bomb = png_header(12_000, 12_000)

    def open_bombs() -> None:
        for _ in range(50):
            with pytest.raises(ImageInputError, match="too large"):
                header_size(bomb, "bomb.png")

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", Image.DecompressionBombWarning)
        with ThreadPoolExecutor(8) as pool:
            for done in [pool.submit(open_bombs) for _ in range(8)]:
                done.result()
    assert not [w for w in seen if issubclass(w.category, Image.DecompressionBombWarning)]


@pytest.mark.parametrize("width, height", [(20000, 1), (1, 20000), (16384, 2), (2, 16384),
                                           (MAX_ASPECT_RATIO + 1, 1), (4200, 200)])
def test_thin_images_are_refused_with_the_bound_and_their_size(width, height):
    """Every path from a file or bytes (header, decode, to_rgb) refuses a side more than
    MAX_ASPECT_RATIO (20) times the other, saying the bound and the image's size; the app's
    arrays pass the same check (``tests/ui/test_extreme_images.py``)."""
    expected = (f"thin.png is too thin ({width}x{height} pixels; the longer side may be at "
                "most 20 times the shorter): crop it and upload it again")
    assert MAX_ASPECT_RATIO == 20
    header = png_header(width, height)
    for call in (header_size, decode_image, to_rgb):
        with pytest.raises(ImageInputError) as refused:
            call(header, "thin.png")
        assert str(refused.value) == expected


@pytest.mark.parametrize("width, height", [(1, 1), (20, 1), (1, 20), (2000, 100), (3, 2)])
def test_small_and_elongated_images_within_the_bound_pass(width, height):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    assert header_size(buffer.getvalue()) == (width, height)
    np.testing.assert_array_equal(np.asarray(decode_image(buffer.getvalue())), pixels)
    np.testing.assert_array_equal(np.asarray(to_rgb(pixels)), pixels)


@pytest.mark.parametrize("content", [b"", b"just text", png_header(20, 20)[:30]])
def test_unreadable_files_name_the_upload_only(tmp_path, content):
    path = tmp_path / "upload.png"
    path.write_bytes(content)
    with pytest.raises(ImageInputError) as refused:
        decode_image(path)
    assert str(refused.value).startswith("upload.png is not an image this app can read")
    assert str(tmp_path) not in str(refused.value)


def test_a_truncated_png_is_refused(tmp_path):
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (80, 80, 3), np.uint8)).save(
        buffer, "PNG")
    with pytest.raises(ImageInputError, match="cut.png is not an image"):
        decode_image(buffer.getvalue()[: len(buffer.getvalue()) // 2], "cut.png")


def test_text_checks():
    assert check_caption("  a red circle ") == "a red circle"
    assert check_caption("دائرة حمراء") == "دائرة حمراء"  # letters of any script
    for bad, message in (
        ("", "the caption is empty: type what the image shows"),
        (" \t\n", "the caption is empty: type what the image shows"),
        ("x" * 1001, "the caption is over 1000 characters (1001)"),
        ("!!! ... ???", "the caption has no letter or digit: type what the image shows"),
    ):
        with pytest.raises(InputError) as refused:
            check_caption(bad)
        assert str(refused.value) == message
    with pytest.raises(InputError, match="pick a word"):
        check_phrase("  ")
    assert parse_word_list("أحمر، دائرة, красный; 赤") == ["أحمر، دائرة", "красный", "赤"]
    with pytest.raises(InputError, match="not words"):
        parse_word_list("red, !!!")


def test_control_characters_become_spaces():
    """No font draws a NUL, a bell or an escape: captions, phrases and word lists reach the
    views (figure titles included) with spaces in their place; letters are untouched."""
    assert check_caption("a red\x00 circle\x07 \x1b[31mnext to\x08 a star\r") == (
        "a red  circle   [31mnext to  a star")
    assert check_caption("a\tred\x85circle\x9f") == "a red circle"  # C1 controls too
    assert check_phrase("\x00red\x7f") == "red"
    assert parse_word_list("red\x1b, blue\x00 star") == ["red", "blue  star"]
    assert check_caption("é\u200dक्ष") == "é\u200dक्ष"  # format characters (ZWJ) kept
    with pytest.raises(InputError, match="empty"):
        check_caption("\x00\x07\x1b")


def test_one_confinement(tmp_path):
    root = tmp_path / "upload"
    (root / "images").mkdir(parents=True)
    (tmp_path / "secret.png").write_bytes(b"x")
    os.symlink(tmp_path / "secret.png", root / "images" / "link.png")
    assert confine(root, root, "images/a.png") == root / "images" / "a.png"
    for name in ("/etc/shadow", "../secret.png", "images/../../secret.png",
                 "C:\\\\windows", "images/link.png", "a\0b", ""):
        assert confine(root, root, name) is None, name


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_unpacking_refuses_escapes_and_lying_headers(tmp_path):
    with pytest.raises(InputError, match="points outside"):
        unpack_uploads([_zip(tmp_path / "a.zip", {"../x.csv": b"x"})], tmp_path / "a")
    with pytest.raises(InputError, match="points outside"):
        unpack_uploads([_zip(tmp_path / "b.zip", {"/etc/passwd": b"x"})], tmp_path / "b")
    # a header that claims 10 bytes for a 1000-byte member, and one that claims 1 TB
    data = _zip(tmp_path / "c.zip", {"a.csv": b"y" * 1000}).read_bytes()
    small = data.replace(struct.pack("<I", 1000), struct.pack("<I", 10))
    (tmp_path / "small.zip").write_bytes(small)
    with pytest.raises(InputError, match="small.zip is not a readable .zip file"):
        unpack_uploads([tmp_path / "small.zip"], tmp_path / "c")
    huge = data.replace(struct.pack("<I", 1000), struct.pack("<I", MAX_UPLOAD_BYTES + 1))
    (tmp_path / "huge.zip").write_bytes(huge)
    with pytest.raises(InputError, match="unpacks to over"):
        unpack_uploads([tmp_path / "huge.zip"], tmp_path / "d")
    root = unpack_uploads([_zip(tmp_path / "ok.zip", {"f/a.csv": b"z"})], tmp_path / "e")
    assert (root / "a.csv").read_bytes() == b"z"


def test_server_paths_are_cut_from_messages():
    tmp = tempfile.gettempdir()
    message = f"cannot read {tmp}/otviz-browse-x1/captions.csv: line 1; and {os.getcwd()}/a/b.png"
    assert scrub_server_paths(message) == "cannot read captions.csv: line 1; and b.png"
    assert scrub_server_paths("a red/blue circle") == "a red/blue circle"


def test_what_a_person_typed_is_not_edited():
    """Only paths below a server folder are cut: a server folder's own name typed by a
    person, a name that merely begins like one, and paths elsewhere stay as written."""
    home, tmp = str(Path.home()), tempfile.gettempdir()
    typed = (f'"{home}" is not in the caption; "{tmp}" and "{tmp}rary/x" and '
             f'"/data{tmp}/x" and "/etc/passwd": not found or not allowed')
    assert scrub_server_paths(typed) == typed
    assert scrub_server_paths(f'"{tmp}/gradio/1f/bomb.png" is too large') == (
        '"bomb.png" is too large')


# ----------------------------------------------------------------------- captions in files
def _captions_csv(tmp_path: Path, caption: str) -> Path:
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    path = tmp_path / "captions.csv"
    path.write_text(f"path,caption\na.png,a red circle\na.png,{caption}\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("caption, message", [
    ("x" * 950_000, "captions.csv, line 3: the caption is over 1000 characters (over 131072)"),
    ("a red circle " * 146 + "xy", "captions.csv, line 3: the caption is over 1000 characters "
                                  "(1900)"),
    ("!!! ...", "captions.csv, line 3: the caption has no letter or digit: type what the "
                "image shows"),
    ('" "', "captions.csv, line 3: the caption is empty: type what the image shows"),
])
def test_captions_in_files_obey_the_text_boxes_rule(tmp_path, caption, message):
    """A caption in an uploaded CSV is refused as the caption box refuses it, with its line;
    a field over the csv module's own limit (a valid UTF-8 file) is an over-long caption,
    not an unreadable CSV."""
    path = _captions_csv(tmp_path, caption)
    with pytest.raises(MalformedDatasetError) as refused:
        load_image_captions(path, root=tmp_path)
    assert str(refused.value) == message


def test_captions_in_files_take_every_script_and_coco_files_the_same_rule(tmp_path):
    path = _captions_csv(tmp_path, "دائرة حمراء بجانب نجمة زرقاء")
    assert load_image_captions(path, root=tmp_path).captions[1] == "دائرة حمراء بجانب نجمة زرقاء"
    coco = tmp_path / "annotations" / "captions_test.json"
    coco.parent.mkdir()
    coco.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png"}], "annotations": [
        {"image_id": 1, "caption": "y" * (MAX_CAPTION_CHARS + 1)}]}))
    with pytest.raises(MalformedDatasetError) as refused:
        load_image_captions(coco, image_root=tmp_path, root=tmp_path)
    assert str(refused.value) == ("annotations/captions_test.json, annotations[0]: the caption "
                                  "is over 1000 characters (1001)")
