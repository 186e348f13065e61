"""From an image and a caption to per-word and per-method heatmaps: the one path that the
CLI (``otviz explain``) and the app share. Features are cached per (image, caption), so
changing the phrase or the method does not re-encode.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.backbone import Backbone, ImageInput, TokenFeatures, to_rgb
from otviz.text.words import Word

MAX_CAPTION_CHARS = 1000


class InputError(ValueError):
    """Bad user input (no image, empty caption, unknown phrase); the message is for people."""


@dataclass
class Encoded:
    """One encoded (image, caption) pair.

    Attributes:
        image: the RGB image as the user gave it (uint8 ``[H, W, 3]``), for drawing.
        caption: the caption.
        features: the backbone's features of the pair (batch of one).
    """

    image: np.ndarray
    caption: str
    features: TokenFeatures

    @property
    def words(self) -> list[Word]:
        return self.features.words[0]

    @property
    def grid(self) -> tuple[int, int]:
        return self.features.grid

    def token_select(self, word_indices: list[int] | range) -> Tensor:
        """``[1, L]`` bool mask of the BPE tokens of the given caption words."""
        if not len(word_indices):
            raise InputError("pick at least one word of the caption")
        kept = {int(w) for w in self.features.token_word[0][self.features.token_mask[0]]}
        missing = [self.words[w].text for w in word_indices if w not in kept]
        if len(missing) == len(word_indices):
            raise InputError(
                f"the words {missing} are past the model's context length and were cut"
            )
        return self.features.text.word_mask(0, list(word_indices)).unsqueeze(0)


class Explainer:
    """Encodes (image, caption) pairs with a backbone, with an LRU feature cache.

    Args:
        backbone: the model giving patch and token features. Similarity maps are computed
            in the model's shared embedding space, so a ``"width"`` backbone's features are
            projected with the model's own projections for them.
        cache_size: how many encoded pairs to keep.
    """

    def __init__(self, backbone: Backbone, cache_size: int = 32) -> None:
        self.backbone = backbone
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], Encoded] = OrderedDict()

    def encode(self, image: ImageInput | None, caption: str | None) -> Encoded:
        """Encode one pair (cached). Raises :class:`InputError` on unusable input."""
        if image is None:
            raise InputError("no image: upload one or pick an example")
        caption = (caption or "").strip()
        if not caption:
            raise InputError("the caption is empty: type what the image shows")
        if len(caption) > MAX_CAPTION_CHARS:
            raise InputError(f"the caption is over {MAX_CAPTION_CHARS} characters")
        rgb = np.asarray(to_rgb(image))
        key = (hashlib.sha1(rgb.tobytes() + str(rgb.shape).encode()).hexdigest(), caption)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        features = self.backbone.encode([rgb], [caption])
        if not features.words[0] or not bool(features.token_mask.any()):
            raise InputError("the caption has no words the model can read")
        encoded = Encoded(rgb, caption, features)
        self._cache[key] = encoded
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return encoded

    def word_similarity(self, encoded: Encoded) -> Tensor:
        """``[n_words, H, W]``: cosine similarity of each caption word with every patch, in
        the model's shared embedding space (a word of several BPE tokens takes their mean)."""
        feats = encoded.features
        patches, tokens = self.shared_space(feats)
        patches = F.normalize(patches[0], dim=-1)
        tokens = F.normalize(tokens[0], dim=-1)
        word_of = feats.token_word[0]
        valid = feats.token_mask[0]
        h, w = feats.grid
        maps = torch.zeros(len(encoded.words), h * w, dtype=patches.dtype)
        for k in range(len(encoded.words)):
            sel = valid & (word_of == k)
            if sel.any():
                maps[k] = patches @ F.normalize(tokens[sel].mean(0), dim=-1)
        return maps.reshape(-1, h, w)

    def shared_space(self, feats: TokenFeatures) -> tuple[Tensor, Tensor]:
        """Patch and token features in the model's joint embedding space."""
        if feats.space == "projected":
            return feats.patches, feats.tokens
        model = self.backbone.model
        from otviz.backbone import _project, _text_projection

        with torch.no_grad():
            return (
                _project(feats.patches, model.visual.proj),
                _project(feats.tokens, _text_projection(model)),
            )
