"""What identifies a backbone's features, recorded with everything computed from them.

A feature cache entry (:mod:`otviz.data.feature_cache`) and a method head
(:mod:`otviz.checkpoints.heads`) both store :func:`backbone_fingerprint`; loading either on
another backbone is refused, since its features would mean something else.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from otviz.knobs import CLASS_SET_SOURCE, PROXY_SOURCE


def backbone_fingerprint(backbone: Any) -> dict[str, Any]:
    """What identifies a backbone's features: a BLAKE2 hash of its weights (every state-dict
    tensor, its name, dtype and shape), its name and provenance tags, feature space, context
    length, patch grid and image preprocessing, and, where not the default, the feature
    source and input size (:meth:`otviz.backbone.Backbone.with_features`; an identity
    without them means ``last`` at the native size)."""
    tags = {k: backbone.info[k] for k in ("model_name", "pretrained") if k in backbone.info}
    identity = {
        "weights": weights_hash(backbone.model),
        "name": backbone.name,
        "tags": tags,
        "space": backbone.space,
        "context_length": backbone.context_length,
        "grid": list(backbone.grid),
        "preprocess": getattr(backbone.model.visual, "preprocess_cfg", None),
    }
    return {**identity, **feature_choice(backbone)}


def weights_hash(model: torch.nn.Module) -> str:
    """A BLAKE2 hash of ``model``'s weights: every state-dict tensor, its name, dtype, shape."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\n".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def feature_choice(backbone: Any) -> dict[str, Any]:
    """``{"features": ..., "image_size": ...}`` of a backbone whose features are not the
    default (last block, native size): the keys that differ from it, else ``{}``; ResCLIP's
    class set (``classes``: size, digest, SFR settings) and ProxyCLIP's second backbone
    where the reading has them."""
    choice: dict[str, Any] = {}
    source = str(getattr(backbone, "features", "last"))
    if source != "last":
        choice["features"] = source
    tower = getattr(backbone, "image_tower", None)
    if getattr(tower, "side", None) is not None:
        choice["image_size"] = int(tower.side)
        choice["preprocess"] = backbone.preprocess_cfg
    classes = getattr(backbone, "classes", None)
    if classes is not None:  # ResCLIP's class set (otviz.towers.resclip_sfr.ClassSet)
        choice["classes"] = classes.identity()
    proxy = getattr(tower, "proxy", None)
    if proxy is not None:  # ProxyCLIP's second backbone (otviz.towers.proxy)
        choice["proxy"] = {"name": tower.name, "weights": weights_hash(proxy)}
    return choice


def describe_choice(identity: dict[str, Any]) -> str:
    """``"features naclip at 448 px"`` of an identity (``last`` / native when unrecorded)."""
    size = identity.get("image_size")
    return f"features {identity.get('features', 'last')} at " + (
        f"{size} px" if size else "the native size")


def training_flags(identity: dict[str, Any]) -> str | None:
    """The ``otviz train`` flags that train a head reading what ``identity`` reads
    (``--features naclip --image-size 448``; ``--proxy NAME`` for ProxyCLIP, whose weights
    the command names again), or ``None`` where no head can be trained on it: ResCLIP with its
    semantic feedback refinement reads a fixed class set, which training has none of."""
    features = identity.get("features", "last")
    if features == CLASS_SET_SOURCE:
        return None
    flags = [f"--features {features}"]
    if identity.get("image_size"):
        flags.append(f"--image-size {identity['image_size']}")
    if features == PROXY_SOURCE:
        flags.append(f"--proxy {(identity.get('proxy') or {}).get('name', 'NAME')}[:FILE]")
    return " ".join(flags)


def backbone_identity(backbone: Any) -> dict[str, Any]:
    """The identity dict of a :class:`~otviz.backbone.Backbone` (its fingerprint), or
    ``backbone`` itself when it already is such a dict."""
    if isinstance(backbone, dict):
        return backbone
    return backbone_fingerprint(backbone)
