"""Data types of the synthetic world: its configuration, scene objects, caption meanings and
samples. Boxes are pixel integers ``(x0, y0, x1, y1)``, half-open, ``x`` to the right and
``y`` downwards."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import numpy as np

from otviz.text.tree import Tree

Box = tuple[int, int, int, int]
T = TypeVar("T")
DescriptionKey = tuple[str, str, str | None]
"""A :class:`Description` as a plain ``(colour, shape, size)`` tuple."""


@dataclass(frozen=True)
class WorldConfig:
    """How scenes and captions are drawn.

    Attributes:
        image_size: square image side in pixels (80 with 8-px patches gives a 10x10 grid).
        min_objects, max_objects: range of the number of objects in a scene (1..4).
        count_bias: the number of objects ``n`` is drawn with probability proportional to
            ``n ** count_bias``: 0 is uniform; the default 1 makes one-object scenes rarer
            (10%), because a caption naming a single object is true of many images and
            caps retrieval.
        distractor_prob: chance that each object beyond the first is a distractor (rendered,
            never mentioned by the caption).
        relation_prob: chance that two consecutive mentioned objects are joined by a spatial
            relation rather than listed by conjunction.
        omit_size_prob: chance to drop the size word of an object whose colour and shape are
            unique in the scene (the size word is kept whenever it is needed to refer).
        there_is_prob: chance of the existential form "there is ...".
        small_px, large_px: inclusive ranges of object side length in pixels.
        margin: minimum gap in pixels between object boxes, and between a box and the border.
        texture_contrast: maximum amplitude (0-255 scale) of the background texture.
        pixel_noise: amplitude of the per-pixel grain added over the whole image.
        colour_jitter: maximum per-channel offset of an object's colour from its palette RGB.
        negatives: build the hard negatives of each sample (skip them for speed if unused).
    """

    image_size: int = 80
    min_objects: int = 1
    max_objects: int = 4
    count_bias: float = 1.0
    distractor_prob: float = 0.25
    relation_prob: float = 0.7
    omit_size_prob: float = 0.2
    there_is_prob: float = 0.2
    small_px: tuple[int, int] = (14, 18)
    large_px: tuple[int, int] = (24, 30)
    margin: int = 2
    texture_contrast: float = 16.0
    pixel_noise: float = 5.0
    colour_jitter: int = 12
    negatives: bool = True

    def scaled(self, image_size: int) -> WorldConfig:
        """This world drawn at ``image_size`` pixels: object sides and margin scaled by the
        same factor (rounded), so scenes keep their layout and objects cover more patches."""
        if image_size == self.image_size:
            return self
        f = image_size / self.image_size

        def scale(r: tuple[int, int]) -> tuple[int, int]:
            return (round(r[0] * f), round(r[1] * f))

        return replace(self, image_size=image_size, small_px=scale(self.small_px),
                       large_px=scale(self.large_px), margin=max(1, round(self.margin * f)))

    def __post_init__(self) -> None:
        if not 1 <= self.min_objects <= self.max_objects <= 4:
            raise ValueError("need 1 <= min_objects <= max_objects <= 4")
        if not (0 < self.small_px[0] <= self.small_px[1] < self.large_px[0] <= self.large_px[1]):
            raise ValueError("size ranges must be positive, ordered and disjoint")
        if self.image_size // 2 < self.large_px[1] + 2 * self.margin:
            raise ValueError("image_size too small: four large objects must fit in a 2x2 grid")


@dataclass(frozen=True)
class SceneObject:
    """One rendered object. ``mentioned`` is False for distractors."""

    shape: str
    colour: str
    size: str
    box: Box
    mentioned: bool = True


@dataclass(frozen=True)
class Description:
    """A noun phrase's meaning: colour and shape, and size unless the caption omits it."""

    colour: str
    shape: str
    size: str | None = None

    @property
    def key(self) -> DescriptionKey:
        """``(colour, shape, size)``: equal keys, equal descriptions."""
        return (self.colour, self.shape, self.size)

    def matches(self, obj: SceneObject) -> bool:
        return (
            obj.shape == self.shape
            and obj.colour == self.colour
            and (self.size is None or obj.size == self.size)
        )


@dataclass(frozen=True)
class Clause:
    """One conjunct: a described object, optionally related to a second one (the landmark),
    e.g. ``subject`` = red circle, ``relation`` = "left_of", ``landmark`` = blue star."""

    subject: Description
    relation: str | None = None
    landmark: Description | None = None


@dataclass(frozen=True)
class Meaning:
    """The structured semantics a caption is generated from: a conjunction of clauses, read
    existentially (distinct objects exist that fit every description and relation).
    ``there_is`` only selects the surface form "there is ..."."""

    clauses: tuple[Clause, ...]
    there_is: bool = False

    def descriptions(self) -> list[Description]:
        """Every noun phrase's description, in caption (word) order."""
        out: list[Description] = []
        for c in self.clauses:
            out.append(c.subject)
            if c.landmark is not None:
                out.append(c.landmark)
        return out

    def relations(self) -> list[tuple[int, str, int]]:
        """``(subject, relation, landmark)`` as indices into :meth:`descriptions`."""
        out, k = [], 0
        for c in self.clauses:
            if c.landmark is not None and c.relation is not None:
                out.append((k, c.relation, k + 1))
                k += 2
            else:
                k += 1
        return out


@dataclass(frozen=True)
class Phrase:
    """A noun phrase naming one object: words ``[start, end)``, its text, the index of the
    object in ``Sample.objects`` and that object's gold box. A phrase of a real data set
    may have several gold boxes (a Flickr30k Entities entity): ``boxes`` holds them all and
    ``box`` is their enclosing box; empty ``boxes`` means ``(box,)`` (and stays out of the
    ``repr``, so a world phrase reads, and hashes in the golden tests, as before)."""

    start: int
    end: int
    text: str
    object_index: int
    box: Box
    boxes: tuple[tuple[float, float, float, float], ...] = field(default=(), repr=False)

    @property
    def gold_boxes(self) -> tuple[tuple[float, float, float, float], ...]:
        """Every gold box of the phrase (its region is their union)."""
        return self.boxes or (tuple(map(float, self.box)),)  # type: ignore[return-value]


class Deferred(Generic[T]):
    """The value of ``compute()``, computed on the first call and kept; thread-safe, so
    ``compute`` runs once even when threads race for the value."""

    def __init__(self, compute: Callable[[], T]) -> None:
        self._compute: Callable[[], T] | None = compute
        self._lock = threading.Lock()
        self._value: T | None = None

    def __call__(self) -> T:
        with self._lock:
            if self._compute is not None:
                self._value, self._compute = self._compute(), None
        return self._value  # type: ignore[return-value]


NegativesOf = Callable[[], tuple[dict[str, Meaning], dict[str, str]]]
"""Computes a sample's negative meanings and their captions."""
_DEFERRED_FIELDS = ("negatives", "negative_meanings")


@dataclass
class Sample:
    """One image-caption pair with its ground truth.

    ``words`` equals ``[w.text for w in split_words(caption)]``; ``tree`` has exactly these
    leaves; ``phrases`` has one entry per noun phrase naming an object, in word order;
    ``negatives`` maps categories of ``NEGATIVE_CATEGORIES`` to captions false for the image.
    ``pixel_scale`` is ``(x, y)`` pixels of ``image`` per pixel of the image it was made
    from: ``(1, 1)`` for the world, the resize factors of a real data set's image fitted
    to the model's input (tolerances stated in source pixels are scaled by it).

    A :class:`~otviz.world.World` defers the hard negatives (:meth:`defer_negatives`):
    ``negatives`` and ``negative_meanings`` are made on the first read of either, from the
    sample's own random stream, so their values do not depend on when (or whether) they
    are read. Pickling or copying a sample makes them first.
    """

    image: np.ndarray
    caption: str
    words: list[str]
    tree: Tree
    phrases: list[Phrase]
    objects: list[SceneObject]
    negatives: dict[str, str]
    meaning: Meaning
    split: str = "train"
    index: int = 0
    negative_meanings: dict[str, Meaning] = field(default_factory=dict)
    pixel_scale: tuple[float, float] = (1.0, 1.0)

    def defer_negatives(self, negatives_of: NegativesOf) -> None:
        """Make ``negative_meanings, negatives = negatives_of()`` on their first read."""
        del self.negatives, self.negative_meanings
        self.__dict__["_deferred_negatives"] = Deferred(negatives_of)

    def __getattr__(self, name: str) -> Any:
        # reached only for attributes missing from the instance: deferred negatives
        deferred = self.__dict__.get("_deferred_negatives")
        if deferred is not None and name in _DEFERRED_FIELDS:
            meanings, captions = deferred()
            self.__dict__.update(negatives=captions, negative_meanings=meanings)
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        deferred = state.pop("_deferred_negatives", None)
        if deferred is not None:
            state["negative_meanings"], state["negatives"] = deferred()
        return state
