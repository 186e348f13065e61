"""LeGrad (Bousselham et al., 2024, "LeGrad: An Explainability Method for Vision Transformers
via Feature Formation Sensitivity", arXiv 2404.03214), reimplemented from the paper.

For every layer ``l`` of the ViT (from :attr:`LeGradExplainer.first_layer` on), the layer's
output tokens ``z^l`` are read as an image embedding the way the model reads its last layer's
(:meth:`~otviz.towers.facts.AttentionReader.layer_readout`: for open_clip's class-token
or mean-pooled ViTs, as the authors' wrapper does, the mean over the tokens, the final
LayerNorm and projection, ``e^l = proj(LN(mean_t z^l_t))``; for attention-pooled and timm
towers (SigLIP's attention pooler, EVA), the tower's own pooling, norm and head);
its similarity to the phrase, ``s^l = <e^l / |e^l|, t>``, is differentiated with respect to
that layer's attention map ``A^l [heads, T, T]`` (the softmax probabilities), and

    E^l = mean_heads mean_queries ReLU(ds^l / dA^l)          (a value per key token)
    E   = min-max( sum_l E^l )  over the patch tokens          (class token dropped)

The gradient itself is the explanation: no attention-times-gradient product. LeGrad's own
package (``legrad`` on PyPI) pins ``open_clip_torch <= 2.23``, which conflicts with the
open_clip 3.x otviz builds on, so it is reimplemented here on the attention traces the tower
adapter gives (:meth:`otviz.towers.base.ImageTower.attention_reader`: the attention maps as
tensors of the graph, re-run from the model's current weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from otviz.explainers.base import PhraseExplainer, min_max, register_explainer
from otviz.towers import ImageTower


@register_explainer
class LeGradExplainer(PhraseExplainer):
    """LeGrad over the layers ``first_layer .. L-1`` (default: all of them, as the paper
    aggregates; its reference wrapper defaults to the last two of a ViT-B)."""

    name = "legrad"
    label = "LeGrad"
    source = "Bousselham et al. 2024 (arXiv 2404.03214), reimplemented from the paper"

    def __init__(self, model: nn.Module, tower: ImageTower | None = None,
                 first_layer: int = 0) -> None:
        super().__init__(model, tower)
        self.first_layer = first_layer

    def check(self) -> None:
        self.asked(self.tower.attention_reader)

    def layer_maps(self, pixels: Tensor, text: Tensor) -> Tensor:
        """``[L', B, N]`` the per-layer signals ``E^l`` over the patch tokens, for the layers
        ``first_layer .. L-1`` (before the sum and the min-max)."""
        reader = self.asked(self.tower.attention_reader)
        n = reader.grid[0] * reader.grid[1]
        with torch.enable_grad():
            # a leaf input: the attention maps are in the graph even on a frozen model
            trace = reader.trace(pixels.detach().requires_grad_(True))
            depth = len(trace.maps)
            if not 0 <= self.first_layer < depth:
                raise ValueError(f"LeGrad: first_layer {self.first_layer} is not a layer of "
                                 f"this {depth}-layer ViT")
            signals = []
            for layer in range(self.first_layer, depth):
                emb = F.normalize(reader.layer_readout(trace.tokens[layer + 1]), dim=-1)
                s = (emb * text.to(emb)).sum()  # pairs are independent: one backward for all
                (grad,) = torch.autograd.grad(s, trace.maps[layer], retain_graph=True)
                signals.append(grad.clamp_min(0).mean(dim=(1, 2))[:, -n:])
        return torch.stack(signals).detach()

    def explain(self, pixels: Tensor, text: Tensor) -> Tensor:
        grid = self.asked(self.tower.attention_reader).grid
        heat = min_max(self.layer_maps(pixels, text).sum(0))
        return heat.reshape(heat.shape[0], *grid)
