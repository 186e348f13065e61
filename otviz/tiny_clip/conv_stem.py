"""A convolutional stem for the tiny CLIP's image tower (Xiao et al. 2021, "Early
convolutions help transformers see better").

It replaces the ViT's patch embedding (one linear map per ``p x p`` patch, open_clip's
``visual.conv1``) with ``log2(p)`` stride-2 3x3 convolutions, each followed by batch norm
and ReLU, then a 1x1 convolution to the transformer's width. The token grid stays the
patch grid (``image_size / p`` per side), so everything downstream of the stem (position
embeddings, the transformer, every OT method) sees the same shapes; but each token now reads
a receptive field larger than its patch through overlapping convolutions, so an object's
outline split across patch borders still reaches the tokens that cover it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn

from otviz.knobs import VISION_STEMS


def stem_channels(width: int, patch_size: int) -> tuple[int, ...]:
    """Channels of the stride-2 convolutions: doubling up to ``width`` (24-48-96 for
    width 96 and 8-px patches, as in the issue's pilot)."""
    n = int(round(math.log2(patch_size)))
    if n < 1 or 2**n != patch_size:
        raise ValueError(f"a convolutional stem needs a power-of-two patch size, got {patch_size}")
    return tuple(max(1, width // 2 ** (n - 1 - i)) for i in range(n))


class ConvStem(nn.Module):
    """``[B, 3, H, W] -> [B, width, H / p, W / p]``, a drop-in for ``visual.conv1``."""

    def __init__(self, width: int, patch_size: int, channels: Sequence[int] | None = None) -> None:
        super().__init__()
        channels = tuple(channels or stem_channels(width, patch_size))
        if 2 ** len(channels) != patch_size:
            raise ValueError(f"{len(channels)} stride-2 convolutions do not make {patch_size}-px "
                             "tokens")
        layers: list[nn.Module] = []
        c_in = 3
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(c), nn.ReLU(inplace=True)]
            c_in = c
        self.blocks = len(channels)
        layers.append(nn.Conv2d(c_in, width, 1))
        self.layers = nn.Sequential(*layers)
        self.out_channels = width  # read as ``visual.conv1.out_channels`` like the linear embedding

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)

    def low_level(self, x: Tensor) -> Tensor:
        """The stem's features before its last block, at half the token stride: local pixel
        statistics at the scale of a patch, before the last block mixes neighbouring
        patches (what :mod:`otviz.ood` compares with the world's)."""
        return self.layers[: 3 * (self.blocks - 1)](x) if self.blocks > 1 else x


def install_stem(visual: nn.Module, stem: str) -> None:
    """Give an open_clip ``VisionTransformer`` the stem ``stem`` (``"patch"``: open_clip's
    linear patch embedding, kept; ``"conv"``: :class:`ConvStem`)."""
    if stem not in VISION_STEMS:
        raise ValueError(f"unknown vision stem {stem!r}; known: {', '.join(VISION_STEMS)}")
    if stem == "conv":
        patch = visual.patch_size
        patch = patch[0] if isinstance(patch, tuple) else patch
        visual.conv1 = ConvStem(visual.conv1.out_channels, int(patch))
