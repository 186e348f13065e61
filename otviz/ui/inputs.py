"""What the views do with what people give them: every upload decoded once through the
input boundary (:mod:`otviz.boundary`), bad input a message in the page (never a traceback,
never a server path), large uploads scaled down before anything encodes or draws them; a
user error is one log line with its id, an unexpected one keeps its traceback."""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import html
import inspect
import logging
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import gradio.component_meta
import numpy as np
from gradio.data_classes import FileData, ListFiles
from gradio.exceptions import InvalidPathError
from gradio.utils import NamedString, get_upload_folder
from gradio_client import utils as client_utils
from PIL import Image

from otviz.boundary.images import (
    UNREADABLE_IMAGE,
    ImageInput,
    ImageInputError,
    check_size,
    decode_image,
    header_size,
    to_rgb,
)
from otviz.boundary.paths import inside, scrub_server_paths
from otviz.errors import UserInputError
from otviz.explain import Encoded, Explainer
from otviz.ui.cheap_events import cheap_event
from otviz.ui.fields import EventFields
from otviz.ui.upload_cache import (
    PREVIEW_GRACE_S,
    discard_upload,
    discarded_if_refused,
    why_gone,
)

log = logging.getLogger("otviz.ui")

#: Uploads are scaled down to this longer side (every backbone resizes to <= 224 px, and
#: the figures are drawn at panel size); beyond
#: :data:`~otviz.boundary.images.MAX_IMAGE_PIXELS` they are refused.
MAX_IMAGE_SIDE = 1024


def page_error(message: str) -> gr.Error:
    """A ``gr.Error`` showing ``message`` as text: Gradio renders error messages as HTML,
    so user text in them (a caption, a file name) is escaped, and any server folder in it is
    cut (:func:`~otviz.boundary.paths.scrub_server_paths`). Gradio prints no traceback for
    it: the callers log what they need."""
    return gr.Error(html.escape(scrub_server_paths(message), quote=False),
                    print_exception=False)


def user_error(where: str, message: str) -> gr.Error:
    """The page's message for a user error, logged as one line with a short id."""
    error_id = uuid.uuid4().hex[:8]
    log.info("user error %s in %s: %s", error_id, where, scrub_server_paths(message))
    return page_error(message)


def unexpected_error(where: str, error: BaseException) -> gr.Error:
    """The page's message for a bug or an input nobody foresaw: a short id that the server
    log repeats next to the traceback, never the exception's own text."""
    error_id = uuid.uuid4().hex[:8]
    log.error("unexpected error %s in %s", error_id, where, exc_info=error)
    return page_error(
        f"Something unexpected went wrong in this view (error id {error_id}, "
        f"{type(error).__name__}; the server log has the details). Try another image or "
        "caption, or report the id.")


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
            if error.print_exception:  # raised by Gradio or a view: one line here instead
                log.info("user error in %s: %s", where, error.message)
                error.print_exception = False
            return error
        if isinstance(error, UserInputError):
            return user_error(where, str(error))
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
    wrapped stay as they are), so that no event of the page can end in a bare "Error"; the
    page's ordinary events (the queue's default group) counted as cheap while they run
    (:func:`~otviz.ui.budget.cheap_event`: expensive work steps aside for them); and
    Gradio's own refusals of an input before any callback (:func:`quiet_refusals`) one log
    line each."""
    for block_fn in blocks.fns.values():
        if block_fn.fn is not None:
            block_fn.fn = user_errors(block_fn.fn)
            if block_fn.concurrency_limit == "default":  # the page's ordinary events
                block_fn.fn = cheap_event(block_fn.fn)
    quiet_refusals(blocks)


def quiet_refusals(blocks: gr.Blocks) -> None:
    """Every event's inputs checked as typed fields (:class:`~otviz.ui.fields.EventFields`)
    before Gradio reads them, and Gradio's own refusals of an input (a file path that was
    never uploaded, sent through the raw API) one log line with an id and a message naming
    the field, as for the app's user errors, never a traceback. On the Blocks itself, the
    object that preprocesses every event's inputs (components are copied per session)."""
    preprocess = blocks.preprocess_data
    events: dict[int, EventFields] = {}

    @functools.wraps(preprocess)
    async def preprocess_data(block_fn, inputs, state, *args, **kwargs):
        fields = events.get(id(block_fn))
        if fields is None:
            fields = events[id(block_fn)] = EventFields(block_fn)
        try:
            fields.check(block_fn, inputs, state)
            return await preprocess(block_fn, inputs, state, *args, **kwargs)
        except UserInputError as e:
            raise user_error("input check", str(e)) from None
        except InvalidPathError:
            raise user_error("input check", fields.not_uploaded(block_fn, inputs)) from None
        except gr.Error as e:
            if e.print_exception:
                raise user_error("input check", e.message) from None
            raise

    blocks.preprocess_data = preprocess_data  # type: ignore[method-assign]


def image_size(image: Any) -> tuple[int, int] | None:
    """``(width, height)`` of an upload without decoding it (arrays, PIL images, and file
    headers through :func:`~otviz.boundary.images.header_size`); ``None`` for no image."""
    if image is None:
        return None
    if isinstance(image, np.ndarray):
        if image.ndim < 2:
            raise ImageInputError(f"array of shape {image.shape} is not an image")
        return int(image.shape[1]), int(image.shape[0])
    if isinstance(image, Image.Image):
        return image.size
    if isinstance(image, (str, bytes, bytearray)) or hasattr(image, "__fspath__"):
        return header_size(image)
    return to_rgb(image).size


def fit_image(image: ImageInput | None) -> tuple[ImageInput | None, str | None]:
    """The upload scaled down so that its longer side is at most :data:`MAX_IMAGE_SIDE`
    (aspect ratio kept, Lanczos filter), with a note saying so; unchanged (and no note)
    when it already fits. Raises :class:`ImageInputError` for an image
    :func:`~otviz.boundary.images.check_size` refuses (too many pixels, too thin) and for
    what is not an image."""
    size = image_size(image)
    if size is None:
        return None, None
    width, height = size
    check_size("the image", width, height)
    if max(width, height) <= MAX_IMAGE_SIDE:
        return image, None
    scale = MAX_IMAGE_SIDE / max(width, height)
    new = (max(1, round(width * scale)), max(1, round(height * scale)))
    resized = to_rgb(image).resize(new, Image.Resampling.LANCZOS)
    note = f"the image was scaled down from {width}x{height} to {new[0]}x{new[1]} pixels"
    return np.asarray(resized), note


def gone(path: str, name: str) -> str:
    """What an event is told of an upload no longer on the server: why it was refused
    (:func:`~otviz.ui.upload_cache.why_gone`), else that it expired (the upload cache's
    schedule removed it: :mod:`otviz.ui.upload_cache`)."""
    return why_gone(path) or f"{name} is no longer on the server (expired): upload it again"


def decode_upload(payload: Any, discard_after_s: float = 0.0) -> np.ndarray | None:
    """An image component's upload (a file, or a ``data:`` URL) as uint8 RGB ``[H, W, 3]``,
    decoded once by :func:`~otviz.boundary.images.decode_image` (pixel limit and aspect
    ratio from the header first, 16-bit scaled); a bad upload is a page message naming it,
    and its file leaves Gradio's cache at once (``discard_after_s`` seconds later)."""
    if payload is None:
        return None
    name = getattr(payload, "orig_name", None) or "the upload"
    url = str(getattr(payload, "url", "") or "")
    try:
        if url.startswith("data:"):
            try:
                data = base64.b64decode(url.split(",", 1)[-1], validate=False)
            except (binascii.Error, ValueError):
                raise ImageInputError(f"{name} is {UNREADABLE_IMAGE}") from None
            return np.asarray(decode_image(data, name))
        path = getattr(payload, "path", None)
        if not path:
            raise ImageInputError(f"{name} is {UNREADABLE_IMAGE}")
        if not Path(path).is_file():
            raise ImageInputError(gone(path, name))
        try:
            with discarded_if_refused([path], discard_after_s):
                return np.asarray(decode_image(path, name))
        except ImageInputError as e:  # the same reason as an event that removed it meanwhile
            raise ImageInputError(why_gone(path) or str(e)) from None
    except UserInputError as e:
        raise user_error("image upload", str(e)) from None


@contextlib.contextmanager
def no_type_stub() -> Iterator[None]:
    """Gradio writes a ``.pyi`` stub next to the module of every component class it sees
    defined; the app's component subclasses need none."""
    write = gradio.component_meta.create_or_modify_pyi
    gradio.component_meta.create_or_modify_pyi = lambda *args, **kwargs: None
    try:
        yield
    finally:
        gradio.component_meta.create_or_modify_pyi = write


with no_type_stub():

    class CheckedImage(gr.Image):
        """The app's image input: every upload goes through :func:`decode_upload` instead
        of Gradio's own decoding, on every path (a fresh page, after an example was picked,
        API calls). A class, not an instance hook: Gradio rebuilds a component from its
        class when an event updates it (picking an example does), and the copy must check
        too. A template of ``gr.Image`` (Gradio's mark for a subclass that the page shows
        with its parent's frontend)."""

        is_template = True

        def preprocess(self, payload: Any) -> np.ndarray | None:
            return decode_upload(payload)

    class CheckedFile(gr.File):
        """The app's file input (paths to the uploaded files): a file of a type the input
        does not take is refused before any callback as a user error like the app's own
        (one log line with its id, the message escaped), and leaves Gradio's cache at once;
        no stray empty file is left in the cache for each upload (``gr.File`` makes one per
        file it passes on and never removes it). A template of ``gr.File``, as
        :class:`CheckedImage` is of ``gr.Image``."""

        is_template = True

        def preprocess(self, payload: Any) -> Any:
            if payload is None:
                return None
            files = list(payload) if isinstance(payload, ListFiles) else [payload]
            refused = [f for f in files if self.file_types
                       and not client_utils.is_valid_file(f.path, self.file_types)]
            if refused:
                names = ", ".join(f.orig_name or Path(f.path).name for f in refused)
                message = (f"Invalid file type: {names}; upload files of these types: "
                           f"{self.file_types}")
                for f in refused:
                    discard_upload(f.path, message)
                raise user_error("file upload", message)
            for f in files:
                if not Path(f.path).is_file():
                    raise user_error("file upload",
                                     gone(f.path, f.orig_name or Path(f.path).name))
            paths = [_named(f) for f in files]
            return paths[0] if self.file_count == "single" else paths


def _named(file: FileData) -> NamedString:
    """The cached path of an uploaded ``file`` carrying the name it was uploaded under
    (``orig_name``: :func:`otviz.boundary.paths.upload_name` copies it under that name)."""
    path = NamedString(file.path)
    path.orig_name = file.orig_name  # type: ignore[attr-defined]
    return path


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
def on_upload(payload: dict | None) -> np.ndarray | None:
    """The shared image's upload callback, on the upload as the page sent it
    (``preprocess=False``): scale a large upload down in the page (with a warning saying so)
    or refuse it with its message, the page's preview of it cleared (a refused upload left
    in the input is a broken picture). A refused file leaves Gradio's cache
    :data:`~otviz.ui.upload_cache.PREVIEW_GRACE_S` later, once the page's fetch of the
    preview is served."""
    file = None if payload is None else FileData(**payload)
    if file is not None and file.path and not inside(Path(get_upload_folder()).resolve(),
                                                     file.path):
        raise UserInputError(f"{file.orig_name or 'the upload'} is not an upload of this page")
    try:
        fitted, note = fit_image(decode_upload(file, PREVIEW_GRACE_S))
    except gr.Error as refused:
        gr.Warning(refused.message)
        return None
    if note is None:
        return gr.skip()
    gr.Warning(note)
    return fitted
