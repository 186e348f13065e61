"""Method-head checkpoints: what a training run ships.

One :mod:`otviz.checkpoints.store` directory (safetensors + JSON, written atomically, checksummed):
the method's state dict (projections, mass heads, anchors, ...) under ``method.``, the
optional trained global head under ``global_head.``, and in the JSON the method name, its
:class:`MethodConfig`, the feature widths, the backbone's identity (name, feature space and
a hash of its weights, :func:`otviz.checkpoints.identity.backbone_fingerprint`), the
:class:`~otviz.train.config.TrainConfig` and the final metrics.

A head only makes sense on the backbone whose features it was trained on:
:func:`load_method_checkpoint` refuses another backbone (or a corrupt file) with a
:class:`CheckpointError`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from torch import nn

from otviz.checkpoints.identity import backbone_identity, describe_choice, training_flags
from otviz.checkpoints.store import (
    CheckpointError,
    load_checkpoint,
    load_meta,
    load_state_dict_strict,
    save_checkpoint,
)
from otviz.methods.base import METHODS, AlignmentMethod, MethodConfig, build_method

HEAD_KIND = "otviz-method-head"
_METHOD = "method."
_GLOBAL = "global_head."
#: Identity fields that must agree for features to be the same.
_IDENTITY_KEYS = ("weights", "space", "grid", "context_length", "proxy")


def save_method_checkpoint(
    path: str | os.PathLike,
    method: AlignmentMethod,
    backbone: Any,
    train_config: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    global_head: nn.Module | None = None,
) -> Path:
    """Write the trained ``method`` (and ``global_head``, a
    :class:`~otviz.train.global_head.GlobalHead`) for ``backbone`` (a Backbone or its identity
    dict) to the checkpoint directory ``path``."""
    tensors = {_METHOD + k: v for k, v in method.state_dict().items()}
    if global_head is not None:
        tensors.update({_GLOBAL + k: v for k, v in global_head.state_dict().items()})
    meta = {
        "kind": HEAD_KIND,
        "method": method.name,
        "method_config": dataclasses.asdict(method.config),
        "patch_dim": method.patch_dim,
        "token_dim": method.token_dim,
        "backbone": backbone_identity(backbone),
        "train_config": train_config or {},
        "metrics": metrics or {},
        "global_head": None
        if global_head is None
        else {"dim": global_head.image.in_features},
    }
    return save_checkpoint(path, tensors, meta)


def _check_backbone(path: Path, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """Raise unless ``now`` is the backbone of identity ``saved``: the feature source and
    input size must agree (unrecorded: ``last`` at the native size), and the fields of
    :data:`_IDENTITY_KEYS` the saved identity has (an identity with none of them, e.g.
    in-memory features, must be equal as a whole)."""
    if (saved.get("features", "last"), saved.get("image_size")) != (
            now.get("features", "last"), now.get("image_size")):
        flags = training_flags(now)
        train = (f"train a head on it (otviz train {flags})" if flags else
                 "no head is trained on it (training has no fixed class set: read "
                 "resclip-rcs to train one)")
        raise CheckpointError(
            f"method head {path} was trained on {describe_choice(saved)}; this backbone "
            f"reads {describe_choice(now)}: {train} or use the training-free methods "
            "(otviz eval --heads training-free)")
    keys = [k for k in _IDENTITY_KEYS if k in saved]
    differ = [k for k in keys if saved[k] != now.get(k)]
    if differ or (not keys and saved != now):
        detail = ", ".join(f"{k}: {saved[k]!r} vs {now.get(k)!r}" for k in differ)
        raise CheckpointError(
            f"method head {path} was trained on backbone {saved.get('name', '?')!r}, not on "
            f"the given one {now.get('name', '?')!r} ({detail or 'identity differs'}); its "
            "features would mean something else"
        )


def _prefixed(tensors: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def load_method_checkpoint(path: str | os.PathLike, backbone: Any) -> AlignmentMethod:
    """The trained method stored at ``path``, in eval mode, for ``backbone`` (a Backbone or
    its identity dict).

    Raises:
        CheckpointError: missing, corrupt or foreign checkpoint, unknown method, or one
            trained on another backbone.
    """
    directory = Path(path)
    tensors, meta = load_checkpoint(directory, expect={"kind": HEAD_KIND})
    _check_backbone(directory, meta.get("backbone") or {}, backbone_identity(backbone))
    name = meta.get("method")
    if name not in METHODS:
        raise CheckpointError(f"{directory}: unknown method {name!r}; known: {sorted(METHODS)}")
    try:
        config = MethodConfig(**meta["method_config"])
        method = build_method(name, int(meta["patch_dim"]), int(meta["token_dim"]), config)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{directory}: cannot rebuild method {name!r}: {e}") from e
    load_state_dict_strict(method, _prefixed(tensors, _METHOD))
    return method.eval()


def load_global_head_state(path: str | os.PathLike) -> tuple[int, dict[str, Any]] | None:
    """The width and state dict of the trained global head stored with a method head, or
    None when the run had none (:func:`otviz.train.global_head.load_global_head` builds it)."""
    tensors, meta = load_checkpoint(Path(path), expect={"kind": HEAD_KIND})
    spec = meta.get("global_head")
    if not spec:
        return None
    return int(spec["dim"]), _prefixed(tensors, _GLOBAL)


def head_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON of a method-head checkpoint (method, configs, backbone, metrics)."""
    meta = load_meta(path)
    if meta.get("kind") != HEAD_KIND:
        raise CheckpointError(f"{path} is not a method-head checkpoint")
    return meta
