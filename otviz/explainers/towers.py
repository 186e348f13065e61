"""What the explainers read of an image tower, per tower family: the Grad-CAM target layer
and its reshape (:func:`cam_target`, one entry per family in :data:`CAM_TARGETS`), and, for
open_clip's ViT, a forward pass that keeps every block's attention map (:func:`vit_blocks`)
for the attention-reading explainers (LeGrad, MaskCLIP).

A family is found by the tower's module type, so a new one is one :func:`register_cam_target`
entry, not a branch in every explainer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from open_clip.modified_resnet import ModifiedResNet
from open_clip.timm_model import TimmModel
from open_clip.transformer import ResidualAttentionBlock, VisionTransformer
from torch import Tensor, nn

from otviz.explainers.base import ExplainerUnsupportedError

Reshape = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class CamTarget:
    """A Grad-CAM target: the module whose output is the activation map, and how to turn that
    output into ``[B, C, h, w]`` (``None``: it already is a conv map)."""

    layer: nn.Module
    reshape: Reshape | None


#: tower type -> its Grad-CAM target (the first ``isinstance`` match wins).
CAM_TARGETS: dict[type[nn.Module], Callable[[nn.Module], CamTarget]] = {}


def register_cam_target(tower: type[nn.Module]) -> Callable:
    """Decorator: ``fn(visual) -> CamTarget`` is the target of towers of type ``tower``."""

    def add(fn: Callable[[nn.Module], CamTarget]) -> Callable[[nn.Module], CamTarget]:
        CAM_TARGETS[tower] = fn
        return fn

    return add


def cam_target(visual: nn.Module) -> CamTarget:
    """The Grad-CAM target of an image tower; :class:`ExplainerUnsupportedError` names the
    known families for any other."""
    for tower, make in CAM_TARGETS.items():
        if isinstance(visual, tower):
            return make(visual)
    known = ", ".join(t.__name__ for t in CAM_TARGETS)
    raise ExplainerUnsupportedError(
        f"Grad-CAM: no target layer known for a {type(visual).__name__} tower; known: {known}")


def tokens_to_map(grid: tuple[int, int]) -> Reshape:
    """``[B, T, C]`` tokens (prefix tokens first, then the ``grid`` row-major) ->
    ``[B, C, h, w]``, the prefix (class / register tokens) dropped."""
    h, w = grid

    def reshape(tokens: Tensor) -> Tensor:
        patches = tokens[:, tokens.shape[1] - h * w :]
        return patches.reshape(tokens.shape[0], h, w, -1).permute(0, 3, 1, 2)

    return reshape


@register_cam_target(VisionTransformer)
def _vit_target(visual: nn.Module) -> CamTarget:
    # the last block's first LayerNorm: its patch outputs still reach a class-token pooling
    # (the last block's own outputs do not), as the grad-cam library's ViT recipe takes it
    return CamTarget(visual.transformer.resblocks[-1].ln_1, tokens_to_map(tuple(visual.grid_size)))


@register_cam_target(ModifiedResNet)
def _resnet_target(visual: nn.Module) -> CamTarget:
    return CamTarget(visual.layer4, None)  # the last conv stage, before the attention pool


@register_cam_target(TimmModel)
def _timm_target(visual: nn.Module) -> CamTarget:
    trunk = visual.trunk
    if hasattr(trunk, "stages"):  # ConvNeXt and other staged conv nets: NCHW maps
        return CamTarget(trunk.stages[-1], None)
    if hasattr(trunk, "blocks") and hasattr(trunk, "patch_embed"):  # timm ViTs (EVA, SigLIP)
        return CamTarget(trunk.blocks[-1].norm1, tokens_to_map(tuple(trunk.patch_embed.grid_size)))
    raise ExplainerUnsupportedError(
        f"Grad-CAM: timm trunk {type(trunk).__name__} has neither stages nor ViT blocks")


# ----------------------------------------------------------------------- ViT with attention
def vit_tower(model: nn.Module, explainer: str) -> VisionTransformer:
    """``model.visual`` when it is an open_clip ViT whose blocks are standard
    ``ResidualAttentionBlock`` s (``nn.MultiheadAttention``) pooled by class token or mean,
    else :class:`ExplainerUnsupportedError` naming ``explainer``."""
    visual = getattr(model, "visual", None)
    if not isinstance(visual, VisionTransformer):
        raise ExplainerUnsupportedError(
            f"{explainer} reads ViT attention maps; this model's image tower is "
            f"{type(visual).__name__}")
    blocks = visual.transformer.resblocks
    if visual.attn_pool is not None or not all(
        isinstance(b, ResidualAttentionBlock) and isinstance(b.attn, nn.MultiheadAttention)
        and not hasattr(b, "ln_1_kv") for b in blocks
    ):
        raise ExplainerUnsupportedError(
            f"{explainer} supports ViTs of standard attention blocks pooled by class token or "
            "mean (no attentional pooler)")
    return visual


def attention(block: ResidualAttentionBlock, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(out [B, T, D], A [B, heads, T, T])``: the block's attention branch on ``x`` (after
    ``ln_1``), with its softmax map ``A = softmax(q k^T / sqrt(d_head))`` kept as a tensor of
    the graph (``nn.MultiheadAttention`` computes the same without returning it)."""
    mha: nn.MultiheadAttention = block.attn
    b, t, d = x.shape
    heads = mha.num_heads
    qkv = nn.functional.linear(block.ln_1(x), mha.in_proj_weight, mha.in_proj_bias)
    q, k, v = (z.reshape(b, t, heads, d // heads).transpose(1, 2) for z in qkv.chunk(3, dim=-1))
    a = torch.softmax(q @ k.transpose(-1, -2) / (d // heads) ** 0.5, dim=-1)
    out = (a @ v).transpose(1, 2).reshape(b, t, d)
    return mha.out_proj(out), a


def block_forward(block: ResidualAttentionBlock, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(x_next, A)``: one pre-norm block (``x + ls_1(attn(ln_1 x))``, then ``+ ls_2(mlp(ln_2
    x))``) with its attention map (:func:`attention`)."""
    out, a = attention(block, x)
    x = x + block.ls_1(out)
    return x + block.ls_2(block.mlp(block.ln_2(x))), a


def vit_blocks(visual: VisionTransformer, pixels: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """``(tokens, maps)``: the input of the first block then each block's output
    (``L + 1`` tensors ``[B, T, D]``) and each block's attention map (``L`` tensors
    ``[B, heads, T, T]``) for preprocessed ``pixels``."""
    x = visual._embeds(pixels)
    tokens, maps = [x], []
    for block in visual.transformer.resblocks:
        x, a = block_forward(block, x)
        tokens.append(x)
        maps.append(a)
    return tokens, maps


def pooled_embedding(visual: VisionTransformer, tokens: Tensor) -> Tensor:
    """``[B, E]`` the tower's pooled, projected embedding of block-output ``tokens``
    (its own ``_pool``: class token or mean, with ``ln_post``; then ``proj``)."""
    pooled, _ = visual._pool(tokens)
    return pooled @ visual.proj if visual.proj is not None else pooled
