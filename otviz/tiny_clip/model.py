"""The embedded tiny CLIP: an open_clip ``CustomTextCLIP`` sized for the synthetic world.

A ViT on 80 px images with 8 px patches (a 10 x 10 grid), open_clip's own BPE tokenizer
(vocabulary 49408) with a short context, and a few million parameters. The config is
registered with open_clip under :data:`TINY_CLIP_NAME`, so ``open_clip.create_model`` and
``open_clip.get_tokenizer`` know it like any built-in architecture.

Only the few hundred vocabulary rows the world's captions use are ever trained: training
starts the other rows at exactly zero (:func:`restrict_token_rows`), where AdamW keeps them
(zero gradient and zero weight give a zero update). The checkpoint stores just the non-zero
rows of the token embedding (:func:`pack_state_dict`), which keeps it at a few MB and is
exact: unpacking gives back the trained state dict bit for bit.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import open_clip
import torch
from open_clip import factory as open_clip_factory
from torch import Tensor, nn

from otviz import assets
from otviz.checkpoints.store import (
    CheckpointError,
    load_checkpoint,
    load_state_dict_strict,
    save_checkpoint,
)
from otviz.knobs import VISION_POOLS, VISION_STEMS
from otviz.tiny_clip.conv_stem import install_stem, stem_channels

TINY_CLIP_NAME = "otviz-tiny"
CHECKPOINT_KIND = "otviz-tiny-clip"
TOKENIZER_NAME = "open_clip.SimpleTokenizer(bpe_simple_vocab_16e6, clean=lower)"
DEFAULT_CHECKPOINT = assets.path("tiny-clip")
_EMBED_KEY = "text.token_embedding.weight"
_ROWS_KEY = "text.token_embedding.rows"
_IDS_KEY = "text.token_embedding.row_ids"
STEM_KEY = "otviz_vision_stem"
"""The config key of the image tower's stem (otviz's own; open_clip never sees it)."""
_STEMS: dict[str, str] = {}
"""The stem of every registered tiny-CLIP name."""


def tiny_clip_config(
    embed_dim: int = 128,
    image_size: int = 80,
    patch_size: int = 8,
    vision_width: int = 128,
    vision_layers: int = 6,
    vision_heads: int = 4,
    text_width: int = 128,
    text_layers: int = 4,
    text_heads: int = 4,
    context_length: int = 32,
    vision_pool: str = "tok",
    vision_pos_embed: str = "learnable",
    vision_mlp_ratio: float = 4.0,
    init_temperature: float = 0.07,
    vision_stem: str = "patch",
) -> dict[str, Any]:
    """The open_clip model config (``custom_text``: text tower at ``model.text``).

    ``vision_pool="avg"`` pools the image as the mean of its patch tokens (after
    ``ln_post``), so the global image embedding is exactly the mean of the projected patch
    tokens and every patch token is trained directly; ``"tok"`` uses the class token as
    OpenAI CLIP does. ``vision_pos_embed="sin_cos_2d"`` fixes the patch position embeddings to
    2-D sine-cosine codes instead of learning them. ``init_temperature`` is the initial
    softmax temperature of the contrastive logits (CLIP: 0.07; the scale is learned).
    ``vision_stem="conv"`` embeds the patches with
    :class:`otviz.tiny_clip.conv_stem.ConvStem` instead of one linear map per patch (kept in
    the config as :data:`STEM_KEY`, which open_clip's own config does not know; absent for
    the linear embedding).
    """
    if vision_width % vision_heads or text_width % text_heads:
        raise ValueError("widths must be divisible by their number of heads")
    if vision_pool not in VISION_POOLS:
        raise ValueError(f"vision_pool must be one of {VISION_POOLS}, got {vision_pool!r}")
    if vision_stem not in VISION_STEMS:
        raise ValueError(f"vision_stem must be one of {VISION_STEMS}, got {vision_stem!r}")
    if vision_stem != "patch":
        stem_channels(vision_width, patch_size)  # checks the patch size
    stem = {STEM_KEY: vision_stem} if vision_stem != "patch" else {}
    return {
        **stem,
        "embed_dim": embed_dim,
        "custom_text": True,
        "init_logit_scale": math.log(1.0 / init_temperature),
        "vision_cfg": {
            "image_size": image_size,
            "patch_size": patch_size,
            "width": vision_width,
            "layers": vision_layers,
            "head_width": vision_width // vision_heads,
            "mlp_ratio": vision_mlp_ratio,
            "pool_type": vision_pool,
            "pos_embed_type": vision_pos_embed,
        },
        "text_cfg": {
            "context_length": context_length,
            "vocab_size": 49408,
            "width": text_width,
            "heads": text_heads,
            "layers": text_layers,
        },
    }


def register_tiny_clip(cfg: dict[str, Any] | None = None, name: str | None = None) -> str:
    """Register ``cfg`` (default: :func:`tiny_clip_config`) with open_clip and return its name.

    The default config is registered as :data:`TINY_CLIP_NAME`; any other config under
    ``otviz-tiny-<hash of the config>`` unless ``name`` is given, so custom sizes never
    shadow the default.
    """
    cfg = tiny_clip_config() if cfg is None else cfg
    if name is None:
        name = TINY_CLIP_NAME if cfg == tiny_clip_config() else _config_name(cfg)
    # open_clip's registry is a dict filled from JSON files; add_model_config only takes
    # files, so the config dict goes straight in (later rescans keep it). otviz's own keys
    # (the stem) stay out of it: open_clip would refuse them.
    open_clip_factory._MODEL_CONFIGS[name] = {
        k: copy.deepcopy(v) for k, v in cfg.items() if k != STEM_KEY}
    _STEMS[name] = cfg.get(STEM_KEY, "patch")
    return name


def create_tiny_clip(cfg: dict[str, Any] | None = None, seed: int | None = None) -> nn.Module:
    """A randomly initialised tiny CLIP built by ``open_clip.create_model`` (CPU, fp32)."""
    name = register_tiny_clip(cfg)
    if seed is not None:
        torch.manual_seed(seed)
    model = open_clip.create_model(name, pretrained=None)
    install_stem(model.visual, _STEMS[name])
    return model


class _DropNotice(logging.Filter):
    """Drops one exact log message."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.message


@contextmanager
def random_init_notice_silenced(name: str) -> Iterator[None]:
    """Silence open_clip's "No pretrained weights loaded for model '<name>'. Model
    initialized randomly." while building ``name`` whose weights are loaded right after
    (any other record, that model's other warnings included, still goes through)."""
    notice = _DropNotice(
        f"No pretrained weights loaded for model '{name}'. Model initialized randomly."
    )
    root = logging.getLogger()  # open_clip logs through the root logger
    root.addFilter(notice)
    try:
        yield
    finally:
        root.removeFilter(notice)


def restrict_token_rows(model: nn.Module, used_ids: Tensor) -> None:
    """Set the token-embedding rows of every id not in ``used_ids`` to exactly zero."""
    weight = model.text.token_embedding.weight
    keep = torch.zeros(weight.shape[0], dtype=torch.bool)
    keep[used_ids.long().unique()] = True
    with torch.no_grad():
        weight[~keep.to(weight.device)] = 0.0


def pack_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """The model's state dict with the token embedding stored as its non-zero rows."""
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    weight = state.pop(_EMBED_KEY)
    ids = (weight != 0).any(dim=1).nonzero().squeeze(1)
    state[_ROWS_KEY] = weight[ids].contiguous()
    state[_IDS_KEY] = ids
    return state


def unpack_state_dict(tensors: dict[str, Tensor], cfg: dict[str, Any]) -> dict[str, Tensor]:
    """Inverse of :func:`pack_state_dict`."""
    state = dict(tensors)
    try:
        rows, ids = state.pop(_ROWS_KEY), state.pop(_IDS_KEY)
    except KeyError as e:
        raise CheckpointError(f"tiny CLIP checkpoint lacks {e.args[0]}") from None
    vocab, width = cfg["text_cfg"]["vocab_size"], cfg["text_cfg"]["width"]
    if rows.dim() != 2 or rows.shape[1] != width or ids.shape != rows.shape[:1]:
        raise CheckpointError(
            f"token-embedding rows {tuple(rows.shape)} / ids {tuple(ids.shape)} do not fit "
            f"width {width}"
        )
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
        raise CheckpointError(f"token ids outside the vocabulary of {vocab}")
    weight = torch.zeros(vocab, width, dtype=rows.dtype)
    weight[ids.long()] = rows
    state[_EMBED_KEY] = weight
    return state


def save_tiny_clip(
    path: str | os.PathLike, model: nn.Module, cfg: dict[str, Any], meta: dict[str, Any]
) -> Path:
    """Save the model (packed) and ``meta`` (recipe, metrics, ...) as a checkpoint."""
    full_meta = {
        **meta,
        "kind": CHECKPOINT_KIND,
        "model_cfg": cfg,
        "tokenizer": TOKENIZER_NAME,
        "context_length": cfg["text_cfg"]["context_length"],
        "preprocess_cfg": _jsonable(open_clip.get_model_preprocess_cfg(model)),
    }
    return save_checkpoint(path, pack_state_dict(model), full_meta)


def load_tiny_clip(
    path: str | os.PathLike = DEFAULT_CHECKPOINT,
) -> tuple[nn.Module, dict[str, Any]]:
    """Load a tiny CLIP checkpoint (offline). Raises :class:`CheckpointError` when the
    checkpoint is missing, corrupt or not a tiny CLIP."""
    tensors, meta = load_checkpoint(path, expect={"kind": CHECKPOINT_KIND})
    cfg = meta.get("model_cfg")
    if not isinstance(cfg, dict) or not {"vision_cfg", "text_cfg", "embed_dim"} <= set(cfg):
        raise CheckpointError(f"checkpoint {path} has no valid 'model_cfg'")
    try:
        with random_init_notice_silenced(register_tiny_clip(cfg)):
            model = create_tiny_clip(cfg)
    except (TypeError, ValueError, KeyError, AssertionError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint {path}: cannot build its model config: {e}") from e
    load_state_dict_strict(model, unpack_state_dict(tensors, cfg))
    model.eval()
    return model, meta


def _config_name(cfg: dict[str, Any]) -> str:
    digest = hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]
    return f"{TINY_CLIP_NAME}-{digest}"


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=list))


register_tiny_clip()
