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
