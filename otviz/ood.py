"""How far an image is from the synthetic world, as a backbone sees it.

Score: the backbone's patch embedding (its first layer, ``visual.conv1``: one vector per
image patch, before any attention; for the embedded model's convolutional stem, the stem's
features before its last block, :meth:`otviz.tiny_clip.conv_stem.ConvStem.low_level`) of the image,
each patch's Euclidean distance to the nearest patch embedding of :data:`N_REFERENCE` world
test images, divided by the median norm of those references; ``s(x) = -median over the
patches of x``. World images are flat shapes on plain grounds with a fine grain, so their
patches have near neighbours in the bank; photographs are textured everywhere and most of
their patches do not. (The pooled image embedding does not separate them on the tiny CLIP:
it maps photos, like noise, close to world images.)

Threshold, calibrated on the loaded backbone at first use (any image size or patch grid,
never hard-coded): in-world scores of :data:`N_HELD_OUT` other world test images against
the scores of :data:`N_CROPS` seeded crops of a real photograph shipped with matplotlib
(``grace_hopper.jpg``). When these are separated, the threshold lies between the lowest
in-world score and the highest photo score, :data:`WORLD_SIDE` of the gap below the world
(every held-out world image stays in-world; crops of one photograph reach less far towards
the world than other photographs do, so the threshold sits near the world's edge); else it
is the 5th percentile of the in-world scores (at most 5% of world images flagged). An image
scoring below it is *far from the world*.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from matplotlib import cbook
from PIL import Image
from torch import Tensor

from otviz.backbone import Backbone, ImageInput, to_rgb
from otviz.world import World

N_REFERENCE, N_HELD_OUT, N_CROPS = 64, 48, 12
IN_WORLD_QUANTILE = 0.05
WORLD_SIDE = 0.1
CALIBRATION_PHOTO = "grace_hopper.jpg"


@dataclass(frozen=True)
class WorldDistance:
    """A backbone's bank of world patch embeddings and the calibrated threshold.

    Attributes:
        bank: ``[N_REFERENCE * N, C]`` patch embeddings of world test images.
        scale: their median norm.
        threshold: scores below it are far from the world.
        in_world: scores of the held-out world images (calibration).
        photos: scores of the photograph's crops (calibration).
    """

    bank: Tensor
    scale: float
    threshold: float
    in_world: np.ndarray
    photos: np.ndarray

    @classmethod
    def calibrate(cls, backbone: Backbone, seed: int = 0) -> WorldDistance:
        """Bank and threshold for ``backbone`` (about 120 patch-embedding passes, no
        transformer layer)."""
        samples = World(split="test", seed=seed).samples(0, N_REFERENCE + N_HELD_OUT)
        world = patch_embeddings(backbone, [s.image for s in samples])
        bank = world[:N_REFERENCE].reshape(-1, world.shape[-1])
        scale = float(bank.norm(dim=-1).median())
        partial = cls(bank, scale, 0.0, np.zeros(0), np.zeros(0))
        in_world = partial.scores(world[N_REFERENCE:])
        photos = partial.scores(patch_embeddings(backbone, photo_crops(seed)))
        low, high = float(in_world.min()), float(photos.max())
        if high < low:
            threshold = low - WORLD_SIDE * (low - high)
        else:
            threshold = float(np.quantile(in_world, IN_WORLD_QUANTILE))
        return cls(bank, scale, threshold, in_world, photos)

    def scores(self, patches: Tensor) -> np.ndarray:
        """``s(x)`` of each image's patch embeddings ``[B, N, C]``."""
        nearest = torch.stack([torch.cdist(p, self.bank).min(dim=-1).values for p in patches])
        return -(nearest / self.scale).median(dim=1).values.numpy()

    def is_far(self, backbone: Backbone, image: ImageInput) -> bool:
        """Whether ``image`` scores below the threshold."""
        return bool(self.scores(patch_embeddings(backbone, [image]))[0] < self.threshold)


def patch_embeddings(backbone: Backbone, images: list[ImageInput]) -> Tensor:
    """``[B, N, C]``: the first layer of the backbone's image tower on each patch."""
    with torch.no_grad():
        return backbone.stem(backbone.image_tensor(images)).float().cpu()


def photo_crops(seed: int = 0) -> list[Image.Image]:
    """:data:`N_CROPS` seeded square crops (a fifth to all of the shorter side) of the
    photograph :data:`CALIBRATION_PHOTO`."""
    photo = to_rgb(cbook.get_sample_data(CALIBRATION_PHOTO, asfileobj=False))
    rng = np.random.default_rng(seed)
    crops = []
    for _ in range(N_CROPS):
        side = int(min(photo.size) * rng.uniform(0.2, 1.0))
        x = int(rng.integers(0, photo.width - side + 1))
        y = int(rng.integers(0, photo.height - side + 1))
        crops.append(photo.crop((x, y, x + side, y + side)))
    return crops
