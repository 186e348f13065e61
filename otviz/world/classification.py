"""A zero-shot classification view of the world, with long-tailed test sets.

Each image shows one labelled object (and, optionally, one or two distractors of other
classes). Classes are shapes, colours, or colour-shape pairs. The objects come from the
split's colour-shape pairs: outside ``HELD_OUT_PAIRS`` for train/test, inside them for
``compositional`` (so ``colour_shape`` there asks for the unseen compositions only).

Long-tailed sets follow the CIFAR-LT recipe (Cao et al. 2019) used by OT-CLIP Sec. 4.2:
class ``k`` of ``C`` gets ``n_max * imbalance ** (-k / (C - 1))`` images.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from otviz.text.words import article
from otviz.world.render import render_scene
from otviz.world.scene import place_boxes
from otviz.world.types import SceneObject, WorldConfig
from otviz.world.vocab import COLOURS, HELD_OUT_PAIRS, SEEN_PAIRS, SHAPES, SIZES, SPLITS

TASKS: tuple[str, ...] = ("shape", "colour", "colour_shape")
ORDERS: tuple[str, ...] = ("lt", "uniform", "reverse")
# second seed word of the random streams, apart from World's split ids 0..2
_SAMPLE_STREAM, _LONG_TAIL_STREAM = 16, 32


def long_tailed_counts(
    n_classes: int, n_max: int, imbalance: float, order: str = "lt"
) -> list[int]:
    """Images per class: ``round(n_max * imbalance ** (-k / (C - 1)))`` for class ``k``
    (rounded, not floored as in CIFAR-LT, so that ``n_max / imbalance`` comes out exact).

    ``order``: ``"lt"`` head classes first (class 0 has ``n_max``, the last
    ``n_max / imbalance``); ``"reverse"`` the same counts reversed; ``"uniform"``
    ``n_max`` for every class (the balanced test set)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if n_classes < 1 or n_max < 1 or imbalance < 1:
        raise ValueError("need n_classes >= 1, n_max >= 1 and imbalance >= 1")
    if order == "uniform" or n_classes == 1:
        return [n_max] * n_classes
    counts = [
        max(1, round(n_max * imbalance ** (-k / (n_classes - 1)))) for k in range(n_classes)
    ]
    return counts[::-1] if order == "reverse" else counts


class ClassificationView:
    """Single-object images labelled by shape, colour or colour-shape pair.

    ``distractors`` adds one or two objects of other classes to each image. ``template``
    receives each class's noun phrase with its article ("a red circle", "an orange object";
    a colour class is named "<colour> object").
    """

    def __init__(
        self,
        task: str = "shape",
        split: str = "test",
        seed: int = 0,
        config: WorldConfig | None = None,
        distractors: bool = False,
        template: str = "a photo of {}",
    ):
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.task, self.split, self.seed = task, split, seed
        self.config = config or WorldConfig()
        self.distractors = distractors
        self.template = template
        self.pairs = HELD_OUT_PAIRS if split == "compositional" else SEEN_PAIRS
        self._stream = (SPLITS.index(split), TASKS.index(task))
        if task == "shape":
            self.classes = list(SHAPES)
        elif task == "colour":
            self.classes = list(COLOURS)
        else:
            self.classes = [f"{c} {s}" for c, s in self.pairs]
        self._members = [
            [p for p in self.pairs if self.label_of(*p) == k] for k in range(len(self.classes))
        ]

    def class_text(self, c: int | str) -> str:
        """The noun phrase naming class ``c`` (index or name): "circle", "red object",
        "red circle"."""
        name = self.classes[c] if isinstance(c, int) else c
        return f"{name} object" if self.task == "colour" else name

    def prompt(self, c: int | str) -> str:
        """The zero-shot text prompt of class ``c``: the template filled with the class's
        noun phrase and its article, e.g. "a photo of a red circle", "a photo of an orange
        object"."""
        text = self.class_text(c)
        return self.template.format(f"{article(text)} {text}")

    def prompts(self) -> list[str]:
        return [self.prompt(k) for k in range(len(self.classes))]

    def sample(self, i: int) -> tuple[np.ndarray, int]:
        """Image ``i`` (uniform over classes) and its label."""
        image, label, _ = self.sample_scene(i)
        return image, label

    def sample_scene(self, i: int) -> tuple[np.ndarray, int, list[SceneObject]]:
        """Image ``i``, its label and its objects (the labelled one first)."""
        split_id, task_id = self._stream
        rng = np.random.default_rng([self.seed, _SAMPLE_STREAM + split_id, task_id, i])
        label = int(rng.integers(len(self.classes)))
        image, objects = self._render(label, rng)
        return image, label, objects

    def batch(self, indices: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        """Images ``uint8 [n, H, W, 3]`` and labels ``int64 [n]`` of ``indices``."""
        pairs = [self.sample(int(i)) for i in indices]
        return _stack(pairs, self.config.image_size)

    def long_tailed(
        self, n_max: int, imbalance: float, order: str = "lt", seed: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """A long-tailed set with :func:`long_tailed_counts` images per class, grouped by
        class in class order. ``seed`` defaults to the view's seed."""
        seed = self.seed if seed is None else seed
        split_id, task_id = self._stream
        counts = long_tailed_counts(len(self.classes), n_max, imbalance, order)
        pairs = []
        for label, count in enumerate(counts):
            for j in range(count):
                rng = np.random.default_rng([seed, _LONG_TAIL_STREAM + split_id, task_id, label, j])
                pairs.append((self._render(label, rng)[0], label))
        return _stack(pairs, self.config.image_size)

    def label_of(self, colour: str, shape: str) -> int:
        """The class of an object with this colour and shape."""
        if self.task == "shape":
            return self.classes.index(shape)
        if self.task == "colour":
            return self.classes.index(colour)
        return self.classes.index(f"{colour} {shape}")

    def _render(
        self, label: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, list[SceneObject]]:
        cfg = self.config
        fits = self._members[label]
        chosen = [fits[int(rng.integers(len(fits)))]]
        others = [p for p in self.pairs if p not in fits]
        if self.distractors and others:
            k = int(rng.integers(1, 3))
            chosen += [others[int(j)] for j in rng.choice(len(others), size=k, replace=False)]
        size_ids = rng.integers(len(SIZES), size=len(chosen)).tolist()
        sides = [
            int(rng.integers(lo, hi + 1))
            for lo, hi in (cfg.large_px if s else cfg.small_px for s in size_ids)
        ]
        boxes = place_boxes(sides, rng, cfg.image_size, cfg.margin)
        objects = [
            SceneObject(shape, colour, SIZES[s], box, k == 0)
            for k, ((colour, shape), s, box) in enumerate(zip(chosen, size_ids, boxes, strict=True))
        ]
        return render_scene(objects, rng, cfg), objects


def _stack(pairs: list[tuple[np.ndarray, int]], size: int) -> tuple[np.ndarray, np.ndarray]:
    if not pairs:
        return np.zeros((0, size, size, 3), np.uint8), np.zeros(0, np.int64)
    images, labels = zip(*pairs, strict=True)
    return np.stack(images), np.asarray(labels, dtype=np.int64)
