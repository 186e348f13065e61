"""The two adapter contracts every open_clip tower family implements, and their registries.

An image tower adapter turns preprocessed pixels into patch tokens on a grid (the *width*
space: the tower's last spatial features after its final norm) plus the pooled image
embedding, and maps width tokens one by one into the joint embedding space (the
*projected* space, for training-free methods). A text tower adapter does the same for
token ids. :class:`~otviz.backbone.Backbone` looks the adapter up once by the tower's
class (:func:`image_tower`, :func:`text_tower`), so no caller branches on the family.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from otviz.errors import UserInputError
from otviz.knobs import CLASS_SET_SOURCE
from otviz.patch_grid.tokens import TokenGeometry
from otviz.registry import Registry
from otviz.towers.dense import READS_INTERMEDIATE
from otviz.towers.facts import AttentionReader, CamTarget, FamilyUnsupportedError
from otviz.towers.geometry import trace_geometry
from otviz.towers.sources import LAST, FeatureSource


class BackboneLoadError(UserInputError, RuntimeError):
    """A backbone could not be built (unknown name, weights unreachable, unsupported tower)."""


class ImageTower:
    """Adapter of one image-tower family (``model.visual``).

    Subclasses implement :meth:`_encode` and :meth:`project`, and say which feature sources
    they give (:meth:`sources`); the grid and dimensions default to one forward pass on a
    blank image at the tower's input size, which subclasses replace where the tower states
    them. The family's facts the explainers and trust metrics ask for (:mod:`.facts`):
    :meth:`cam_target`, :meth:`randomisation_blocks`, :meth:`attention_reader` (each refused
    with the reason by default). ``side``: the input side in pixels this adapter runs the
    tower at (``None``: the tower's native size; :meth:`at_size`).
    """

    def __init__(self, visual: nn.Module, side: int | None = None) -> None:
        self.visual = visual
        self.side = side
        self._probe: tuple[tuple[int, int], int, int] | None = None
        self._geometry: TokenGeometry | None = None

    @property
    def family(self) -> str:
        """The tower family in words, for notes shown to people (``"ModifiedResNet"``)."""
        return type(self.visual).__name__

    def sources(self) -> tuple[str, ...]:
        """The feature sources this tower gives, as written (``layer:K`` for any layer;
        :mod:`otviz.towers.sources`)."""
        return ("last",)

    @property
    def depth(self) -> int:
        """The number of blocks ``layer:K`` counts (towers giving ``layer:K`` state it)."""
        raise NotImplementedError

    def check_source(self, source: FeatureSource) -> FeatureSource:
        """``source`` with a layer index counted from the start; :class:`UserInputError`
        naming the sources this tower has when it cannot give ``source`` (``resclip``: where
        it gives ``resclip-rcs``, both of ResCLIP's passes; its class set is the backbone's,
        :meth:`otviz.backbone.Backbone.with_features`)."""
        if source.kind == CLASS_SET_SOURCE:
            self.check_source(FeatureSource("resclip-rcs"))
            return source
        if source.form not in self.sources():
            needs = READS_INTERMEDIATE.get(source.kind)
            why = (f" ({source} reads intermediate blocks and needs {needs} blocks; this "
                   f"tower has {self.depth})" if needs and "layer:K" in self.sources() else "")
            raise UserInputError(
                f"features: the {self.family} tower cannot give {source}{why}; "
                f"it gives {', '.join(self.sources())}")
        if source.kind != "layer":
            return source
        depth = self.depth
        if not -depth <= int(source.layer) < depth:  # type: ignore[arg-type]
            raise UserInputError(
                f"features: {source} is outside the {self.family} tower's {depth} blocks; "
                f"K runs from 0 to {depth - 1} (or -{depth} to -1 from the end)")
        return FeatureSource("layer", int(source.layer) % depth)  # type: ignore[arg-type]

    def encode(self, pixels: Tensor, source: FeatureSource = LAST) -> tuple[Tensor, Tensor]:
        """``(patches [B, N, width], pooled [B, E])``: width-space patch tokens read from
        ``source``, row-major on :attr:`grid`, and the tower's own pooled, projected image
        embedding (:class:`UserInputError` for a source the tower cannot give, and for
        ``resclip``, whose class set the tower has not:
        :meth:`otviz.towers.resclip_sfr.ClassSet.encode`)."""
        source = self.check_source(source)
        if source.kind == CLASS_SET_SOURCE:
            raise UserInputError("features: resclip needs its class set; a tower alone has "
                                 "none (ClassSet.encode(tower, pixels) reads it)")
        return self._encode(pixels, source)

    def _encode(self, pixels: Tensor, source: FeatureSource) -> tuple[Tensor, Tensor]:
        """:meth:`encode` for a source this tower gives (a layer counted from the start)."""
        raise NotImplementedError

    @property
    def resizable(self) -> bool:
        """Whether :meth:`at_size` can run this tower at another input size."""
        return False

    def on(self, visual: nn.Module) -> ImageTower:
        """This adapter (family and input size) on another copy of the tower."""
        return type(self)(visual, self.side)

    def at_size(self, side: int | None) -> ImageTower:
        """This adapter's family on the same tower, run at ``side x side`` pixels (``None``
        or the native side: the native size). :class:`UserInputError` naming the image size,
        before anything is allocated, for a side that is not a positive whole number, for a
        tower that cannot be resized, and for a side the tower refuses (:meth:`check_side`)."""
        if side is None:
            return type(self)(self.visual)
        if isinstance(side, bool) or not isinstance(side, numbers.Integral) or side <= 0:
            raise UserInputError(
                f"image size: {side!r} is not a positive whole number of pixels; leave it unset "
                "for the tower's native size")
        side = int(side)
        native = self.native_size
        if (side, side) == native:
            return type(self)(self.visual)
        if not self.resizable:
            raise UserInputError(
                f"image size: the {self.family} tower runs at its native {native[0]} x "
                f"{native[1]} px only; leave the image size unset")
        self.check_side(side)
        return type(self)(self.visual, side)

    def check_side(self, side: int) -> None:
        """:class:`UserInputError` when this resizable tower cannot run at ``side x side``
        px (a resizable family states its limits: :meth:`otviz.towers.vit.VitTower.check_side`)."""

    def project(self, patches: Tensor) -> Tensor:
        """``[B, N, width] -> [B, N, E]``: each position into the joint space."""
        raise NotImplementedError

    @property
    def native_size(self) -> tuple[int, int]:
        """``(height, width)`` the tower was built for."""
        size = self.visual.preprocess_cfg["size"]
        return (size, size) if isinstance(size, int) else tuple(size)  # type: ignore[return-value]

    @property
    def image_size(self) -> tuple[int, int]:
        """``(height, width)`` of the input this adapter runs the tower at."""
        return self.native_size if self.side is None else (self.side, self.side)

    def _probed(self) -> tuple[tuple[int, int], int, int]:
        """``(grid, width, embed_dim)`` measured on one blank image (cached)."""
        if self._probe is None:
            param = next(self.visual.parameters())
            pixels = torch.zeros(1, 3, *self.image_size, dtype=param.dtype, device=param.device)
            with torch.no_grad():
                grid, patches, pooled = self._grid_forward(pixels)
            self._probe = (grid, patches.shape[-1], pooled.shape[-1])
        return self._probe

    def _grid_forward(self, pixels: Tensor) -> tuple[tuple[int, int], Tensor, Tensor]:
        """``(grid, patches, pooled)`` of one forward pass (used by :meth:`_probed`)."""
        raise NotImplementedError

    @property
    def grid(self) -> tuple[int, int]:
        return self._probed()[0]

    @property
    def geometry(self) -> TokenGeometry:
        """Where each token looks on the model input (the token-geometry contract),
        derived from the layers between the pixels and the grid (cached)."""
        if self._geometry is None:
            height, width = self.image_size
            module, forward = self._spatial_path()
            training = module.training
            module.eval()  # a probe must not move batch-norm statistics
            try:
                self._geometry = trace_geometry(module, forward, (width, height))
            finally:
                module.train(training)
        return self._geometry

    def _spatial_path(self) -> tuple[nn.Module, Callable[[Tensor], tuple[int, int]]]:
        """The module between the pixels and the token grid, and a function running it
        that returns the grid (default: the whole tower)."""
        return self.visual, lambda pixels: self._grid_forward(pixels)[0]

    @property
    def width(self) -> int:
        return int(self._probed()[1])

    @property
    def embed_dim(self) -> int:
        return int(self._probed()[2])

    def cam_target(self) -> CamTarget:
        """The module Grad-CAM reads and its reshape to ``[B, C, h, w]``
        (:class:`FamilyUnsupportedError` for a family that names none)."""
        raise FamilyUnsupportedError(f"no target layer known for the {self.family} tower")

    def randomisation_blocks(self) -> list[nn.Module]:
        """The tower's blocks, bottom first: a randomisation check (MPRT) resets them from
        the last one down (:class:`FamilyUnsupportedError` for a family that names none)."""
        raise FamilyUnsupportedError(f"no block list known for the {self.family} tower")

    def attention_reader(self) -> AttentionReader:
        """The tower's attention, written out (:class:`~.facts.AttentionReader`;
        :class:`FamilyUnsupportedError` with the reason for a tower without one)."""
        raise FamilyUnsupportedError(
            f"reads ViT attention maps; the {self.family} tower has none written out here")

    def stem(self, pixels: Tensor) -> Tensor:
        """``[B, N', C]``: the tower's first convolution on each position (patch embedding
        for ViTs, first stem convolution for CNNs): low-level statistics of the input."""
        conv = next(m for m in self.visual.modules() if isinstance(m, nn.Conv2d))
        return conv(pixels).flatten(2).transpose(1, 2)


class TextTower:
    """Adapter of one text-tower family (``model.text``, or the ``CLIP`` model itself whose
    text tower lives on the model)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def encode(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """``(tokens [B, L, width], pooled [B, E])`` for token ids ``[B, L]``."""
        raise NotImplementedError

    def project(self, tokens: Tensor) -> Tensor:
        """``[B, L, width] -> [B, L, E]``: each token into the joint space."""
        raise NotImplementedError

    @property
    def width(self) -> int:
        raise NotImplementedError

    @property
    def token_embeddings(self) -> Tensor:
        """``[vocab, width]``: the input token-embedding table."""
        raise NotImplementedError


ImageAdapter = type[ImageTower]
TextAdapter = type[TextTower]
#: Image-tower class -> adapter; filled by :func:`register_image_tower`.
IMAGE_TOWERS: Registry[type[nn.Module], ImageAdapter] = Registry("adapter of the image tower")
#: Text-tower class -> adapter; filled by :func:`register_text_tower`.
TEXT_TOWERS: Registry[type[nn.Module], TextAdapter] = Registry("adapter of the text tower")


def register_image_tower(tower_class: type[nn.Module]) -> Callable[[ImageAdapter], ImageAdapter]:
    """Class decorator: ``adapter`` serves image towers of exactly ``tower_class``
    (``ValueError`` when that class has an adapter already)."""
    return IMAGE_TOWERS.under(tower_class)


def register_text_tower(tower_class: type[nn.Module]) -> Callable[[TextAdapter], TextAdapter]:
    """Class decorator: ``adapter`` serves text towers of exactly ``tower_class``
    (``ValueError`` when that class has an adapter already)."""
    return TEXT_TOWERS.under(tower_class)


def _lookup(table: dict[Any, Any], tower: nn.Module, side: str) -> Any:
    adapter = table.get(type(tower))
    if adapter is None:
        known = ", ".join(sorted(c.__name__ for c in table))
        raise BackboneLoadError(
            f"otviz has no adapter for the {side} tower {type(tower).__name__}; "
            f"known {side} towers: {known}"
        )
    return adapter


def image_tower(model: nn.Module) -> ImageTower:
    """The adapter of ``model.visual`` (:class:`BackboneLoadError` for an unknown family)."""
    visual = getattr(model, "visual", None)
    if visual is None:
        raise BackboneLoadError(f"{type(model).__name__} has no image tower (model.visual)")
    return _lookup(IMAGE_TOWERS, visual, "image")(visual)


def text_tower(model: nn.Module) -> TextTower:
    """The adapter of ``model.text`` (or of the ``CLIP`` model's own text tower)."""
    text = getattr(model, "text", None)
    if text is None:
        return _lookup(TEXT_TOWERS, model, "text")(model)
    return _lookup(TEXT_TOWERS, text, "text")(model)
