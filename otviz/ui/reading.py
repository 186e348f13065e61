"""How the app reads a backbone's image: the feature source (:mod:`otviz.towers.sources`:
``last``, ``layer:K``, the dense last-block paths) and the input size, one choice for every
view.

Every endpoint that reads a backbone takes the choice as its own ``features`` and
``image_size`` parameters beside ``checkpoint``, the picker's entry (model and head set
only); :func:`named_reading` checks them and refuses a reading written into the checkpoint
the old way (``"... · features layer:8 · 448 px"``). Inside the app the choice is appended to
the entry as trailing parts (:func:`with_reading`; the default reading, ``last`` at the
tower's native size, adds nothing) and :func:`split_reading` parses it back, checking each
part like any input (a bad one is a :class:`~otviz.errors.UserInputError` naming
``features`` or ``image size``); the app's context keys every cache (encoded images, method
suites, the Align view's grids) by that value, so a new reading encodes once and is kept
like a new image.
"""

from __future__ import annotations

from dataclasses import dataclass

from otviz.errors import InputError
from otviz.knobs import feature_source_parts

#: Between the parts of a value (the context's ``SEPARATOR``).
SEPARATOR = " · "
FEATURES_PREFIX = "features "
SIZE_SUFFIX = " px"
#: The input sides the size control offers, as multiples of the tower's native side
#: (224 px: 336, 448; ViT position embeddings interpolated, ``Backbone.with_features``).
SIZE_FACTORS = (1.5, 2.0)


@dataclass(frozen=True)
class Reading:
    """A feature source as written (``last``, ``layer:K``, ``maskclip``, ...) and an input
    side in pixels (``None``: the tower's native size)."""

    features: str = "last"
    image_size: int | None = None

    @property
    def suffix(self) -> str:
        """The parts this reading adds to a picker entry (none for the default)."""
        parts = [] if self.features == "last" else [f"{FEATURES_PREFIX}{self.features}"]
        parts += [] if self.image_size is None else [f"{self.image_size}{SIZE_SUFFIX}"]
        return "".join(SEPARATOR + part for part in parts)

    @property
    def train_fields(self) -> dict[str, str | int]:
        """The training config's fields (``features``, ``image_size``: 0 for native) that
        train heads on this reading; none for the default."""
        if self == DEFAULT_READING:
            return {}
        return {"features": self.features, "image_size": self.image_size or 0}


DEFAULT_READING = Reading()

#: What an endpoint says to a checkpoint value with a reading written into it.
READING_IN_CHECKPOINT = ("checkpoint: the value carries a reading (a features or px part); "
                         "pass the reading as the features and image_size parameters and "
                         "the checkpoint as its picker entry")


def split_reading(value: str) -> tuple[str, Reading]:
    """``(picker entry, reading)`` of a value read at a reading: the trailing ``features ...`` and
    ``... px`` parts are the reading, at most one of each, checked
    (:func:`otviz.knobs.feature_source_parts`, a block index written in ASCII digits; a
    size a positive whole number of pixels in ASCII digits), the rest is the entry."""
    parts = (value or "").split(SEPARATOR)
    features: str | None = None
    size: int | None = None
    while len(parts) > 1 and (parts[-1].startswith(FEATURES_PREFIX)
                              or parts[-1].endswith(SIZE_SUFFIX)):
        part = parts.pop()
        if part.startswith(FEATURES_PREFIX):
            if features is not None:
                raise InputError("features: the value names more than one feature source; "
                                 "pick one in the features picker")
            features = _source(part[len(FEATURES_PREFIX):])
        else:
            if size is not None:
                raise InputError("image size: the value names more than one input size; "
                                 "pick one size from the list")
            size = _side(part[: -len(SIZE_SUFFIX)])
    return SEPARATOR.join(parts), Reading(features or "last", size)


def with_reading(entry: str, reading: Reading) -> str:
    """The value that reads ``entry`` with ``reading`` (:func:`split_reading`'s
    inverse; any reading already on ``entry`` is replaced)."""
    return split_reading(entry)[0] + reading.suffix


def named_reading(checkpoint: str, features: str | None, image_size: float | None,
                  native: int) -> str:
    """The value (:func:`with_reading`) an endpoint reads from its ``checkpoint``,
    ``features`` and ``image_size`` parameters: ``checkpoint`` a picker entry (model and
    head set), ``features`` a source as written (empty: ``last``), ``image_size`` a side in
    pixels (empty, 0 or ``native``: the tower's native side). A checkpoint with a reading
    written into it the old way (a ``features ...`` or ``... px`` part) is refused, naming
    the parameters to use instead."""
    entry = split_reading(checkpoint)[0]  # a malformed part names its control
    if entry != (checkpoint or ""):
        raise InputError(READING_IN_CHECKPOINT)
    side = _side(str(image_size).removesuffix(".0")) if image_size else None
    reading = Reading(_source(features) if (features or "").strip() else "last",
                      None if side == native else side)
    return entry + reading.suffix


def offered_sizes(native: int, resizable: bool) -> list[int]:
    """The input sides the size control offers a tower of native side ``native``: the
    native one, and :data:`SIZE_FACTORS` times it where the tower can be resized."""
    return [native] + ([round(native * f) for f in SIZE_FACTORS] if resizable else [])


def _source(text: str) -> str:
    """A feature source as written after ``features``: ``layer:K`` with K in ASCII digits
    (``-`` for a block from the end), else any form
    :func:`~otviz.knobs.feature_source_parts` accepts."""
    kind, layer = feature_source_parts(text)
    if layer is None:
        return kind
    digits = text.strip().partition(":")[2].strip().removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise InputError(f"features: {text.strip()!r} is not a block index; write "
                         "layer:K with K in the digits 0-9 (negative from the end)")
    return f"layer:{layer}"


def _side(text: str) -> int:
    digits = text.strip()
    side = int(digits) if digits.isascii() and digits.isdigit() else 0
    if side <= 0:
        raise InputError(f"image size: {digits!r} px is not a positive whole number of "
                         "pixels; pick a size from the list")
    return side
