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
trunk's final norm, timm's ``forward_intermediates``); the dense paths on trunks of timm
attention blocks (:mod:`otviz.towers.dense`): the last block runs on a private copy of the
model (:mod:`otviz.towers.private`) with its softmax attention replaced by the path's ``A``
(built from the block's own ``q, k`` after its ``q_norm`` / ``k_norm``), and its attention
branch (or, for SCLIP, its whole output) read before the trunk's final norm. A trunk with
rotary position embeddings (EVA) gives ``maskclip`` only: its ``q, k`` carry the rotation,
which the q-q / k-k papers do not define. The tower runs at its native size only.
"""

from __future__ import annotations

from collections.abc import Callable

from open_clip.timm_model import TimmModel
from torch import Tensor, nn

from otviz.knobs import DENSE_SOURCES
from otviz.towers.base import ImageTower, register_image_tower
from otviz.towers.dense import KEEPS_RESIDUAL, READS_QUERIES_OR_KEYS, dense_attention
from otviz.towers.private import HOOKS, hooked, private_model, timm_attention, unfused
from otviz.towers.sources import FeatureSource


def _token_trunk(trunk: nn.Module) -> bool:
    """Whether the trunk is a ViT-like stack of token blocks after a patch embedding."""
    return hasattr(trunk, "blocks") and hasattr(trunk, "patch_embed")


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
        if not all(timm_attention(b) is not None and hasattr(b, "drop_path1")
                   for b in trunk.blocks):
            return ("last", "layer:K")
        if getattr(trunk, "rope", None) is not None:
            return ("last", "layer:K", "maskclip")
        return ("last", "layer:K", *DENSE_SOURCES)

    @property
    def depth(self) -> int:
        return len(self.visual.trunk.blocks)

    def _encode(self, pixels: Tensor, source: FeatureSource) -> tuple[Tensor, Tensor]:
        index = source.layer if source.kind == "layer" else -1
        _, patches, pooled = self._grid_forward(pixels, index)
        if source.kind in DENSE_SOURCES:
            patches = self._dense(pixels, source.kind)
        return patches, pooled

    def _dense(self, pixels: Tensor, kind: str) -> Tensor:
        """``[B, N, width]`` the last block rewritten as the dense path ``kind``, through the
        trunk's final norm (module docstring)."""
        n = self.grid[0] * self.grid[1]
        with HOOKS:
            trunk = private_model(self.visual).trunk
            last = trunk.blocks[-1]
            attn = timm_attention(last)
            seen: dict[str, Tensor] = {}

            def keep(name: str) -> Callable[[nn.Module, tuple, Tensor], None]:
                return lambda _m, _a, out: seen.__setitem__(name, out)

            def replace(_m: nn.Module, _a: tuple, probabilities: Tensor) -> Tensor:
                return dense_attention(kind, seen.get("q", probabilities),
                                       seen.get("k", probabilities), attn.scale,
                                       self.grid).to(probabilities)

            handles = [attn.attn_drop.register_forward_hook(replace)]
            if kind in READS_QUERIES_OR_KEYS:
                handles += [attn.q_norm.register_forward_hook(keep("q")),
                            attn.k_norm.register_forward_hook(keep("k"))]
            if kind in KEEPS_RESIDUAL:
                handles.append(last.register_forward_hook(keep("out")))
            else:
                handles.append(last.drop_path1.register_forward_pre_hook(
                    lambda _m, args: seen.__setitem__("out", args[0])))
            with unfused([attn]), hooked(*handles):
                trunk.forward_features(pixels)
            return trunk.norm(seen["out"])[:, -n:]

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
