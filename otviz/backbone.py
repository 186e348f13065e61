"""Any open_clip model -> per-patch and per-token features with their caption words.

:class:`Backbone` wraps an open_clip model (``CLIP``, ``CustomTextCLIP``, ``CoCa``) and
returns, for a batch of images and captions, a :class:`TokenFeatures`: patch tokens on
their grid, text tokens with a validity mask, each token's caption word, and the pooled
global embeddings. Two feature spaces:

* ``space="width"``: the towers' last spatial / per-token features after their final norm,
  what a trained method projects with its own W_v / W_t (ConceptOT Sec. 2.1);
* ``space="projected"``: the same positions through the towers' own projections into the
  shared embedding space, for training-free use.

What each tower family does for both lives in one adapter per family
(:mod:`otviz.towers`: open_clip ViTs however pooled, ModifiedResNet, timm towers; open_clip
and Hugging Face text towers), looked up once by the tower's class; the token -> word map
comes from the model's tokenizer (:func:`otviz.text.tokenizers.word_tokenizer`: open_clip
BPE or a Hugging Face tokenizer's offsets).

Where the patch features come from and at which input size is one choice per backbone:
:meth:`Backbone.with_features` gives a view of the same model whose every encode reads that
feature source (:mod:`otviz.towers.sources`: ``last``, ``layer:K``, the dense last-block
paths) at that input size; the default is the last block at the tower's native size.

Two ways to get one: :meth:`Backbone.from_checkpoint` (the embedded tiny CLIP, offline) and
:meth:`Backbone.from_pretrained` (any open_clip name + pretrained tag or local weight file).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import open_clip
import torch
from open_clip.tokenizer import SimpleTokenizer
from PIL import Image
from torch import Tensor, nn

from otviz.boundary.images import (  # noqa: F401 (the image boundary, re-exported)
    UNREADABLE_IMAGE,
    ImageInput,
    ImageInputError,
    to_rgb,
)
from otviz.errors import UserInputError
from otviz.knobs import CLASS_SET_REFUSAL, CLASS_SET_SOURCE, PROXY_SOURCE
from otviz.methods.base import PairBatch
from otviz.patch_grid.tokens import TokenGeometry
from otviz.text.tokenizers import word_tokenizer
from otviz.text.tokens import TokenBatch, TokenizationError
from otviz.text.words import Word
from otviz.tiny_clip.model import DEFAULT_CHECKPOINT, load_tiny_clip
from otviz.towers import BackboneLoadError, image_tower, text_tower
from otviz.towers.proxy import ProxyTower, load_proxy
from otviz.towers.resclip_sfr import ClassSet, check_classes
from otviz.towers.sources import LAST, FeatureSource, parse_feature_source

Space = Literal["width", "projected"]


class CaptionTooLongError(TokenizationError):
    """A caption does not fit the model's context (raised only when truncation is refused)."""


@dataclass
class TokenFeatures:
    """Backbone features of B (image, caption) pairs.

    Attributes:
        patches: ``[B, N, Dv]`` patch tokens (prefix tokens dropped), row-major on ``grid``.
        grid: ``(H, W)`` patch grid, ``H * W == N``.
        tokens: ``[B, L, Dt]`` text token features at every context position.
        token_mask: ``[B, L]`` bool, True for content tokens (no SOT/EOT/padding).
        text: the tokenisation: ids ``[B, L]``, token -> word ``[B, L]``, words, char spans,
            truncated words.
        image_global: ``[B, E]`` pooled image embedding (model projection space).
        text_global: ``[B, E]`` pooled text embedding.
        space: ``"width"`` or ``"projected"``.
    """

    patches: Tensor
    grid: tuple[int, int]
    tokens: Tensor
    token_mask: Tensor
    text: TokenBatch
    image_global: Tensor
    text_global: Tensor
    space: str

    @property
    def token_ids(self) -> Tensor:
        return self.text.ids

    @property
    def token_word(self) -> Tensor:
        """``[B, L]`` long: the caption word of each position, -1 for none."""
        return self.text.token_word

    @property
    def words(self) -> list[list[Word]]:
        return self.text.words

    @property
    def truncated(self) -> list[list[int]]:
        """Per caption, the indices of the words the context length cut."""
        return self.text.truncated

    def pair_batch(self) -> PairBatch:
        """The method-facing :class:`PairBatch` (no regions / parse-tree nodes)."""
        B, N = self.patches.shape[:2]
        return PairBatch(
            patches=self.patches,
            tokens=self.tokens,
            patch_mask=torch.ones(B, N, dtype=torch.bool, device=self.patches.device),
            token_mask=self.token_mask,
            image_global=self.image_global,
            text_global=self.text_global,
            grid=self.grid,
        )


class Backbone:
    """Features of an open_clip model, per patch and per caption token.

    Args:
        model: an open_clip ``CLIP`` / ``CustomTextCLIP`` / ``CoCa`` whose towers have an
            adapter in :mod:`otviz.towers` (else :class:`BackboneLoadError`).
        tokenizer: the model's open_clip tokenizer (BPE ``SimpleTokenizer`` or
            ``HFTokenizer``).
        preprocess: the model's eval image transform (PIL RGB -> ``[3, H, W]`` tensor).
        space: ``"width"`` or ``"projected"`` (see the module docstring).
        name: a label for the UI / reports.
        info: free-form provenance (checkpoint meta, pretrained tag).
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: object,
        preprocess: Callable[[Image.Image], Tensor],
        space: Space = "width",
        name: str = "",
        info: dict[str, Any] | None = None,
    ) -> None:
        if space not in ("width", "projected"):
            raise ValueError(f"space must be 'width' or 'projected', got {space!r}")
        self.model = model.eval()
        self.image_tower = image_tower(model)
        self.text_tower = text_tower(model)
        context = getattr(tokenizer, "context_length", None) or model.context_length
        try:
            self.words = word_tokenizer(tokenizer, context_length=context)
        except TypeError as e:
            raise BackboneLoadError(str(e)) from e
        self.preprocess = preprocess
        self.space = space
        self.name = name
        self.info = info or {}
        self.features: FeatureSource = LAST
        self.classes: ClassSet | None = None  # ResCLIP's class set (``features resclip``)

    def with_features(self, features: str | FeatureSource = "last",
                      image_size: int | None = None,
                      proxy: str | nn.Module | None = None,
                      classes: ClassSet | None = None) -> Backbone:
        """A view of this backbone (same model, weights, tokenizer and space) whose every
        encode reads the patch features from ``features`` (``last``, ``layer:K``,
        ``maskclip``, ``sclip``, ``clearclip``, ``naclip``, ``resclip-rcs``) with the image
        tower run at ``image_size`` px (``None``: its native size; the preprocessing and the
        token geometry follow). :class:`otviz.errors.UserInputError`, before anything is
        allocated, names the sources the tower has when it cannot give ``features``, says
        that it cannot be resized, or refuses the size: not a positive whole number, below
        one patch, not a multiple of it, or over the 4 GiB per-image attention cap
        (:meth:`otviz.towers.vit.VitTower.check_side`). ``features="proxy"`` (ProxyCLIP)
        reads the attention of the second backbone ``proxy``: a timm ViT, or its text
        ``NAME[:SOURCE]`` (:func:`otviz.towers.proxy.load_proxy`); no other source takes one.
        ``features="resclip"`` (ResCLIP's RCS with its semantic feedback refinement) reads the
        fixed class set ``classes`` (:class:`otviz.towers.resclip_sfr.ClassSet`, part of the
        reading and of its identity), on towers that give ``resclip-rcs``; no other source
        takes one."""
        source = parse_feature_source(features, classes=classes is not None)
        if (source.kind == CLASS_SET_SOURCE) != (classes is not None):
            raise UserInputError(CLASS_SET_REFUSAL if classes is None else
                                 f"classes: a class set is read by resclip only, not by {source}")
        if classes is not None and not isinstance(classes, ClassSet):
            raise UserInputError("classes: expected a ClassSet (ClassSet.of(embeddings)), got "
                                 f"{type(classes).__name__}")
        base = self.image_tower
        tower = (base.clip if isinstance(base, ProxyTower) else base).at_size(image_size)
        if (source.kind == PROXY_SOURCE) != (proxy is not None):
            raise UserInputError(
                "features: the proxy source needs its second backbone (proxy NAME[:SOURCE])"
                if proxy is None else
                f"proxy: a second backbone is read by the proxy source only, not by {source}")
        if proxy is not None:
            name = proxy if isinstance(proxy, str) else type(proxy).__name__
            model = load_proxy(proxy) if isinstance(proxy, str) else proxy
            tower = ProxyTower(tower, model.to(self.device), name.partition(":")[0])
        tower.check_source(source)
        view = copy.copy(self)
        if classes is not None:
            check_classes(classes.embeddings, tower.embed_dim)
        view.image_tower, view.features, view.classes = tower, source, classes
        if tower.image_size != self.image_tower.image_size:
            view.preprocess = _eval_transform(self.model, tower.image_size[0])
        return view

    @property
    def image_size(self) -> int:
        """The input side in pixels the image tower runs at."""
        return int(self.image_tower.image_size[0])

    @property
    def preprocess_cfg(self) -> dict[str, Any]:
        """The model's preprocessing configuration at this backbone's input size."""
        cfg = dict(getattr(self.model.visual, "preprocess_cfg", None) or {})
        if self.image_tower.side is not None:
            cfg["size"] = self.image_tower.image_size
        return cfg

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike = DEFAULT_CHECKPOINT, space: Space = "width"
    ) -> Backbone:
        """The embedded tiny CLIP from a checkpoint directory (offline; raises
        :class:`otviz.checkpoints.store.CheckpointError` on a corrupt or foreign checkpoint)."""
        model, meta = load_tiny_clip(path)
        tokenizer = SimpleTokenizer(context_length=model.context_length)
        return cls(model, tokenizer, _eval_transform(model), space, "otviz-tiny", meta)

    @classmethod
    def from_pretrained(
        cls,
        name: str,
        pretrained: str | None = None,
        space: Space = "width",
        device: str | torch.device = "cpu",
        cache_dir: str | None = None,
    ) -> Backbone:
        """Any open_clip architecture ``name`` with weights ``pretrained`` (a tag such as
        ``"openai"``, a local weight file, or ``None`` for random initialisation of both
        towers: no base weights are fetched for a Hugging Face text tower either).

        Raises :class:`BackboneLoadError` with what to do when the name is unknown or the
        weights cannot be fetched.
        """
        if name not in open_clip.list_models() and not name.startswith(("hf-hub:", "local-dir:")):
            raise BackboneLoadError(
                f"unknown open_clip model {name!r}; see open_clip.list_models() for the names"
            )
        try:
            model = open_clip.create_model(name, pretrained=pretrained, device=device,
                                           cache_dir=cache_dir, pretrained_text=False)
            tokenizer = open_clip.get_tokenizer(name, cache_dir=cache_dir)
        except Exception as e:  # open_clip wraps hub / network errors in RuntimeError
            raise BackboneLoadError(_load_advice(name, pretrained, e)) from e
        info = {"model_name": name, "pretrained": pretrained}
        return cls(model, tokenizer, _eval_transform(model), space, name, info)

    # ----------------------------------------------------------------- dimensions
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def grid(self) -> tuple[int, int]:
        return self.image_tower.grid

    @property
    def context_length(self) -> int:
        return self.words.context_length

    @property
    def embed_dim(self) -> int:
        return self.image_tower.embed_dim

    @property
    def patch_dim(self) -> int:
        """Dv of :attr:`TokenFeatures.patches` in this backbone's space."""
        return self.embed_dim if self.space == "projected" else self.image_tower.width

    @property
    def token_dim(self) -> int:
        """Dt of :attr:`TokenFeatures.tokens` in this backbone's space."""
        return self.embed_dim if self.space == "projected" else self.text_tower.width

    @property
    def token_embeddings(self) -> Tensor:
        """``[vocab, width]``: the text tower's input token-embedding table."""
        return self.text_tower.token_embeddings

    # ----------------------------------------------------------------- features
    def geometry_on(self, width: int, height: int) -> TokenGeometry:
        """Where each token looks on a ``width x height`` picture: the tower's token geometry
        (:attr:`otviz.towers.base.ImageTower.geometry`) carried through the preprocessing's
        resize and crop (:meth:`otviz.patch_grid.tokens.TokenGeometry.on_image`)."""
        return self.image_tower.geometry.on_image(width, height, self.preprocess_cfg or None)

    def image_tensor(self, images: list[ImageInput]) -> Tensor:
        """``[B, 3, H, W]`` model input from any images (see :func:`to_rgb`)."""
        if not images:
            raise ImageInputError("no image given")
        return torch.stack([self.preprocess(to_rgb(im)) for im in images]).to(self.device)

    @torch.no_grad()
    def encode(
        self,
        images: list[ImageInput],
        captions: list[str],
        batch_size: int = 64,
        allow_truncation: bool = True,
    ) -> TokenFeatures:
        """Features of the pairs ``(images[i], captions[i])``.

        With ``allow_truncation=False`` a caption longer than the context raises
        :class:`CaptionTooLongError`; otherwise it is cut as open_clip cuts it and
        :attr:`TokenFeatures.truncated` says which words were lost.
        """
        if len(images) != len(captions):
            raise ValueError(f"{len(images)} images but {len(captions)} captions")
        text = self.words(list(captions))
        if not allow_truncation:
            cut = [(i, t) for i, t in enumerate(text.truncated) if t]
            if cut:
                i, t = cut[0]
                raise CaptionTooLongError(
                    f"caption {i} is longer than the context of {self.context_length} tokens; "
                    f"words cut: {[text.words[i][w].text for w in t]}"
                )
        parts = []
        for s in range(0, len(captions), batch_size):
            pixels = self.image_tensor(images[s : s + batch_size])
            parts.append(self.forward_tensors(pixels, text.ids[s : s + batch_size]))
        patches, tokens, img_g, txt_g = (torch.cat(p) for p in zip(*parts, strict=True))
        return TokenFeatures(
            patches=patches,
            grid=self.grid,
            tokens=tokens,
            token_mask=text.mask.to(tokens.device),
            text=text,
            image_global=img_g,
            text_global=txt_g,
            space=self.space,
        )

    def forward_tensors(self, pixels: Tensor, ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(patches [B,N,Dv], tokens [B,L,Dt], image_global [B,E], text_global [B,E])`` for
        preprocessed pixels and token ids (differentiable; no ``no_grad`` here)."""
        patches, image_global = (self.image_tower.encode(pixels, self.features)
                                 if self.classes is None else
                                 self.classes.encode(self.image_tower, pixels))
        tokens, text_global = self.text_tower.encode(ids.to(pixels.device))
        if self.space == "projected":
            patches = self.image_tower.project(patches)
            tokens = self.text_tower.project(tokens)
        return patches, tokens, image_global, text_global

    def stem(self, pixels: Tensor) -> Tensor:
        """``[B, N', C]``: the image tower's first convolution on preprocessed pixels."""
        return self.image_tower.stem(pixels)

    def pair_batch(self, features: TokenFeatures) -> PairBatch:
        """:meth:`TokenFeatures.pair_batch` (kept here so callers need only the backbone)."""
        return features.pair_batch()

    def to_space(self, features: TokenFeatures, space: Space) -> TokenFeatures:
        """``features`` in ``space``: width features are mapped through the model's own
        projections to the joint space; projected features cannot go back to width."""
        if space == features.space:
            return features
        if space != "projected":
            raise ValueError("projected features cannot be mapped back to the width space")
        with torch.no_grad():
            patches = self.image_tower.project(features.patches)
            tokens = self.text_tower.project(features.tokens)
        return dataclasses.replace(features, patches=patches, tokens=tokens, space="projected")

    @torch.no_grad()
    def encode_text(self, captions: list[str], space: Space | None = None) -> tuple[Tensor, Tensor]:
        """Token features of captions alone: ``(tokens [B, L, Dt], token_mask [B, L])`` in
        ``space`` (default: the backbone's own)."""
        text = self.words(list(captions))
        tokens, _ = self.text_tower.encode(text.ids.to(self.device))
        if (space or self.space) == "projected":
            tokens = self.text_tower.project(tokens)
        return tokens, text.mask.to(tokens.device)


# --------------------------------------------------------------------- model helpers
def _eval_transform(model: nn.Module, side: int | None = None) -> Callable[[Image.Image], Tensor]:
    """The model's eval image transform (at ``side x side`` px instead of its own size)."""
    from open_clip.transform import PreprocessCfg, image_transform_v2

    cfg = dict(model.visual.preprocess_cfg)
    if side is not None:
        cfg["size"] = (side, side)
    return image_transform_v2(PreprocessCfg(**cfg), is_train=False)


def _load_advice(name: str, pretrained: str | None, error: Exception) -> str:
    """What went wrong loading ``name`` with ``pretrained`` and what to do: a local weight
    file is read as it is (nothing is fetched, so no word of the hub); a tag that is not one
    of the model's names the known tags; otherwise the hub fetch failed."""
    if pretrained and os.path.isfile(pretrained):
        return (
            f"could not load {name} from the local weight file {pretrained!r}: {error}. "
            f"Check that the file holds weights of the {name} architecture (an open_clip or "
            "OpenAI checkpoint of that model, complete and readable), or name the "
            "architecture the file was saved from."
        )
    tags = open_clip.list_pretrained_tags_by_model(name) if name in open_clip.list_models() else []
    if pretrained and tags and pretrained not in tags and not os.path.isfile(pretrained):
        return (
            f"{pretrained!r} is neither a pretrained tag of {name} nor a local file; "
            f"known tags: {tags}"
        )
    return (
        f"could not load {name} with weights {pretrained!r}: {error}. The weights are fetched "
        "from the internet (Hugging Face hub) on first use. Either connect this machine, or "
        "download the weight file elsewhere and pass its local path as `pretrained`, or use "
        "the embedded offline model: Backbone.from_checkpoint()."
    )
