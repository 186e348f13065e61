"""One adapter per open_clip tower family, registered by tower class (see :mod:`.base`).

Importing this package registers every family: open_clip's ViT (:mod:`.vit`),
ModifiedResNet (:mod:`.resnet`), timm towers (:mod:`.timm_tower`) and the text towers
(:mod:`.text`).
"""

from otviz.towers import resnet, text, timm_tower, vit  # noqa: F401  (registration)
from otviz.towers.base import (
    IMAGE_TOWERS,
    TEXT_TOWERS,
    BackboneLoadError,
    ImageTower,
    TextTower,
    image_tower,
    text_tower,
)

__all__ = [
    "IMAGE_TOWERS",
    "TEXT_TOWERS",
    "BackboneLoadError",
    "ImageTower",
    "TextTower",
    "image_tower",
    "text_tower",
]
