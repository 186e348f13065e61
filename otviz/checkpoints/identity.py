"""What identifies a backbone's features, recorded with everything computed from them.

A feature cache entry (:mod:`otviz.data.feature_cache`) and a method head
(:mod:`otviz.checkpoints.heads`) both store :func:`backbone_fingerprint`; loading either on
another backbone is refused, since its features would mean something else.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def backbone_fingerprint(backbone: Any) -> dict[str, Any]:
    """What identifies a backbone's features: a BLAKE2 hash of its weights (every state-dict
    tensor, its name, dtype and shape), its name and provenance tags, feature space, context
    length, patch grid and image preprocessing."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in sorted(backbone.model.state_dict().items()):
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\n".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
    tags = {k: backbone.info[k] for k in ("model_name", "pretrained") if k in backbone.info}
    return {
        "weights": h.hexdigest(),
        "name": backbone.name,
        "tags": tags,
        "space": backbone.space,
        "context_length": backbone.context_length,
        "grid": list(backbone.grid),
        "preprocess": getattr(backbone.model.visual, "preprocess_cfg", None),
    }


def backbone_identity(backbone: Any) -> dict[str, Any]:
    """The identity dict of a :class:`~otviz.backbone.Backbone` (its fingerprint), or
    ``backbone`` itself when it already is such a dict."""
    if isinstance(backbone, dict):
        return backbone
    return backbone_fingerprint(backbone)
