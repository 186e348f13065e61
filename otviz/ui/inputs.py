"""What the views do with what people give them: bad input becomes a message in the page
(never a traceback), and large uploads are scaled down before anything encodes or draws
them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image, UnidentifiedImageError

from otviz.backbone import BackboneLoadError, ImageInput, ImageInputError, to_rgb
from otviz.checkpoint import CheckpointError
from otviz.pipeline import Encoded, Explainer, InputError
from otviz.text.tokens import TokenizationError
from otviz.train.folders import DatasetError

#: Errors caused by what the user gave (an upload, a caption, a picked checkpoint, a
#: training folder): their message is for people and goes to the page as ``gr.Error``.
USER_ERRORS: tuple[type[Exception], ...] = (
    InputError,
    ImageInputError,
    TokenizationError,
    CheckpointError,
    BackboneLoadError,
    DatasetError,
)
#: Uploads are scaled down to this longer side (every backbone resizes to <= 224 px, and
#: the figures are drawn at panel size), ...
MAX_IMAGE_SIDE = 1024
#: ... and refused beyond this many pixels (a 50 MP image is already 150 MB as RGB).
MAX_IMAGE_PIXELS = 50_000_000


def user_errors(fn: Callable) -> Callable:
    """``fn`` (a callback or a generator callback) with :data:`USER_ERRORS` turned into a
    ``gr.Error`` carrying their message."""
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def wrapped_gen(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except USER_ERRORS as e:
                raise gr.Error(str(e)) from None

        return wrapped_gen

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            raise gr.Error(str(e)) from None

    return wrapped


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
    """``(width, height)`` of an uploaded file, read from its header only; raises
    :class:`InputError` for a file that is not an image or is over
    :data:`MAX_IMAGE_PIXELS` (before anything decodes it)."""
    shown = name or str(path).rsplit("/", 1)[-1]
    try:
        with Image.open(path) as header:
            width, height = header.size
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError):
        raise InputError(
            f"{shown} is not an image this app can read: upload a PNG, JPEG, WebP, BMP, ..."
        ) from None
    if width * height > MAX_IMAGE_PIXELS:
        raise InputError(
            f"{shown} is too large ({width}x{height} = {width * height / 1e6:.0f} MP; at "
            f"most {MAX_IMAGE_PIXELS / 1e6:.0f} MP): scale it down and upload it again"
        )
    return width, height


def checked_uploads(image: gr.Image) -> gr.Image:
    """``image`` with its uploads checked (:func:`check_image_file`) before Gradio decodes
    them, so that a file that is not an image, or a huge one, is a message in the page
    rather than a failed request. (An instance hook: a ``gr.Image`` subclass would make
    Gradio write a type stub next to this module.)"""
    decode = image.preprocess

    def preprocess(payload: Any) -> Any:
        path = getattr(payload, "path", None)
        if path and not str(getattr(payload, "url", "") or "").startswith("data:"):
            try:
                check_image_file(path, getattr(payload, "orig_name", None))
            except InputError as e:
                raise gr.Error(str(e)) from None
        return decode(payload)

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
    """An :class:`~otviz.pipeline.Explainer` that fits every upload first
    (:func:`fit_image`), so API callers get the same limits as the page."""

    def encode(self, image: ImageInput | None, caption: str | None) -> Encoded:
        return super().encode(fit_image(image)[0], caption)


def on_upload(image: np.ndarray | None) -> np.ndarray | None:
    """The shared image's upload callback: scale a large upload down in the page (with a
    warning saying so) or refuse it with a message."""
    try:
        fitted, note = fit_image(image)
    except (InputError, ImageInputError) as e:
        raise gr.Error(str(e)) from None
    if note is None:
        return gr.skip()
    gr.Warning(note)
    return fitted
