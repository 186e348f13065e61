"""open_clip's own VisionTransformer, pooled by class token, by mean, or by attention pool.

Patch tokens are the last block's tokens with the class token dropped. Width space: after
the tower's final norm (``ln_post``) for class-token and mean pooling; for attention-pooled
towers (CoCa: ``attn_pool`` then ``ln_post`` then ``proj``) after the pooler's key norm
``ln_k``, the norm the pooler applies to the tokens it reads. Projected space: ``@ proj``;
for an attention-pooled tower each token goes through the pooler's value and output
projections first (:func:`value_path`), which is what the pooler returns for a query that
attends to that one token alone (MaskCLIP, Zhou et al. 2022, Sec. 3.2), then ``ln_post``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from open_clip.transformer import AttentionalPooler, ResidualAttentionBlock, VisionTransformer
from torch import Tensor, nn
from torch.nn import functional as F

from otviz.errors import UserInputError
from otviz.knobs import DENSE_SOURCES
from otviz.tiny_clip.conv_stem import ConvStem
from otviz.towers.base import ImageTower, register_image_tower
from otviz.towers.dense import (
    RESCLIP_LAYERS,
    dense_attention,
    fits,
    rewritten_block,
    softmax_attention,
)
from otviz.towers.facts import (
    AttentionReader,
    AttentionTrace,
    CamTarget,
    FamilyUnsupportedError,
    tokens_to_map,
)
from otviz.towers.resclip_sfr import Feedback
from otviz.towers.scclip import scclip_tokens
from otviz.towers.sources import FeatureSource

#: The most memory one image's attention matrix may take at a chosen input size, in bytes
#: (:meth:`VitTower.check_side`): the largest tensor a transformer block allocates per image.
MAX_ATTENTION_BYTES = 4 * 2**30


def value_path(attention: nn.MultiheadAttention, x: Tensor) -> Tensor:
    """``out_proj(v_proj(x))``: multi-head attention's output for one token that attends
    only to itself (softmax over a single key is 1), per position (MaskCLIP Sec. 3.2)."""
    e = attention.embed_dim
    weight = (attention.in_proj_weight[2 * e :] if attention._qkv_same_embed_dim
              else attention.v_proj_weight)
    bias = attention.in_proj_bias[2 * e :] if attention.in_proj_bias is not None else None
    return attention.out_proj(F.linear(x, weight, bias))


def interpolated_positions(positions: Tensor, grid: tuple[int, int], prefix: int = 1) -> Tensor:
    """``[prefix + h * w, D]`` a square grid's position embeddings (after ``prefix`` prefix
    rows) resized to ``grid`` bicubically, as open_clip's ``resize_pos_embed`` and timm's
    ``resample_abs_pos_embed`` do (224 -> 448 px on ViT-B/16: 14 x 14 -> 28 x 28)."""
    old = int(round((positions.shape[0] - prefix) ** 0.5))
    if (old, old) == tuple(grid):
        return positions
    patch = positions[prefix:].reshape(1, old, old, -1).permute(0, 3, 1, 2)
    patch = F.interpolate(patch, size=grid, mode="bicubic", antialias=True, align_corners=False)
    return torch.cat([positions[:prefix], patch.permute(0, 2, 3, 1).reshape(-1, patch.shape[1])])


def block_qkv(block: ResidualAttentionBlock, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(q, k, v)`` ``[B, heads, T, d]`` of an open_clip block on tokens ``x`` (after its
    ``ln_1``), from its current ``in_proj`` weights."""
    mha: nn.MultiheadAttention = block.attn
    b, t, d = x.shape
    qkv = F.linear(block.ln_1(x), mha.in_proj_weight, mha.in_proj_bias)
    q, k, v = (z.reshape(b, t, mha.num_heads, d // mha.num_heads).transpose(1, 2)
               for z in qkv.chunk(3, dim=-1))
    return q, k, v


def block_attention_map(block: ResidualAttentionBlock, x: Tensor) -> Tensor:
    """``[B, heads, T, T]`` the block's own softmax attention on tokens ``x``."""
    q, k, _ = block_qkv(block, x)
    return softmax_attention(q, k, q.shape[-1] ** -0.5)


def block_forward(block: ResidualAttentionBlock, x: Tensor) -> tuple[Tensor, Tensor]:
    """``(x_next, A)``: one pre-norm block (``x + ls_1(attn(ln_1 x))``, then ``+ ls_2(mlp(ln_2
    x))``) with its softmax map ``A = softmax(q k^T / sqrt(d_head))`` kept as a tensor of the
    graph (``nn.MultiheadAttention`` computes the same without returning it)."""
    mha: nn.MultiheadAttention = block.attn
    b, t, d = x.shape
    q, k, v = block_qkv(block, x)
    a = softmax_attention(q, k, q.shape[-1] ** -0.5)
    x = x + block.ls_1(mha.out_proj((a @ v).transpose(1, 2).reshape(b, t, d)))
    return x + block.ls_2(block.mlp(block.ln_2(x))), a


def block_attention_branch(block: ResidualAttentionBlock, x: Tensor, kind: str,
                           grid: tuple[int, int], cross: Tensor | None = None,
                           feedback: Feedback | None = None) -> Tensor:
    """``ls_1(out_proj(A v))``: the attention branch of an open_clip block on tokens ``x``
    with its mixing replaced by the dense path ``kind``
    (:func:`otviz.towers.dense.dense_attention`; ``cross`` the intermediate attention
    ResCLIP's RCS reads, ``feedback`` its SFR)."""
    mha: nn.MultiheadAttention = block.attn
    if kind == "maskclip":  # A = I: each token's own value, no T x T matrix needed
        return block.ls_1(value_path(mha, block.ln_1(x)))
    b, t, d = x.shape
    q, k, v = block_qkv(block, x)
    a = dense_attention(kind, q, k, (d // mha.num_heads) ** -0.5, grid, cross, feedback)
    return block.ls_1(mha.out_proj((a @ v).transpose(1, 2).reshape(b, t, d)))


def dense_block(block: ResidualAttentionBlock, x: Tensor, kind: str, grid: tuple[int, int],
                cross: Tensor | None = None, feedback: Feedback | None = None) -> Tensor:
    """The last block rewritten as the dense path ``kind`` (:mod:`otviz.towers.dense`) from
    the block's current parameters: its attention branch alone, or with the residual and
    feed-forward where the path keeps them (:func:`otviz.towers.dense.rewritten_block`)."""
    return rewritten_block(kind, x, block_attention_branch(block, x, kind, grid, cross, feedback),
                           lambda z: block.ls_2(block.mlp(block.ln_2(z))))


def _through_pooler(pooler: AttentionalPooler, x: Tensor) -> Tensor:
    return value_path(pooler.attn, pooler.ln_k(x))


def _standard_blocks(visual: VisionTransformer) -> bool:
    """Whether every block is a self-attention block of ``nn.MultiheadAttention``."""
    return all(isinstance(b, ResidualAttentionBlock) and isinstance(b.attn, nn.MultiheadAttention)
               and not hasattr(b, "ln_1_kv") for b in visual.transformer.resblocks)


@register_image_tower(VisionTransformer)
class VitTower(ImageTower):
    @property
    def grid(self) -> tuple[int, int]:
        if self.side is None:
            return tuple(self.visual.grid_size)  # type: ignore[return-value]
        conv1 = self.visual.conv1
        param = next(conv1.parameters())
        with torch.no_grad():
            out = conv1(torch.zeros(1, 3, *self.image_size, dtype=param.dtype, device=param.device))
        return (int(out.shape[-2]), int(out.shape[-1]))

    @property
    def width(self) -> int:
        return int(self.visual.conv1.out_channels)

    @property
    def embed_dim(self) -> int:
        return int(self.visual.output_dim)

    @property
    def family(self) -> str:
        if self.visual.attn_pool is None:
            return "open_clip ViT"
        return "attention-pooled open_clip ViT (CoCa)"

    def stem(self, pixels: Tensor) -> Tensor:
        """The patch embedding's output per patch; for otviz's convolutional stem its
        low-level features (:meth:`otviz.tiny_clip.conv_stem.ConvStem.low_level`)."""
        if isinstance(self.visual.conv1, ConvStem):
            return self.visual.conv1.low_level(pixels).flatten(2).transpose(1, 2)
        return super().stem(pixels)

    def _spatial_path(self) -> tuple[nn.Module, Callable[[Tensor], tuple[int, int]]]:
        """The patch embedding (or otviz's convolutional stem) places the tokens; the
        transformer after it mixes them without moving them."""
        conv1 = self.visual.conv1
        return conv1, lambda pixels: tuple(conv1(pixels).shape[-2:])

    def cam_target(self) -> CamTarget:
        """The last block's first LayerNorm: its patch outputs still reach a class-token
        pooling (the last block's own outputs do not), as the grad-cam library's ViT recipe
        takes it."""
        return CamTarget(self.visual.transformer.resblocks[-1].ln_1, tokens_to_map(self.grid))

    def randomisation_blocks(self) -> list[nn.Module]:
        return list(self.visual.transformer.resblocks)

    def attention_reader(self) -> AttentionReader:
        return OpenClipVitReader(self)

    def sources(self) -> tuple[str, ...]:
        dense = DENSE_SOURCES if _standard_blocks(self.visual) else ()
        return ("last", "layer:K", *(s for s in dense if fits(s, self.depth)))

    @property
    def depth(self) -> int:
        return len(self.visual.transformer.resblocks)

    def check_side(self, side: int) -> None:
        """Refuse (:class:`UserInputError`, nothing allocated) a side below one patch, one
        that is not a multiple of the patch (the patch embedding would drop the last
        ``side mod patch`` rows and columns of pixels) and one whose per-image attention
        matrix, ``tokens^2 * heads * bytes per element`` with ``tokens = (side / patch)^2 +
        1``, exceeds :data:`MAX_ATTENTION_BYTES` (4 GiB: ViT-B/16 in float32 up to 1552 px,
        ViT-L/14 up to 1260 px)."""
        patch = int(self.visual.patch_size[0])
        where = f"the {self.family} tower's {patch} px patches"
        if side < patch:
            raise UserInputError(f"image size: {side} px is below one of {where}")
        if side % patch:
            low = side - side % patch
            raise UserInputError(
                f"image size: {side} px is not a multiple of {where}; take {low} or "
                f"{low + patch} px")
        heads = max(int(b.attn.num_heads) for b in self.visual.transformer.resblocks)
        size = next(self.visual.parameters()).element_size()
        need = ((side // patch) ** 2 + 1) ** 2 * heads * size
        if need > MAX_ATTENTION_BYTES:
            cells = math.isqrt(math.isqrt(MAX_ATTENTION_BYTES // (heads * size)) - 1)
            raise UserInputError(
                f"image size: {side} px would need about {need / 2**30:,.1f} GiB for one "
                f"image's attention ({heads} heads, {(side // patch) ** 2 + 1:,} tokens), "
                f"over the {MAX_ATTENTION_BYTES / 2**30:.0f} GiB cap; the largest side within "
                f"it is {cells * patch} px")

    @property
    def resizable(self) -> bool:
        return True

    def _encode(self, pixels: Tensor, source: FeatureSource) -> tuple[Tensor, Tensor]:
        if source.kind == "last" and self.side is None:  # the tower's own forward, as ever
            out = self.visual.forward_intermediates(pixels, indices=1, output_fmt="NLC")
            return self.norm(out["image_intermediates"][-1]), out["image_features"]
        tokens, pooled = self._tokens(pixels, source)
        return self.norm(tokens[:, -self.grid[0] * self.grid[1]:]), pooled

    def embeds(self, pixels: Tensor) -> Tensor:
        """``[B, 1 + h * w, D]`` the first block's input at any input size: open_clip's
        ``_embeds`` with the position embeddings resized to the grid
        (:func:`interpolated_positions`)."""
        v = self.visual
        x = v.conv1(pixels)
        grid = (int(x.shape[-2]), int(x.shape[-1]))
        x = x.flatten(2).transpose(1, 2)
        cls = v.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        positions = interpolated_positions(v.positional_embedding, grid).to(x.dtype)
        x = torch.cat([cls, x], dim=1) + positions
        return v.ln_pre(v.patch_dropout(x))

    def resclip_patches(self, pixels: Tensor, feedback: Feedback | None) -> Tensor:
        """``[B, N, width]`` ``resclip-rcs``'s patches with the last block's logits refined
        by ResCLIP's SFR ``feedback`` (``None``: ``resclip-rcs`` itself;
        :func:`otviz.towers.resclip_sfr.encode_with_classes` calls it)."""
        tokens, _ = self._tokens(pixels, FeatureSource("resclip-rcs"), feedback)
        return self.norm(tokens[:, -self.grid[0] * self.grid[1]:])

    def _tokens(self, pixels: Tensor, source: FeatureSource,
                feedback: Feedback | None = None) -> tuple[Tensor, Tensor]:
        """``(tokens [B, T, D], pooled [B, E])``: the tokens ``source`` reads (block
        ``K``'s output, the last block's, or the last block rewritten as a dense path;
        ``feedback`` ResCLIP's SFR on ``resclip-rcs``) and the tower's pooled embedding of
        its own last block."""
        v = self.visual
        *first, last = v.transformer.resblocks
        x = self.embeds(pixels)
        read = None
        maps, outputs = [], []
        for index, block in enumerate(first):
            if source.kind == "resclip-rcs" and index in RESCLIP_LAYERS:
                maps.append(block_attention_map(block, x))
            x = block(x)
            outputs.append(x)
            if source.kind == "layer" and index == source.layer:
                read = x
        if source.kind == "scclip":
            read = scclip_tokens(outputs, self.grid, lambda z, mid: block_attention_branch(
                last, z, "scclip", self.grid, mid))
        elif source.kind in DENSE_SOURCES:
            cross = torch.stack(maps).mean(0) if maps else None
            read = dense_block(last, x, source.kind, self.grid, cross, feedback)
        x = last(x)
        pooled, _ = v._pool(x)
        pooled = pooled @ v.proj if v.proj is not None else pooled
        return (x if read is None else read), pooled

    def norm(self, x: Tensor) -> Tensor:
        """Block-output tokens ``[B, T, D]`` -> the width space of :meth:`encode`'s patches."""
        v = self.visual
        if v.attn_pool is not None and v.attn_pool_contrastive is None:
            return v.attn_pool.ln_k(x)  # CoCa: ln_post acts after the pool, at its width
        return v.ln_post(x)

    def project(self, patches: Tensor) -> Tensor:
        v = self.visual
        if v.attn_pool is None:
            x = patches
        elif v.attn_pool_contrastive is None:  # CoCa: attn_pool -> ln_post -> proj
            x = v.ln_post(value_path(v.attn_pool.attn, patches))
        elif v.attn_pool_type == "parallel":
            x = _through_pooler(v.attn_pool_contrastive, patches)
        else:  # cascade: the contrastive pooler reads the first pooler's output
            x = _through_pooler(v.attn_pool_contrastive, _through_pooler(v.attn_pool, patches))
        return x @ v.proj if v.proj is not None else x


def _query_weights(pool_type: str, n_queries: int) -> Tensor:
    """``[Q]`` how open_clip's ``_global_pool`` mixes the attention pooler's query outputs
    into the pooled one (``tok``: the first; ``avg``: the mean of the others)."""
    weights = torch.zeros(n_queries)
    if pool_type == "tok":
        weights[0] = 1.0
    else:
        weights[1:] = 1.0 / (n_queries - 1)
    return weights


class OpenClipVitReader(AttentionReader):
    """The attention of open_clip's ``VisionTransformer`` of standard blocks
    (``nn.MultiheadAttention``), pooled by class token, by mean, or by CoCa's attention
    pooler: its blocks re-run with the map written out (:func:`block_forward`) at the input
    size of the adapter ``tower``."""

    def __init__(self, tower: VitTower) -> None:
        visual = tower.visual
        if not _standard_blocks(visual):
            raise FamilyUnsupportedError(
                "reads standard self-attention blocks; this ViT has others")
        if getattr(visual, "attn_pool_contrastive", None) is not None or visual.pool_type not in (
                "tok", "avg"):
            raise FamilyUnsupportedError(
                f"the pooling of this ViT ({visual.attn_pool_type or 'attention'} pooler, "
                f"pool type {visual.pool_type!r}) has no rule here")
        self.visual = visual
        self.tower = tower

    @property
    def grid(self) -> tuple[int, int]:
        return self.tower.grid

    def trace(self, pixels: Tensor) -> AttentionTrace:
        x = self.tower.embeds(pixels)
        tokens, maps = [x], []
        for block in self.visual.transformer.resblocks:
            x, a = block_forward(block, x)
            tokens.append(x)
            maps.append(a)
        return AttentionTrace(tokens, maps)

    def readout(self, tokens: Tensor) -> Tensor:
        pooled, _ = self.visual._pool(tokens)
        return pooled @ self.visual.proj if self.visual.proj is not None else pooled

    def layer_readout(self, tokens: Tensor) -> Tensor:
        """Without an attention pooler, LeGrad's authors' wrapper for open_clip ViTs: the
        mean over all tokens, ``ln_post``, ``proj``; with one (CoCa), the tower's own
        readout."""
        if self.visual.attn_pool is not None:
            return self.readout(tokens)
        return self.visual.ln_post(tokens.mean(1)) @ self.visual.proj

    def pooled_row(self, tokens: Tensor, matrix: Tensor) -> Tensor:
        visual, n = self.visual, self.grid[0] * self.grid[1]
        if visual.attn_pool is None:
            return matrix[:, 0] if visual.pool_type == "tok" else matrix[:, -n:].mean(1)
        pooler = visual.attn_pool  # CoCa: queries attend to all tokens, then tok / avg
        keys = pooler.ln_k(tokens)
        query = pooler.ln_q(pooler.query).unsqueeze(0).expand(tokens.shape[0], -1, -1)
        _, weights = pooler.attn(query, keys, keys, need_weights=True)  # [B, Q, T], head mean
        mix = _query_weights(visual.pool_type, weights.shape[1]).to(weights)
        return torch.einsum("q,bqt,bts->bs", mix, weights.detach(), matrix)
