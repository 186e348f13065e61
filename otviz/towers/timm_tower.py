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
from collections.abc import Callable

import torch
from open_clip.timm_model import TimmModel
from timm.layers import Attention, apply_rot_embed_cat
from timm.models.eva import EvaAttention, EvaBlock
from timm.models.vision_transformer import Block
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
                     cross: Tensor | None = None, feedback: Feedback | None = None) -> Tensor:
    """``drop_path1(ls1(proj(norm(A v) * gate)))``: the attention branch of a timm ``Block``
    on tokens ``x`` with its softmax replaced by the dense path ``kind``'s ``A``
    (:func:`otviz.towers.dense.dense_attention`; ``cross`` the intermediate attention
    ResCLIP's RCS reads, ``feedback`` its SFR)."""
    attn: Attention = block.attn
    b, t, _ = x.shape
    q, k, v = block_qkv(block, x)
    a = dense_attention(kind, q, k, attn.scale, grid, cross, feedback).to(v)
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

    def cam_target(self) -> CamTarget:
        """The last stage of a staged conv trunk (ConvNeXt, FastViT: ``NCHW`` maps); the last
        block's first norm of a token trunk (EVA, SigLIP), as for open_clip's ViT."""
        trunk = self.visual.trunk
        if hasattr(trunk, "stages"):
            return CamTarget(trunk.stages[-1], None)
        if _token_trunk(trunk):
            return CamTarget(trunk.blocks[-1].norm1, tokens_to_map(self.grid))
        raise FamilyUnsupportedError(
            f"timm trunk {type(trunk).__name__} has neither stages nor ViT blocks")

    def randomisation_blocks(self) -> list[nn.Module]:
        """A token trunk's blocks, else a staged trunk's stages."""
        trunk = self.visual.trunk
        blocks = getattr(trunk, "blocks", None) or getattr(trunk, "stages", None)
        if not blocks:
            raise FamilyUnsupportedError(
                f"timm trunk {type(trunk).__name__} has neither blocks nor stages")
        return list(blocks)

    def attention_reader(self) -> AttentionReader:
        return TimmVitReader(self)

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

    def resclip_patches(self, pixels: Tensor, feedback: Feedback | None) -> Tensor:
        """``[B, N, width]`` ``resclip-rcs``'s patches with the last block's logits refined
        by ResCLIP's SFR ``feedback`` (``None``: ``resclip-rcs`` itself;
        :func:`otviz.towers.resclip_sfr.encode_with_classes` calls it)."""
        return self._dense(pixels, "resclip-rcs", feedback)

    def _dense(self, pixels: Tensor, kind: str, feedback: Feedback | None = None) -> Tensor:
        """``[B, N, width]`` the last block rewritten as the dense path ``kind`` from the
        model's current parameters, through the trunk's final norm (module docstring;
        ``feedback`` ResCLIP's SFR on ``resclip-rcs``)."""
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
            out = rewritten_block(kind, x, attention_branch(last, x, kind, self.grid, cross,
                                                            feedback),
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


# ----------------------------------------------------------------------- attention, written out
def _traceable(block: nn.Module) -> bool:
    """Whether :func:`traced_block` writes this block out: a pre-norm timm ``Block`` of
    timm's ``Attention``, or an ``EvaBlock`` of ``EvaAttention``."""
    return (isinstance(block, Block) and isinstance(block.attn, Attention)) or (
        isinstance(block, EvaBlock) and isinstance(block.attn, EvaAttention))


def _eva_qkv(attn: EvaAttention, x: Tensor, rope: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(q, k, v)`` ``[B, heads, T, d]`` of timm's ``EvaAttention`` on normed tokens ``x``:
    fused or separate projections, the q / v biases, ``q_norm`` / ``k_norm`` and the rotary
    embedding on the patch tokens, as ``EvaAttention.forward`` computes them (timm
    ``models/eva.py``)."""
    b, t, _ = x.shape
    if attn.qkv is not None:
        qkv = attn.qkv(x)
        if attn.q_bias is not None:
            qkv = qkv + torch.cat((attn.q_bias, attn.k_bias, attn.v_bias))
        q, k, v = qkv.reshape(b, t, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    else:
        q, k, v = (proj(x).reshape(b, t, attn.num_heads, -1).transpose(1, 2)
                   for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    q, k = attn.q_norm(q), attn.k_norm(k)
    if rope is not None:
        npt, half = attn.num_prefix_tokens, getattr(attn, "rotate_half", False)
        q, k = (torch.cat([z[:, :, :npt], apply_rot_embed_cat(z[:, :, npt:], rope, half=half)],
                          dim=2).type_as(v) for z in (q, k))
    return q, k, v


def _scaled(block: nn.Module, k: int) -> Callable[[Tensor], Tensor]:
    """The block's layer scale ``k`` (timm's ``ls1`` / ``ls2``; EVA's ``gamma_1`` /
    ``gamma_2``, ``None`` for none)."""
    ls = getattr(block, f"ls{k}", None)
    if ls is not None:
        return ls
    gamma = getattr(block, f"gamma_{k}", None)
    return (lambda z: z) if gamma is None else (lambda z: gamma * z)


def traced_block(block: nn.Module, x: Tensor, rope: Tensor | None = None,
                 ) -> tuple[Tensor, Tensor]:
    """``(x_next, A)``: one pre-norm timm block on tokens ``x`` from its current weights,
    its softmax attention ``A [B, heads, T, T]`` kept as a tensor of the graph (timm's
    unfused path: ``softmax(q k^T * scale)``, then ``norm``, gate, ``proj``)."""
    attn = block.attn
    b, t, _ = x.shape
    if isinstance(attn, EvaAttention):
        q, k, v = _eva_qkv(attn, block.norm1(x), rope)
    else:
        q, k, v = block_qkv(block, x)
    a = softmax_attention(q, k, attn.scale)
    out = attn.norm((a @ v).transpose(1, 2).reshape(b, t, -1))
    gate = getattr(attn, "gate", None)
    if gate is not None:
        out = out * gate(block.norm1(x)).sigmoid()
    x = x + block.drop_path1(_scaled(block, 1)(attn.proj_drop(attn.proj(out))))
    return x + block.drop_path2(_scaled(block, 2)(block.mlp(block.norm2(x)))), a


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
    """The attention of timm ViT-style trunks (timm ``VisionTransformer``: SigLIP, SigLIP 2,
    ViTamin; ``Eva``: EVA02, EVA-CLIP), pooled by class token (``token``), patch mean
    (``avg``) or attention pooler (``map``): the trunk's embedding, then every block written
    out (:func:`traced_block`) from the model's current weights."""

    POOLS = ("token", "avg", "map")

    def __init__(self, tower: TimmTower) -> None:
        trunk = tower.visual.trunk
        if not _token_trunk(trunk) or not all(_traceable(b) for b in trunk.blocks):
            raise FamilyUnsupportedError(
                f"reads ViT attention maps; timm trunk {type(trunk).__name__} has no ViT "
                "blocks of timm's attention")
        if getattr(trunk, "rope_mixed", False):
            raise FamilyUnsupportedError(
                f"timm trunk {type(trunk).__name__} mixes its rotary embedding per block")
        pool = "map" if getattr(trunk, "attn_pool", None) is not None else trunk.global_pool
        if pool not in self.POOLS:
            raise FamilyUnsupportedError(
                f"timm pooling {pool!r} has no rule here (known: {', '.join(self.POOLS)})")
        self.visual, self.trunk, self.pool = tower.visual, trunk, pool

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.trunk.patch_embed.grid_size)  # type: ignore[return-value]

    def trace(self, pixels: Tensor) -> AttentionTrace:
        trunk = self.trunk
        x = trunk._pos_embed(trunk.patch_embed(pixels))
        if isinstance(x, tuple):  # EVA: the rotary embedding comes with the tokens
            x, rope = x
        else:
            x, rope = trunk.patch_drop(x), None
        x = trunk.norm_pre(x)
        tokens, maps = [x], []
        for block in trunk.blocks:
            x, a = traced_block(block, x, rope)
            tokens.append(x)
            maps.append(a)
        return AttentionTrace(tokens, maps)

    def readout(self, tokens: Tensor) -> Tensor:
        return self.visual.head(self.trunk.forward_head(self.trunk.norm(tokens)))

    def _pool_keys(self) -> int:
        """Index of the first token the pooling reads (timm drops the prefix tokens unless
        the trunk says to include them; EVA's pooler reads every token)."""
        return 0 if getattr(self.trunk, "pool_include_prefix", self.pool == "map") else int(
            self.trunk.num_prefix_tokens)

    def pooled_row(self, tokens: Tensor, matrix: Tensor) -> Tensor:
        trunk, start = self.trunk, self._pool_keys()
        if self.pool == "token":
            return matrix[:, 0]
        if self.pool == "avg":
            return matrix[:, start:].mean(1)
        a = latent_pool_attention(trunk.attn_pool, trunk.norm(tokens)[:, start:]).detach()
        mix = a.mean(1)  # [B, Q, T - start], head mean
        mix = mix[:, 0] if trunk.attn_pool.pool == "token" or mix.shape[1] == 1 else mix.mean(1)
        return torch.einsum("bt,bts->bs", mix, matrix[:, start:])
