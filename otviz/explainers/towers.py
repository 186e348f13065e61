"""What Grad-CAM reads of an image tower, per tower family: the target layer and its reshape
(:func:`cam_target`, one entry per family in :data:`CAM_TARGETS`). (What the attention-reading
explainers read is :mod:`otviz.explainers.attention`.)

A family is found by the tower's module type, so a new one is one :func:`register_cam_target`
entry, not a branch in every explainer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from open_clip.modified_resnet import ModifiedResNet
from open_clip.timm_model import TimmModel
from open_clip.transformer import VisionTransformer
from torch import Tensor, nn

from otviz.explainers.base import ExplainerUnsupportedError
from otviz.registry import Registry

Reshape = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class CamTarget:
    """A Grad-CAM target: the module whose output is the activation map, and how to turn that
    output into ``[B, C, h, w]`` (``None``: it already is a conv map)."""

    layer: nn.Module
    reshape: Reshape | None


#: tower type -> its Grad-CAM target (the first ``isinstance`` match wins); a type
#: registered twice is an error.
CAM_TARGETS: Registry[type[nn.Module], Callable[[nn.Module], CamTarget]] = Registry(
    "Grad-CAM target of the tower")


def register_cam_target(tower: type[nn.Module]) -> Callable:
    """Decorator: ``fn(visual) -> CamTarget`` is the target of towers of type ``tower``
    (``ValueError`` when ``tower`` has one already)."""
    return CAM_TARGETS.under(tower)


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
