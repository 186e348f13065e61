"""Golden digests of the synthetic world: every field of many samples (image bytes, caption,
words, tree, phrases, objects, meanings, negatives) across splits, seeds and configs, and the
classification view (single samples and long-tailed sets), hashed and compared with digests
computed from the world as first committed. A trained backbone and the committed examples
depend on these exact samples: any change to rendering, captions, negatives or random
stream order changes a digest. Optimisations must leave them all unchanged."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from otviz.world import ClassificationView, Sample, World, WorldConfig
from otviz.world.classification import TASKS

#: The splits as first committed; the validation split ("val", added for early stopping) has
#: its own random stream and its own digest, so adding it left these unchanged.
GOLDEN_SPLITS = ("train", "test", "compositional")

_CUSTOM = WorldConfig(
    image_size=96,
    min_objects=2,
    max_objects=4,
    count_bias=0.0,
    distractor_prob=0.5,
    relation_prob=0.3,
    omit_size_prob=0.6,
    there_is_prob=0.5,
    small_px=(10, 13),
    large_px=(20, 28),
    margin=3,
    texture_contrast=30.0,
    pixel_noise=0.0,
    colour_jitter=0,
)
# four large objects in a 64-px image: rejection sampling often fails, the grid layout is used
_CROWDED = WorldConfig(
    image_size=64, min_objects=4, max_objects=4, small_px=(12, 14), large_px=(24, 28)
)
_SINGLE = WorldConfig(min_objects=1, max_objects=1, pixel_noise=2.5)

_WORLD_CASES: dict[str, tuple[WorldConfig, list[int]]] = {
    "default": (WorldConfig(), [*range(120), 4_321, 99_999, 2**31 - 1]),
    "no_negatives": (WorldConfig(negatives=False), [*range(60), 123_456]),
    "custom": (_CUSTOM, list(range(40))),
    "crowded": (_CROWDED, list(range(40))),
    "single": (_SINGLE, list(range(20))),
}

EXPECTED: dict[str, str] = {
    "default": "11469cf8bc58feab91c6c6a1a3178192063aefd618fac5742addaa1dafeea93d",
    "no_negatives": "f7eb3d40e9ca0dd01fc9b67868b160c9a416834c00b86340b901e3516d079145",
    "custom": "aec41b3d70e1310eac1bf83c74688499aa8bbec8bbc5e4738ad5c2538169354c",
    "crowded": "b45d0f33344b133a0aa165b7b5b14caf7453a931802b353680b64ac96ffd5c0f",
    "single": "66a5857f6df2f67206f6739cc73962c981bcc2b2d71d60bc760985915f5ecee8",
    "classification": "a0e0cfe79b4161de14d20060428c6e5e3095910b276923edb52219f929e19665",
    "val": "adfa7e2824879630e886d6efd8e1d09ee21d8b5786c0a80b84cb81121972caad",
}


def _update_image(h: hashlib._Hash, image: np.ndarray) -> None:
    h.update(f"{image.shape}|{image.dtype.str}|".encode())
    h.update(np.ascontiguousarray(image).tobytes())


def _update_sample(h: hashlib._Hash, s: Sample) -> None:
    _update_image(h, s.image)
    fields = (
        s.split, s.index, s.caption, s.words, s.tree, s.tree.to_bracket(), s.phrases,
        s.objects, list(s.negatives.items()), s.meaning, list(s.negative_meanings.items()),
    )
    h.update(repr(fields).encode())


def world_digest(config: WorldConfig, indices: list[int],
                 splits: tuple[str, ...] = GOLDEN_SPLITS) -> str:
    """SHA-256 of samples ``indices`` of every split of ``splits`` for seeds 0 and 7."""
    h = hashlib.sha256()
    for split in splits:
        for seed in (0, 7):
            world = World(config, split, seed)
            for i in indices:
                _update_sample(h, world.sample(i))
    return h.hexdigest()


def classification_digest() -> str:
    """SHA-256 of classification samples and long-tailed sets of every task and split."""
    h = hashlib.sha256()
    for task in TASKS:
        for split in GOLDEN_SPLITS:
            for distractors in (False, True):
                view = ClassificationView(task, split, seed=3, distractors=distractors)
                for i in range(12):
                    image, label, objects = view.sample_scene(i)
                    _update_image(h, image)
                    h.update(repr((label, objects)).encode())
                images, labels = view.long_tailed(4, 3.0, "lt")
                _update_image(h, images)
                h.update(labels.tobytes())
    images, labels = ClassificationView("shape", "test", 1, _CUSTOM).batch([0, 5, 9])
    _update_image(h, images)
    h.update(labels.tobytes())
    images, labels = ClassificationView("colour", "train", 2).long_tailed(5, 2.0, "reverse", 9)
    _update_image(h, images)
    h.update(labels.tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("case", sorted(_WORLD_CASES))
def test_world_samples_are_unchanged(case: str) -> None:
    config, indices = _WORLD_CASES[case]
    assert world_digest(config, indices) == EXPECTED[case]


def test_validation_samples_are_unchanged() -> None:
    """The "val" split (digest fixed when it was added)."""
    assert world_digest(WorldConfig(), [*range(40), 99_999], splits=("val",)) == EXPECTED["val"]


def test_classification_samples_are_unchanged() -> None:
    assert classification_digest() == EXPECTED["classification"]
