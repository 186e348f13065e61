"""What the views do with what people give them: bad input becomes a message in the page
(never a traceback), and large uploads are scaled down before anything encodes or draws
them."""

from __future__ import annotations

import functools
import html
import inspect
import logging
import uuid
from collections.abc import Callable
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image, UnidentifiedImageError

from otviz.backbone import UNREADABLE_IMAGE, ImageInput, ImageInputError, to_rgb
from otviz.errors import UserInputError
from otviz.explain import Encoded, Explainer, InputError

log = logging.getLogger("otviz.ui")

#: Uploads are scaled down to this longer side (every backbone resizes to <= 224 px, and
#: the figures are drawn at panel size), ...
MAX_IMAGE_SIDE = 1024
#: ... and refused beyond this many pixels (a 50 MP image is already 150 MB as RGB).
MAX_IMAGE_PIXELS = 50_000_000


def page_error(message: str, **kwargs: Any) -> gr.Error:
    """A ``gr.Error`` showing ``message`` as text: Gradio renders error messages as HTML,
    so user text in them (a caption, a file name) is escaped."""
    return gr.Error(html.escape(message, quote=False), **kwargs)


def unexpected_error(where: str, error: BaseException) -> gr.Error:
    """The page's message for a bug or an input nobody foresaw: a short id that the server
    log repeats next to the traceback, never the exception's own text."""
    error_id = uuid.uuid4().hex[:8]
    log.error("unexpected error %s in %s", error_id, where, exc_info=error)
    return page_error(
        f"Something unexpected went wrong in this view (error id {error_id}, "
        f"{type(error).__name__}; the server log has the details). Try another image or "
        "caption, or report the id.",
        print_exception=False,
    )


def user_errors(fn: Callable) -> Callable:
    """``fn`` (a callback or a generator callback) with every exception turned into a
    message in the page: a :class:`~otviz.errors.UserInputError` as its own (escaped)
    message, anything else as :func:`unexpected_error`. Every callback of the app goes
    through it (``tests/ui/test_ui_app.py`` checks)."""
    if getattr(fn, "page_errors", False):
        return fn
    where = getattr(fn, "__qualname__", repr(fn))

    def translate(error: Exception) -> gr.Error:
        if isinstance(error, gr.Error):
            return error
        if isinstance(error, UserInputError):
            return page_error(str(error))
        return unexpected_error(where, error)

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def wrapped_gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as e:
                raise translate(e) from None

        wrapped_gen.page_errors = True  # type: ignore[attr-defined]
        return wrapped_gen

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise translate(e) from None

    wrapped.page_errors = True  # type: ignore[attr-defined]
    return wrapped


def guard_callbacks(blocks: gr.Blocks) -> None:
    """Every callback registered on ``blocks`` through :func:`user_errors` (those already
    wrapped stay as they are), so that no event of the page can end in a bare "Error"."""
    for block_fn in blocks.fns.values():
        if block_fn.fn is not None:
            block_fn.fn = user_errors(block_fn.fn)


def image_size(image: Any) -> tuple[int, int] | None:
    """``(width, height)`` of an upload without decoding it where possible (arrays, PIL
    images, and file headers); ``None`` for no image."""
    if image is None:
        return None
    if isinstance(image, np.ndarray):
        if image.ndim < 2:
            raise ImageInputError(f"array of shape {image.shape} is not an image")
        return int(image.shape[1]), int(image.shape[0])
    if isinstance(image, Image.Image):
        return image.size
    return to_rgb(image).size


def fit_image(image: ImageInput | None) -> tuple[ImageInput | None, str | None]:
    """The upload scaled down so that its longer side is at most :data:`MAX_IMAGE_SIDE`
    (aspect ratio kept, Lanczos filter), with a note saying so; unchanged (and no note)
    when it already fits. Raises :class:`InputError` beyond :data:`MAX_IMAGE_PIXELS` and
    :class:`ImageInputError` for what is not an image."""
    size = image_size(image)
    if size is None:
        return None, None
    width, height = size
    if width * height > MAX_IMAGE_PIXELS:
        raise InputError(
            f"the image is too large ({width}x{height} = {width * height / 1e6:.0f} MP; at most "
            f"{MAX_IMAGE_PIXELS / 1e6:.0f} MP): scale it down and upload it again"
        )
    if max(width, height) <= MAX_IMAGE_SIDE:
        return image, None
    scale = MAX_IMAGE_SIDE / max(width, height)
    new = (max(1, round(width * scale)), max(1, round(height * scale)))
    resized = to_rgb(image).resize(new, Image.Resampling.LANCZOS)
    note = f"the image was scaled down from {width}x{height} to {new[0]}x{new[1]} pixels"
    return np.asarray(resized), note


def check_image_file(path: str, name: str | None = None) -> tuple[int, int]:
    """``(width, height)`` of an uploaded file; raises :class:`InputError` for a file over
    :data:`MAX_IMAGE_PIXELS` (from its header, before anything decodes it), and for one
    that is not an image or does not decode (truncated, corrupt) alike."""
    shown = name or str(path).rsplit("/", 1)[-1]
    limit = f"at most {MAX_IMAGE_PIXELS / 1e6:.0f} MP): scale it down and upload it again"
    try:
        with Image.open(path) as image:
            width, height = image.size
            if width * height <= MAX_IMAGE_PIXELS:
                image.load()  # a truncated or corrupt file fails here, like a non-image
    except Image.DecompressionBombError:  # Pillow's own limit, far beyond ours
        raise InputError(f"{shown} is too large ({limit}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise InputError(f"{shown} is {UNREADABLE_IMAGE}") from None
    if width * height > MAX_IMAGE_PIXELS:
        raise InputError(
            f"{shown} is too large ({width}x{height} = {width * height / 1e6:.0f} MP; {limit}")
    return width, height


def checked_uploads(image: gr.Image) -> gr.Image:
    """``image`` with its uploads checked (:func:`check_image_file`) before Gradio decodes
    them, so that a file that is not an image, or a huge one, is a message in the page
    rather than a failed request. (An instance hook: a ``gr.Image`` subclass would make
    Gradio write a type stub next to this module.)"""
    decode = image.preprocess

    def preprocess(payload: Any) -> Any:
        path = getattr(payload, "path", None)
        name = getattr(payload, "orig_name", None)
        try:
            if path and not str(getattr(payload, "url", "") or "").startswith("data:"):
                check_image_file(path, name)
            return decode(payload)
        except InputError as e:
            raise page_error(str(e)) from None
        except Exception:  # Gradio's own decoding of a file that passed the check
            log.warning("upload %r failed to decode", name, exc_info=True)
            raise page_error(f"{name or 'the upload'} is {UNREADABLE_IMAGE}") from None

    image.preprocess = preprocess  # type: ignore[method-assign]
    return image


def truncation_note(encoded: Encoded) -> str | None:
    """Which caption words the model's context length cut (the views leave them out)."""
    cut = encoded.features.truncated[0]
    if not cut:
        return None
    kept = len(encoded.words) - len(cut)
    return (f"the caption is longer than the model reads: only its first {kept} words are "
            f"used ({len(cut)} cut, from \"{encoded.words[cut[0]].text}\" on)")


class UploadExplainer(Explainer):
    """An :class:`~otviz.explain.Explainer` that fits every upload first
    (:func:`fit_image`), so API callers get the same limits as the page."""

    def encode(self, image: ImageInput | None, caption: str | None,
               compute: bool = True) -> Encoded:
        return super().encode(fit_image(image)[0], caption, compute)


@user_errors
def on_upload(image: np.ndarray | None) -> np.ndarray | None:
    """The shared image's upload callback: scale a large upload down in the page (with a
    warning saying so) or refuse it with a message."""
    fitted, note = fit_image(image)
    if note is None:
        return gr.skip()
    gr.Warning(note)
    return fitted
