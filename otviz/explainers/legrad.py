"""LeGrad (Bousselham et al., 2024, "LeGrad: An Explainability Method for Vision Transformers
via Feature Formation Sensitivity", arXiv 2404.03214), reimplemented from the paper.

For every layer ``l`` of the ViT (from :attr:`LeGradExplainer.first_layer` on), the layer's
output tokens ``z^l`` are read as an image embedding the way the model reads its last layer's:
mean over the tokens, the final LayerNorm and projection, ``e^l = proj(LN(mean_t z^l_t))``;
its similarity to the phrase, ``s^l = <e^l / |e^l|, t>``, is differentiated with respect to
that layer's attention map ``A^l [heads, T, T]`` (the softmax probabilities), and

    E^l = mean_heads mean_queries ReLU(ds^l / dA^l)          (a value per key token)
    E   = min-max( sum_l E^l )  over the patch tokens          (class token dropped)

The gradient itself is the explanation: no attention-times-gradient product. LeGrad's own
package (``legrad`` on PyPI) pins ``open_clip_torch <= 2.23``, which conflicts with the
open_clip 3.x otviz builds on, so it is reimplemented here on
:func:`otviz.explainers.towers.vit_blocks` (the attention maps as tensors of the graph).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from otviz.explainers.base import PhraseExplainer, min_max, register_explainer
from otviz.explainers.towers import vit_blocks, vit_tower


@register_explainer
class LeGradExplainer(PhraseExplainer):
    """LeGrad over the layers ``first_layer .. L-1`` (default: all of them, as the paper
    aggregates; its reference wrapper defaults to the last two of a ViT-B)."""

    name = "legrad"
    label = "LeGrad"
    source = "Bousselham et al. 2024 (arXiv 2404.03214), reimplemented from the paper"

    def __init__(self, model: nn.Module, first_layer: int = 0) -> None:
        super().__init__(model)
        self.first_layer = first_layer

    def check(self) -> None:
        vit_tower(self.model, self.label)

    def layer_maps(self, pixels: Tensor, text: Tensor) -> Tensor:
        """``[L', B, N]`` the per-layer signals ``E^l`` over the patch tokens, for the layers
        ``first_layer .. L-1`` (before the sum and the min-max)."""
        visual = vit_tower(self.model, self.label)
        depth = len(visual.transformer.resblocks)
        if not 0 <= self.first_layer < depth:
            raise ValueError(f"LeGrad: first_layer {self.first_layer} is not a layer of this "
                             f"{depth}-layer ViT")
        n = visual.grid_size[0] * visual.grid_size[1]
        with torch.enable_grad():
            # a leaf input: the attention maps are in the graph even on a frozen model
            tokens, maps = vit_blocks(visual, pixels.detach().requires_grad_(True))
            signals = []
            for layer in range(self.first_layer, len(maps)):
                z = tokens[layer + 1]
                emb = F.normalize(visual.ln_post(z.mean(1)) @ visual.proj, dim=-1)
                s = (emb * text.to(emb)).sum()  # pairs are independent: one backward for all
                (grad,) = torch.autograd.grad(s, maps[layer], retain_graph=True)
                signals.append(grad.clamp_min(0).mean(dim=(1, 2))[:, -n:])
        return torch.stack(signals).detach()

    def explain(self, pixels: Tensor, text: Tensor) -> Tensor:
        visual = vit_tower(self.model, self.label)
        heat = min_max(self.layer_maps(pixels, text).sum(0))
        return heat.reshape(heat.shape[0], *visual.grid_size)
