"""What the attention-reading explainers (LeGrad, Chefer relevance, MaskCLIP) read of a
transformer image tower, one reader per tower family.

A reader gives, for preprocessed pixels:

* :meth:`AttentionReader.trace`: every block's output tokens and its softmax attention map
  ``A^l [B, heads, T, T]``, both tensors of the autograd graph, so a gradient with respect
  to an attention map is one :func:`torch.autograd.grad`;
* :meth:`AttentionReader.readout`: the tower's own pooled, projected embedding of any
  layer's tokens (for the last layer's, the model's image embedding);
* :meth:`AttentionReader.pooled_row`: which mix of token rows of a token-to-token matrix the
  pooled output reads (the class token's row; the patch rows' mean; for an attention pooler,
  its attention weights over the tokens).

(MaskCLIP's value path is a feature source of the towers, :mod:`otviz.towers.dense`.)

Families: open_clip's ``VisionTransformer`` (class token, mean, CoCa's attention pooler),
whose blocks are re-run here with the attention map written out (:func:`vit_blocks`, at the
input size of the tower adapter it is given), and
timm's ViT-style trunks (timm ``VisionTransformer``: SigLIP, SigLIP 2; ``Eva``: EVA02,
EVA-CLIP, PE), whose own forward is run on the explainers' private copy of the model
(:mod:`otviz.explainers.private`) with their unfused attention path switched on and the
attention probabilities read by a hook where timm computes them (the ``attn_drop`` that
follows the softmax). Anything else raises :class:`ExplainerUnsupportedError` naming the
explainer and the reason.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from open_clip.timm_model import TimmModel
from open_clip.transformer import ResidualAttentionBlock, VisionTransformer
from torch import Tensor, nn

from otviz.explainers.base import ExplainerUnsupportedError
from otviz.explainers.private import HOOKS, hooked, private_model, timm_attention, unfused
from otviz.towers import ImageTower
from otviz.towers.vit import VitTower


@dataclass
class AttentionTrace:
    """A forward of the tower with its attention written out.

    tokens: the first block's input, then each block's output (``L + 1`` tensors
        ``[B, T, D]``; the patches are the last ``h * w`` tokens, prefix tokens first).
    maps: each block's softmax attention (``L`` tensors ``[B, heads, T, T]``).
    """

    tokens: list[Tensor]
    maps: list[Tensor]


class AttentionReader(ABC):
    """What the attention explainers read of one family of image towers (module docstring).

    Args:
        model: the open_clip model (its ``visual`` tower is read).
        explainer: the explainer's label, for the messages of
            :class:`ExplainerUnsupportedError`.
    """

    def __init__(self, model: nn.Module, explainer: str) -> None:
        self.model = model
        self.explainer = explainer

    @property
    @abstractmethod
    def grid(self) -> tuple[int, int]:
        """``(h, w)`` the tower's patch grid."""

    @abstractmethod
    def trace(self, pixels: Tensor) -> AttentionTrace:
        """The tower's forward on ``pixels`` with every block's tokens and attention map, in
        the graph (the caller enables gradients and makes ``pixels`` a leaf)."""

    @abstractmethod
    def readout(self, tokens: Tensor) -> Tensor:
        """``[B, E]`` the tower's pooled, projected embedding of one layer's ``tokens``."""

    @abstractmethod
    def pooled_row(self, tokens: Tensor, matrix: Tensor) -> Tensor:
        """``[B, T]`` the row of a token-to-token ``matrix`` ``[B, T, T]`` that the pooled
        output reads, for the last layer's ``tokens``."""

    def layer_readout(self, tokens: Tensor) -> Tensor:
        """``[B, E]`` LeGrad's reading of an intermediate layer's ``tokens`` as an image
        embedding: the tower's own :meth:`readout` unless the family says otherwise."""
        return self.readout(tokens)


# ----------------------------------------------------------------------- open_clip's ViT
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


def vit_blocks(tower: VitTower, pixels: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """``(tokens, maps)``: the input of the first block then each block's output
    (``L + 1`` tensors ``[B, T, D]``) and each block's attention map (``L`` tensors
    ``[B, heads, T, T]``) for preprocessed ``pixels`` at the ``tower`` adapter's input size."""
    x = tower.embeds(pixels)
    tokens, maps = [x], []
    for block in tower.visual.transformer.resblocks:
        x, a = block_forward(block, x)
        tokens.append(x)
        maps.append(a)
    return tokens, maps


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
    """open_clip's ``VisionTransformer`` of standard blocks (``nn.MultiheadAttention``),
    pooled by class token, by mean, or by CoCa's attention pooler."""

    def __init__(self, model: nn.Module, explainer: str, tower: VitTower | None = None) -> None:
        super().__init__(model, explainer)
        visual = model.visual
        if not all(isinstance(b, ResidualAttentionBlock) and isinstance(
                b.attn, nn.MultiheadAttention) and not hasattr(b, "ln_1_kv")
                for b in visual.transformer.resblocks):
            raise ExplainerUnsupportedError(
                f"{explainer} reads standard self-attention blocks; this ViT has others")
        contrastive = getattr(visual, "attn_pool_contrastive", None)
        if contrastive is not None or visual.pool_type not in ("tok", "avg"):
            raise ExplainerUnsupportedError(
                f"{explainer}: the pooling of this ViT ({visual.attn_pool_type or 'attention'}"
                f" pooler, pool type {visual.pool_type!r}) has no rule here")
        self.visual = visual
        self.tower = tower if tower is not None else VitTower(visual)

    @property
    def grid(self) -> tuple[int, int]:
        return self.tower.grid

    def trace(self, pixels: Tensor) -> AttentionTrace:
        return AttentionTrace(*vit_blocks(self.tower, pixels))

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


# ----------------------------------------------------------------------- timm ViT trunks
def latent_pool_attention(pool: nn.Module, x: Tensor) -> Tensor:
    """``[B, heads, Q, T]`` the softmax attention of timm's ``AttentionPoolLatent`` (the
    ``map`` pooling of SigLIP) from its latent queries to the tokens ``x`` it pools, as its
    unfused path computes it."""
    b, t, c = x.shape
    if pool.pos_embed is not None:
        x = x + pool.pos_embed.unsqueeze(0).to(x.dtype)
    heads, dim = pool.num_heads, pool.head_dim
    q = pool.q(pool.latent.expand(b, -1, -1)).reshape(b, pool.latent_len, heads, dim)
    k = pool.kv(x).reshape(b, t, 2, heads, dim).permute(2, 0, 3, 1, 4)[0]
    q, k = pool.q_norm(q.transpose(1, 2)), pool.k_norm(k)
    return torch.softmax((q * pool.scale) @ k.transpose(-2, -1), dim=-1)


class TimmVitReader(AttentionReader):
    """timm ViT-style trunks (``blocks`` of attention modules with timm's unfused path),
    pooled by class token (``token``), patch mean (``avg``) or attention pooler (``map``)."""

    POOLS = ("token", "avg", "map")

    def __init__(self, model: nn.Module, explainer: str) -> None:
        super().__init__(model, explainer)
        trunk = model.visual.trunk
        blocks = getattr(trunk, "blocks", None)
        if blocks is None or not hasattr(trunk, "patch_embed") or not all(
                timm_attention(b) is not None and hasattr(b, "drop_path1") for b in blocks):
            raise ExplainerUnsupportedError(
                f"{self.explainer} reads ViT attention maps; timm trunk "
                f"{type(trunk).__name__} has no ViT blocks of timm's attention")
        pool = "map" if getattr(trunk, "attn_pool", None) is not None else trunk.global_pool
        if pool not in self.POOLS:
            raise ExplainerUnsupportedError(
                f"{self.explainer}: timm pooling {pool!r} has no rule here "
                f"(known: {', '.join(self.POOLS)})")
        self.pool = pool

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.model.visual.trunk.patch_embed.grid_size)  # type: ignore[return-value]

    def trace(self, pixels: Tensor) -> AttentionTrace:
        with HOOKS:
            trunk = private_model(self.model).visual.trunk
            attns = [timm_attention(b) for b in trunk.blocks]
            tokens: list[Tensor] = []
            maps: list[Tensor] = []
            handles = [trunk.blocks[0].register_forward_pre_hook(
                lambda _m, args: tokens.append(args[0]))]
            handles += [b.register_forward_hook(lambda _m, _a, out: tokens.append(out))
                        for b in trunk.blocks]
            handles += [a.attn_drop.register_forward_hook(lambda _m, _a, out: maps.append(out))
                        for a in attns]
            with unfused(attns), hooked(*handles):
                trunk.forward_features(pixels)
        if len(maps) != len(trunk.blocks) or len(tokens) != len(maps) + 1:
            raise ExplainerUnsupportedError(
                f"{self.explainer}: {len(maps)} attention maps came out of the "
                f"{len(trunk.blocks)} blocks of timm trunk {type(trunk).__name__}")
        return AttentionTrace(tokens, maps)

    def readout(self, tokens: Tensor) -> Tensor:
        visual = self.model.visual
        return visual.head(visual.trunk.forward_head(visual.trunk.norm(tokens)))

    def _pool_keys(self) -> int:
        """Index of the first token the pooling reads (timm drops the prefix tokens unless
        the trunk says to include them; EVA's pooler reads every token)."""
        trunk = self.model.visual.trunk
        return 0 if getattr(trunk, "pool_include_prefix", self.pool == "map") else int(
            trunk.num_prefix_tokens)

    def pooled_row(self, tokens: Tensor, matrix: Tensor) -> Tensor:
        trunk, start = self.model.visual.trunk, self._pool_keys()
        if self.pool == "token":
            return matrix[:, 0]
        if self.pool == "avg":
            return matrix[:, start:].mean(1)
        a = latent_pool_attention(trunk.attn_pool, trunk.norm(tokens)[:, start:]).detach()
        mix = a.mean(1)  # [B, Q, T - start], head mean
        mix = mix[:, 0] if trunk.attn_pool.pool == "token" or mix.shape[1] == 1 else mix.mean(1)
        return torch.einsum("bt,bts->bs", mix, matrix[:, start:])


def attention_reader(model: nn.Module, explainer: str, tower: ImageTower | None = None,
                     ) -> AttentionReader:
    """The reader of ``model``'s image tower (through the adapter ``tower``: the input size
    it runs at); :class:`ExplainerUnsupportedError` (naming ``explainer``) for a tower family
    without one."""
    visual = getattr(model, "visual", None)
    if isinstance(visual, VisionTransformer):
        return OpenClipVitReader(model, explainer, tower if isinstance(tower, VitTower) else None)
    if isinstance(visual, TimmModel):
        return TimmVitReader(model, explainer)
    raise ExplainerUnsupportedError(
        f"{explainer} reads ViT attention maps; this model's image tower is "
        f"{type(visual).__name__}")
