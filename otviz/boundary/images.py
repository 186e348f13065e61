"""Images as people give them: a file, encoded bytes, an array or a PIL image becomes an
upright 8-bit RGB image, or an :class:`ImageInputError` whose message names the upload.

Files and bytes are decoded once, and only after their header's width and height pass
:func:`check_size`: at most :data:`MAX_IMAGE_PIXELS` (a PNG a few hundred bytes long may
declare 900 megapixels) and sides at most :data:`MAX_ASPECT_RATIO` times apart (a 20000x1
strip has nothing a patch grid can read, and no view can draw or show it back).
High bit depths are scaled to 8 bits by the range their mode can hold (16-bit by 65535,
float by [0, 1]), never clipped, so a 16-bit greyscale scan keeps its contrast.
"""

from __future__ import annotations

import io
import os
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from otviz.boundary.paths import NOT_FOUND
from otviz.boundary.problems import listed
from otviz.errors import InputError

ImageInput = Image.Image | np.ndarray | str | os.PathLike | bytes

#: An image is refused beyond this many pixels (a 50 MP image is already 150 MB as RGB).
MAX_IMAGE_PIXELS = 50_000_000
#: An image whose longer side is more than this many times its shorter side is refused.
MAX_ASPECT_RATIO = 20
#: What every unreadable upload (not an image, truncated, corrupt) is told, after its name.
UNREADABLE_IMAGE = "not an image this app can read: upload a PNG, JPEG, WebP, BMP, ..."
_DECODE_ERRORS = (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError)
#: Modes of more than 8 bits per sample (16- and 32-bit integer, float).
_WIDE_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
#: The full scale of an integer image wider than 8 bits (16-bit PNG, TIFF).
_SIXTEEN_BIT = 65535

#: Held while a header is opened with Pillow's DecompressionBombWarning silenced:
#: ``warnings.catch_warnings`` saves the filters on entry and puts them back on exit, so two
#: threads in it at once (the served app opens uploads on several) could put back filters
#: without the other's silencing while it opened a 144 MP header, and the warning escaped
#: (the hostile catalogue, fresh-clone run of seed 320689041). Opening a header takes
#: microseconds to a few milliseconds; the pixels are decoded outside the lock.
_SILENCED_OPEN = threading.Lock()


class ImageInputError(InputError):
    """An input is not a usable image (unreadable, empty, too large)."""


def too_large(shown: str, width: int | None = None, height: int | None = None
              ) -> ImageInputError:
    """The error for an image over :data:`MAX_IMAGE_PIXELS` (of the size its header gives,
    where Pillow read it)."""
    size = "" if width is None or height is None else (
        f"{width}x{height} = {width * height / 1e6:.0f} MP; ")
    return ImageInputError(
        f"{shown} is too large ({size}at most {MAX_IMAGE_PIXELS / 1e6:.0f} MP): scale it "
        "down and upload it again")


def check_size(shown: str, width: int, height: int) -> None:
    """Refuse an image of ``width`` x ``height`` pixels over :data:`MAX_IMAGE_PIXELS`, or
    whose longer side is more than :data:`MAX_ASPECT_RATIO` times its shorter side (the
    message names the bound and the image's size)."""
    if width * height > MAX_IMAGE_PIXELS:
        raise too_large(shown, width, height)
    if max(width, height) > MAX_ASPECT_RATIO * max(1, min(width, height)):
        raise ImageInputError(
            f"{shown} is too thin ({width}x{height} pixels; the longer side may be at most "
            f"{MAX_ASPECT_RATIO} times the shorter): crop it and upload it again")


def _source_name(source: str | os.PathLike | bytes | bytearray, name: str | None) -> str:
    if name:
        return Path(str(name)).name
    if isinstance(source, (bytes, bytearray)):
        return "the image"
    return Path(source).name or "the image"


def _opened(source: str | os.PathLike | bytes | bytearray, shown: str) -> Image.Image:
    """The image at ``source`` opened lazily (header parsed, pixels not decoded yet)."""
    try:
        with _SILENCED_OPEN, warnings.catch_warnings():  # our limit is below Pillow's warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            if isinstance(source, (bytes, bytearray)):
                return Image.open(io.BytesIO(bytes(source)))
            return Image.open(Path(source))
    except Image.DecompressionBombError:  # Pillow's own header check, far beyond ours
        raise too_large(shown) from None
    except _DECODE_ERRORS:
        raise ImageInputError(f"{shown} is {UNREADABLE_IMAGE}") from None


def header_size(source: str | os.PathLike | bytes | bytearray,
                name: str | None = None) -> tuple[int, int]:
    """``(width, height)`` of an image file or encoded bytes from its header alone (no pixel
    is decoded); :class:`ImageInputError` for what is not an image or fails
    :func:`check_size`."""
    shown = _source_name(source, name)
    with _opened(source, shown) as image:
        width, height = image.size
    check_size(shown, width, height)
    return width, height


def check_headers(paths: Sequence[Path]) -> None:
    """Every image file's header checked (:func:`header_size`), the problems reported
    together: one :class:`ImageInputError` naming the first few and counting the others
    (:func:`~otviz.boundary.problems.listed`), so that a folder with several bad images is
    refused once, not once per image (a single problem is its own message). A file that
    cannot be opened is a problem like the others."""
    problems = []
    for path in paths:
        try:
            header_size(path, path.name)
        except ImageInputError as e:
            problems.append(str(e))
        except OSError:
            problems.append(f"{path.name} is {NOT_FOUND}")
    if not problems:
        return
    if len(problems) == 1:
        raise ImageInputError(problems[0])
    raise ImageInputError(f"{len(problems)} of {len(paths)} images cannot be used: "
                          f"{listed(problems)}")


def decode_image(source: str | os.PathLike | bytes | bytearray,
                 name: str | None = None) -> Image.Image:
    """An image file or encoded bytes as an upright 8-bit RGB image, decoded once after its
    header passed :func:`check_size`. ``name`` is how messages call it (default: the
    file's name, never its folder)."""
    shown = _source_name(source, name)
    image = _opened(source, shown)
    try:
        check_size(shown, image.width, image.height)
    except ImageInputError:
        image.close()
        raise
    try:
        image.load()  # a truncated or corrupt file fails here, like a non-image
        return _rgb(image, shown)
    except InputError:
        raise
    except _DECODE_ERRORS:
        raise ImageInputError(f"{shown} is {UNREADABLE_IMAGE}") from None
    finally:
        image.close()


def to_rgb(image: ImageInput, name: str | None = None) -> Image.Image:
    """Any image input as an 8-bit RGB PIL image, upright.

    Accepts a PIL image, a numpy array (``[H, W]``, ``[H, W, 1|3|4]``; uint8, uint16, bool or
    float in [0, 1]), a file path or encoded bytes (through :func:`decode_image`). Applies
    the EXIF orientation, composites transparency (RGBA, LA, palette with a transparent
    index) on white, scales 16- and 32-bit and float images to 8 bits. Raises
    :class:`ImageInputError` for a file or bytes that :func:`decode_image` refuses and for
    anything else. An array or a PIL image is already in memory: the library takes any
    shape, and the app checks the ones people give it (``otviz.ui.inputs.fit_image``).
    """
    if isinstance(image, (str, os.PathLike, bytes, bytearray)):
        return decode_image(image, name)
    if isinstance(image, np.ndarray):
        return array_to_rgb(image)
    if not isinstance(image, Image.Image):
        raise ImageInputError(f"not an image: {type(image).__name__}")
    return _rgb(image, name or "the image")


def _rgb(image: Image.Image, shown: str) -> Image.Image:
    if image.width < 1 or image.height < 1:
        raise ImageInputError(f"{shown} is an empty image")
    image = ImageOps.exif_transpose(image)
    mode = image.mode
    if mode in _WIDE_MODES:
        a = np.asarray(image)
        return array_to_rgb(a, None if mode == "F" else _SIXTEEN_BIT)
    if mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    elif mode in ("LA", "La", "PA", "RGBa"):
        image = image.convert("RGBA")
    if image.mode == "RGBA":
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image).convert("RGB")
    return image.convert("RGB")


def array_to_rgb(a: np.ndarray, full_scale: int | None = None) -> Image.Image:
    """An image array as 8-bit RGB: bool as 0/255; uint16 (and integers above 255, or any
    integer image when ``full_scale`` is given) scaled from ``[0, full_scale]`` (default
    65535), never clipped at 255; floats scaled from [0, 1] (from [0, 255] when their
    maximum is above 1), non-finite values made 0 or 1; RGBA composited on white."""
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)) or a.size == 0:
        raise ImageInputError(f"array of shape {a.shape} is not an image")
    if a.dtype == np.bool_:
        a = a.astype(np.uint8) * 255
    elif a.dtype.kind in "iu" and (full_scale is not None or a.dtype == np.uint16
                                   or a.max(initial=0) > 255):
        top = float(full_scale or _SIXTEEN_BIT)
        a = (np.clip(a.astype(np.float64), 0, top) * (255.0 / top)).round().astype(np.uint8)
    elif a.dtype.kind == "f":
        finite = np.nan_to_num(a.astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
        top = 1.0 if finite.max(initial=0.0) <= 1.0 else 255.0
        a = (np.clip(finite * (255.0 / top), 0, 255)).round().astype(np.uint8)
    elif a.dtype != np.uint8:
        a = np.clip(a, 0, 255).astype(np.uint8)
    image = Image.fromarray(np.ascontiguousarray(a))
    if image.mode == "RGBA":
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image).convert("RGB")
    return image.convert("RGB")
