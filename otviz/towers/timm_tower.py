"""timm image towers (open_clip's ``TimmModel``): EVA, SigLIP / SigLIP 2, PE, ConvNeXt,
ViTamin, MobileCLIP, ...

Patch tokens come from timm's ``forward_intermediates`` (last stage, the trunk's final norm
applied, prefix tokens dropped), as an ``NCHW`` map read row-major; where the trunk's
features end in a layer the intermediates skip (FastViT's / MobileCLIP's ``final_conv``),
that layer is applied to the map. Projected space: the
tower's head applied to each position as if that position were the whole image: the
trunk's ``forward_head`` on a one-position input (a ``1 x 1`` map for convolutional
trunks; for token trunks one copy of the token in every prefix and patch slot), then
open_clip's adapter head (``linear`` / ``mlp`` projection or attention pool). Every pooling
(class token, mean, global average) returns that position's features unchanged; an attention
pool over one key returns its value and output projections of that token (MaskCLIP, Zhou et
al. 2022, Sec. 3.2), and a head norm or MLP then acts per position.

Feature sources: ``layer:K`` on token trunks (ViT, EVA, SigLIP: block ``K`` through the
trunk's final norm, timm's ``forward_intermediates``); the dense paths
(:mod:`otviz.towers.dense`) on token trunks of two blocks or more, re-run at every call from
the model's current parameters (no copy, no hook, no state changed on the shared model): the
tokens entering the last block come from timm's ``forward_intermediates`` (block ``L - 2``,
prefix tokens kept), then the last block is rewritten as the path. ``maskclip`` is the
block's own forward with an attention mask that lets each token attend to itself alone
(``A = I``: its residual and feed-forward kept, as MaskCLIP's code runs them), on every
block whose forward takes ``attn_mask`` (timm ``Block``, ``EvaBlock``). The q / k paths
(``sclip``, ``clearclip``, ``naclip``, ``resclip-rcs``: the last also reads blocks 5-8's own
attention, from their inputs in the same ``forward_intermediates`` call) write out timm's
``Attention`` (``qkv``, ``q_norm``,
``k_norm``, its output norm, gate and ``proj``: timm ``layers/attention.py``,
``Attention.forward``) with the softmax replaced by the path's ``A``; a trunk of other
attention modules, or with rotary position embeddings (EVA: its ``q, k`` carry the rotation,
which the q-q / k-k papers do not define), gives ``maskclip`` only. The block output is read
before the trunk's final norm. The tower runs at its native size only.
"""

from __future__ import annotations

import inspect

import torch
from open_clip.timm_model import TimmModel
from timm.layers import Attention
from torch import Tensor, nn

from otviz.knobs import DENSE_SOURCES
from otviz.towers.base import ImageTower, register_image_tower
from otviz.towers.dense import (
    RESCLIP_LAYERS,
    dense_attention,
    fits,
    rewritten_block,
    softmax_attention,
)
from otviz.towers.scclip import scclip_tokens
from otviz.towers.sources import FeatureSource


def _token_trunk(trunk: nn.Module) -> bool:
    """Whether the trunk is a ViT-like stack of token blocks after a patch embedding."""
    return hasattr(trunk, "blocks") and hasattr(trunk, "patch_embed")


def _takes_mask(block: nn.Module) -> bool:
    """Whether the block is a pre-norm residual block whose forward takes ``attn_mask``."""
    return (hasattr(block, "drop_path1") and hasattr(block, "norm2")
            and "attn_mask" in inspect.signature(block.forward).parameters)


def _written_out(block: nn.Module) -> bool:
    """Whether :func:`attention_branch` writes this block out: timm's ``Attention`` in a
    ``Block`` (``norm1``, ``ls1``, ``drop_path1``; ``norm2``, ``mlp``, ``ls2``, ``drop_path2``)."""
    return isinstance(getattr(block, "attn", None), Attention) and all(
        hasattr(block, name) for name in ("norm1", "ls1", "drop_path1", "norm2", "mlp", "ls2",
                                          "drop_path2"))


def block_qkv(block: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(q, k, v)`` ``[B, heads, T, d]`` of a timm ``Block`` on tokens ``x``: ``norm1``,
    ``qkv``, then ``q_norm`` / ``k_norm``, as timm's ``Attention.forward`` computes them."""
    attn: Attention = block.attn
    b, t, _ = x.shape
    qkv = attn.qkv(block.norm1(x)).reshape(b, t, 3, attn.num_heads, attn.head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return attn.q_norm(q), attn.k_norm(k), v


def attention_branch(block: nn.Module, x: Tensor, kind: str, grid: tuple[int, int],
                     cross: Tensor | None = None) -> Tensor:
    """``drop_path1(ls1(proj(norm(A v) * gate)))``: the attention branch of a timm ``Block``
    on tokens ``x`` with its softmax replaced by the dense path ``kind``'s ``A``
    (:func:`otviz.towers.dense.dense_attention`; ``cross`` the intermediate attention
    ResCLIP's RCS reads)."""
    attn: Attention = block.attn
    b, t, _ = x.shape
    q, k, v = block_qkv(block, x)
    a = dense_attention(kind, q, k, attn.scale, grid, cross).to(v)
    out = attn.norm((a @ v).transpose(1, 2).reshape(b, t, attn.num_heads * attn.head_dim))
    gate = getattr(attn, "gate", None)
    if gate is not None:
        out = out * gate(block.norm1(x)).sigmoid()
    return block.drop_path1(block.ls1(attn.proj_drop(attn.proj(out))))


def self_only_mask(tokens: int, device: torch.device) -> Tensor:
    """``[T, T]`` the boolean attention mask letting each token attend to itself alone
    (``A = I`` after the softmax, as MaskCLIP's value path)."""
    return torch.eye(tokens, dtype=torch.bool, device=device)


@register_image_tower(TimmModel)
class TimmTower(ImageTower):
    @property
    def native_size(self) -> tuple[int, int]:
        return tuple(self.visual.image_size)  # type: ignore[return-value]

    @property
    def family(self) -> str:
        return f"timm {type(self.visual.trunk).__name__}"

    def sources(self) -> tuple[str, ...]:
        trunk = self.visual.trunk
        if not _token_trunk(trunk):
            return ("last",)
        blocks = list(trunk.blocks)
        if len(blocks) < 2 or not all(_takes_mask(b) for b in blocks):
            return ("last", "layer:K")
        if getattr(trunk, "rope", None) is not None or not all(_written_out(b) for b in blocks):
            return ("last", "layer:K", "maskclip")
        return ("last", "layer:K", *(s for s in DENSE_SOURCES if fits(s, len(blocks)) and (
            s != "scclip" or trunk.num_prefix_tokens == 1)))

    @property
    def depth(self) -> int:
        return len(self.visual.trunk.blocks)

    def _encode(self, pixels: Tensor, source: FeatureSource) -> tuple[Tensor, Tensor]:
        index = source.layer if source.kind == "layer" else -1
        _, patches, pooled = self._grid_forward(pixels, index)
        if source.kind in DENSE_SOURCES:
            patches = self._dense(pixels, source.kind)
        return patches, pooled

    def _block_inputs(self, pixels: Tensor, blocks: list[int]) -> list[Tensor]:
        """``[B, T, D]`` the tokens entering each of ``blocks`` (indices from 1), prefix
        tokens first: timm's ``forward_intermediates`` of the blocks before them, no norm."""
        trunk = self.visual.trunk
        outs = trunk.forward_intermediates(
            pixels, indices=[i - 1 for i in blocks], return_prefix_tokens=True, norm=False,
            stop_early=True, output_fmt="NLC", intermediates_only=True)
        return [torch.cat([o[1], o[0]], dim=1) if isinstance(o, tuple) else o for o in outs]

    def _dense(self, pixels: Tensor, kind: str) -> Tensor:
        """``[B, N, width]`` the last block rewritten as the dense path ``kind`` from the
        model's current parameters, through the trunk's final norm (module docstring)."""
        trunk = self.visual.trunk
        *middle, last = trunk.blocks
        if kind == "scclip":  # every block's output but the last's
            outputs = self._block_inputs(pixels, list(range(1, len(middle) + 1)))
            out = scclip_tokens(outputs, self.grid, lambda z, mid: attention_branch(
                last, z, "scclip", self.grid, mid))
            return trunk.norm(out)
        reads = list(RESCLIP_LAYERS) if kind == "resclip-rcs" else []
        *inputs, x = self._block_inputs(pixels, [*reads, len(middle)])
        if kind == "maskclip":
            out = last(x, attn_mask=self_only_mask(x.shape[1], x.device))
        else:
            maps = [softmax_attention(*block_qkv(middle[i], y)[:2], middle[i].attn.scale)
                    for i, y in zip(reads, inputs, strict=True)]
            cross = torch.stack(maps).mean(0) if maps else None
            out = rewritten_block(kind, x, attention_branch(last, x, kind, self.grid, cross),
                                  lambda z: last.drop_path2(last.ls2(last.mlp(last.norm2(z)))))
        return trunk.norm(out)[:, -self.grid[0] * self.grid[1]:]

    def _grid_forward(self, pixels: Tensor, index: int = -1,
                      ) -> tuple[tuple[int, int], Tensor, Tensor]:
        """``(grid, patches, pooled)`` with the patches of block / stage ``index`` (the last
        by default) through the trunk's final norm."""
        indices = 1 if index == -1 else [index]
        out = self.visual.forward_intermediates(pixels, indices=indices,
                                                normalize_intermediates=True)
        spatial = out["image_intermediates"][-1]  # [B, C, h, w]
        final_conv = getattr(self.visual.trunk, "final_conv", None)
        if final_conv is not None:  # FastViT: its final conv follows the last stage's output
            spatial = final_conv(spatial)
        grid = (int(spatial.shape[2]), int(spatial.shape[3]))
        return grid, spatial.flatten(2).transpose(1, 2), out["image_features"]

    def project(self, patches: Tensor) -> Tensor:
        trunk = self.visual.trunk
        B, N, C = patches.shape
        flat = patches.reshape(B * N, C)
        prefix = getattr(trunk, "num_prefix_tokens", None)
        if prefix is None:  # convolutional trunk: a 1 x 1 map
            one = flat[:, :, None, None]
        else:  # token trunk: the token in every slot, so any pooling returns it
            one = flat[:, None, :].expand(-1, prefix + 1, -1)
        out = self.visual.head(trunk.forward_head(one))
        return out.reshape(B, N, -1)
