"""Grad-CAM (Selvaraju et al., 2017) of the image-text similarity, through the ``grad-cam``
library (pytorch-grad-cam, the maintained implementation).

The score explained is the cosine ``s = <f(x) / |f(x)|, t>`` of the image embedding and the
phrase's unit text embedding ``t``. For an activation map ``A [C, h, w]`` of the target
layer (:meth:`otviz.towers.base.ImageTower.cam_target`, the tower family's answer), Grad-CAM is
``ReLU(sum_c alpha_c A_c)`` with ``alpha_c = mean_{ij} ds/dA_cij`` (Selvaraju et al. Eq. 1-2),
min-max scaled per map by the library. The library is asked for the map at the layer's own
resolution (the patch grid), not upsampled to the pixels. The library reads the target
layer through forward hooks it registers itself, so the call runs on the explainers' private
copy of the model, one call at a time (:mod:`otviz.explainers.private`: the concurrency
story).
"""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from otviz.explainers.base import ExplainerUnsupportedError, PhraseExplainer, register_explainer
from otviz.explainers.private import HOOKS, private_model


class ImageEmbedding(nn.Module):
    """The unit image embedding of an open_clip model, as the module grad-cam runs."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.clip = model

    def forward(self, pixels: Tensor) -> Tensor:
        return F.normalize(self.clip.encode_image(pixels), dim=-1)


class SimilarityTarget:
    """A grad-cam target: the model output's dot product with a unit text embedding."""

    def __init__(self, text: Tensor) -> None:
        self.text = text

    def __call__(self, output: Tensor) -> Tensor:
        return (output * self.text.to(output)).sum(-1)


@cache
def layer_grid_cam() -> type:
    """The library's Grad-CAM, its map left at the target layer's resolution instead of the
    input image's: the size is read off the activation the call's forward recorded (after
    the reshape), so no extra forward measures it. The class is made on first use: the
    library loads scikit-learn and SciPy when imported (1.1 s), which a process that never
    runs Grad-CAM (the command line, most of the app's clicks) does not pay."""
    from pytorch_grad_cam import GradCAM

    class LayerGridCAM(GradCAM):
        def get_target_width_height(self, input_tensor: Tensor) -> tuple[int, int]:
            h, w = self.activations_and_grads.activations[-1].shape[-2:]
            return int(w), int(h)

    return LayerGridCAM


@register_explainer
class GradCamExplainer(PhraseExplainer):
    name = "gradcam"
    label = "Grad-CAM"
    source = "Selvaraju et al. 2017, via the grad-cam library (pytorch-grad-cam)"

    def check(self) -> None:
        if self.tower.side is not None:
            raise ExplainerUnsupportedError(
                f"{self.label} runs the model's own forward, at the tower's native "
                f"{self.tower.native_size[0]} px only (this backbone runs at "
                f"{self.tower.image_size[0]} px)")
        self.asked(self.tower.cam_target)

    def explain(self, pixels: Tensor, text: Tensor) -> Tensor:
        self.check()
        with HOOKS, torch.enable_grad():
            model = private_model(self.model)
            target = self.asked(self.tower.on(model.visual).cam_target)
            cam = layer_grid_cam()(ImageEmbedding(model), [target.layer], target.reshape)
            try:
                # a leaf input that needs its gradient: the hooks fire on a frozen model too
                maps = cam(pixels.detach().requires_grad_(True),
                           [SimilarityTarget(t) for t in text])
            finally:
                cam.activations_and_grads.release()
                model.zero_grad(set_to_none=True)
        return torch.from_numpy(maps).to(pixels.device)
