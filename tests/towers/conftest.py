"""Small random-init instances of every open_clip tower family (offline)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

#: One registry architecture per family: its shrunken config is built and run.
FAMILIES: dict[str, str] = {
    "vit-cls": "ViT-B-32",
    "vit-attnpool-coca": "coca_ViT-B-32",
    "resnet": "RN50",
    "timm-siglip-map": "ViT-B-16-SigLIP",
    "timm-siglip-i18n-no-text-proj": "ViT-SO400M-16-SigLIP-i18n-256",
    "timm-eva02": "EVA02-B-16",
    "timm-convnext": "convnext_base",
    "timm-fastvit-mobileclip2": "MobileCLIP2-S0",
    "timm-vitamin": "ViTamin-S",
    "hf-text-xlmr": "xlm-roberta-base-ViT-B-32",
    "vit-avg-bert-tokenizer": "ViT-L-14-CLIPA",
}


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the local Hugging Face stand-ins (tokenizers, text configs) are written."""
    return tmp_path_factory.mktemp("hf-stand-ins")


def shrunk_backbone(model_name: str, hf_dir: Path, space: str = "width", seed: int = 0):
    """The shrunken random-init ``model_name`` as a :class:`~otviz.backbone.Backbone`."""
    from otviz.backbone import Backbone
    from otviz.towers.shrunken import register_shrunken

    name = register_shrunken(model_name, hf_dir)
    torch.manual_seed(seed)
    return Backbone.from_pretrained(name, None, space=space)


@pytest.fixture(scope="session", params=sorted(FAMILIES))
def family(request, hf_dir):
    """``(family, backbone)`` for every family, width space."""
    return request.param, shrunk_backbone(FAMILIES[request.param], hf_dir)


@pytest.fixture(scope="module")
def vit_b16_f64():
    """A random open_clip ViT-B/16 in float64 and a 224 px input (seeds 0 and 1)."""
    import open_clip

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = open_clip.create_model("ViT-B-16", pretrained=None).double().eval()
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1)).double()
    return model, pixels


@pytest.fixture(scope="module")
def deep_timm_vit():
    """A random 12-block timm ViT (timm's ViT-Ti/16 through open_clip's ``TimmModel``) in
    float64, and an input: deep enough for ResCLIP's blocks 5-8."""
    from open_clip.timm_model import TimmModel

    torch.manual_seed(4)
    torch.set_num_threads(1)
    model = torch.nn.Module()
    model.visual = TimmModel("vit_tiny_patch16_224", 32, image_size=224, pool="avg")
    model = model.double().eval()
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(6)).double()
    return model, pixels
