"""One way to name a backbone: :class:`BackboneSpec`, a small frozen value (the
architecture, where its weights come from, the reading: feature source, input size and
ProxyCLIP's second backbone, and the device) that every command, the app, training and
evaluation turn into a :class:`~otviz.backbone.Backbone` with :meth:`BackboneSpec.build`.

The CLI's flags and the configuration dataclasses name the same things differently
(``otviz explain --model / --checkpoint``, ``otviz train --open-clip-model / --backbone``,
``otviz eval --model / --backbone``); :meth:`BackboneSpec.from_fields` is the one parser
that reads either spelling, so a command keeps its flags and help texts while the
construction, the checks and the fingerprint (:meth:`BackboneSpec.fingerprint`, through
:func:`otviz.checkpoints.identity.backbone_fingerprint`) live here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from otviz.backbone import Backbone
from otviz.checkpoints.identity import backbone_fingerprint
from otviz.errors import UserInputError
from otviz.knobs import PROXY_SOURCE, feature_source_parts

#: The attribute names each spec field is read from (first present and set wins): the
#: CLI's flags and the config dataclasses' fields (train: ``open_clip_model``,
#: ``backbone``; eval: ``model``, ``backbone``; explain: ``model``, ``checkpoint``).
FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "model": ("model", "open_clip_model"),
    "pretrained": ("pretrained",),
    "checkpoint": ("checkpoint", "backbone"),
    "features": ("features",),
    "image_size": ("image_size",),
    "proxy": ("proxy",),
    "device": ("device",),
}


@dataclass(frozen=True)
class BackboneSpec:
    """A backbone by name: the tiny-CLIP ``checkpoint`` folder (``None``: the shipped one)
    or the open_clip architecture ``model`` with weights ``pretrained`` (a tag, a local
    weight file, ``None``: random initialisation), read at ``features`` and ``image_size``
    (``None``: the native size) with ProxyCLIP's second backbone ``proxy`` (only with
    ``features="proxy"``), its model on ``device``. Every field is checked on construction:
    :class:`~otviz.errors.UserInputError` naming the field, before anything is loaded."""

    model: str | None = None
    pretrained: str | None = None
    checkpoint: str | None = None
    features: str = "last"
    image_size: int | None = None
    proxy: str | None = None
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.model is not None and self.checkpoint is not None:
            raise UserInputError("checkpoint: a tiny-CLIP checkpoint or an open_clip model, "
                                 f"not both (got {self.checkpoint!r} and {self.model!r})")
        if self.pretrained is not None and self.model is None:
            raise UserInputError(f"pretrained: weights {self.pretrained!r} need the open_clip "
                                 "model they belong to")
        for name in ("model", "pretrained", "checkpoint", "proxy"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise UserInputError(f"{name}: expected a non-empty text, got {value!r}")
        kind, layer = feature_source_parts(self.features)
        object.__setattr__(self, "features", kind if layer is None else f"{kind}:{layer}")
        side = self.image_size
        if side is not None and (isinstance(side, bool) or not isinstance(side, int)
                                 or side < 1):
            raise UserInputError(f"image_size: expected a positive whole number of pixels "
                                 f"or none for the native size, got {side!r}")
        if (kind == PROXY_SOURCE) != (self.proxy is not None):
            raise UserInputError(
                "proxy: the proxy source needs its second backbone (proxy NAME[:SOURCE])"
                if self.proxy is None else
                f"proxy: a second backbone is read by the proxy source only, not by {kind}")
        try:
            torch.device(self.device)
        except (RuntimeError, TypeError):
            raise UserInputError(f"device: expected a torch device name (cpu, cuda, cuda:1, "
                                 f"mps), got {self.device!r}") from None

    @classmethod
    def from_fields(cls, fields: Any, **override: Any) -> BackboneSpec:
        """The spec that parsed flags or a config dataclass name (:data:`FIELD_ALIASES`;
        an empty text or ``0`` size is unset, as the flags write it); ``override`` sets
        fields directly (``device="cuda"``)."""
        values: dict[str, Any] = {}
        for name, aliases in FIELD_ALIASES.items():
            for alias in aliases:
                value = getattr(fields, alias, None)
                if value not in (None, "", 0):
                    values[name] = value
                    break
        return cls(**{**values, **override})

    def load(self) -> Backbone:
        """The backbone at its native reading (last block, native size), on ``device``."""
        if self.model is not None:
            return Backbone.from_pretrained(self.model, self.pretrained, device=self.device)
        backbone = (Backbone.from_checkpoint(self.checkpoint) if self.checkpoint is not None
                    else Backbone.from_checkpoint())
        backbone.model.to(self.device)
        return backbone

    def read(self, backbone: Backbone) -> Backbone:
        """``backbone`` (same weights) read as this spec says: its feature source, input
        size and proxy (:meth:`otviz.backbone.Backbone.with_features`)."""
        return backbone.with_features(self.features, self.image_size, proxy=self.proxy)

    def build(self) -> Backbone:
        """The backbone this spec names, loaded and read as it says."""
        return self.read(self.load())

    def fingerprint(self) -> dict[str, Any]:
        """The identity of the features this spec's backbone gives (builds it once):
        :func:`otviz.checkpoints.identity.backbone_fingerprint`."""
        return backbone_fingerprint(self.build())
