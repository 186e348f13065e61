"""SC-CLIP (Bai et al., "Self-Calibrated CLIP for Training-Free Open-Vocabulary
Segmentation", 2024): the ``scclip`` feature source, from the tokens every block but the
last gives and the family's last-block attention branch.

The terms as the authors' code computes them (SuleBai/SC-CLIP, ``clip/model.py``; read,
not copied):

* anomaly tokens (L208-227, L271-277): on the patch tokens entering the last block, a
  local outlier factor over squared Euclidean distances with ``k = 30`` neighbours, the
  reachability of a point being its own k-distance, ``LRD = k / k-distance`` and ``LOF`` the
  mean of its neighbours' ``LRD`` over its own; the tokens above the 95th percentile
  (contamination 0.05) are anomalies, each replaced by the mean of its non-anomalous 3 x 3
  grid neighbours (L348-373; kept where it has none);
* mid-layer self-adjusting (L279-287, L295-298): ``M`` the cosine similarities of block
  8's patch tokens (anomalies resolved the same way), ``M_beta`` = ``M`` with entries below
  ``beta = 0.4`` set to 0, and a feature map aggregated by ``M_beta`` row-normalised
  (L343-346); the same with block 3's tokens (not resolved) after the last block;
* the last block's attention (L318-341): ``A = (softmax(3 (M - mean M)) + softmax(s k
  k^T)) / 2``, the first softmax over the entries at or above the mean only, on the patch
  tokens alone, no residual, no feed-forward, plus ``0.3`` times the class token (L290);
* multi-level fusion (L300-306): the sum of blocks 3-9's outputs through the same last-block
  attention and class-token term, aggregated by block 3's ``M_beta``, added to the output.

Blocks are counted from 0 (the authors' ``feats_list[i]`` is block ``i``'s output). The
authors run one image at a time; here the mean of ``M`` and the anomalies are per image.
The path needs a class token (one prefix token), 11 blocks or more and more than 30 patches.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn import functional as F

from otviz.errors import UserInputError

#: The authors' settings (``clip/model.py`` L246-251, L274).
BETA, PRE_ADJUST, POST_ADJUST, FUSED, CLASS_SHARE = 0.4, 8, 3, range(3, 10), 0.3
NEIGHBOURS, CONTAMINATION = 30, 0.05
#: The fewest blocks the path reads (block 9's output, before the last block).
DEPTH = max(FUSED) + 2


def anomalies(tokens: Tensor) -> Tensor:
    """``[N]`` bool: the local-outlier-factor anomalies among ``tokens`` ``[N, D]`` (module
    docstring; ``clip/model.py`` L208-227)."""
    distances = torch.cdist(tokens, tokens) ** 2
    near, index = torch.topk(distances, NEIGHBOURS + 1, largest=False)
    near, index = near[:, 1:], index[:, 1:]
    reach = torch.maximum(near, near[:, -1:])  # a point's own k-distance, as the authors'
    density = NEIGHBOURS / reach.mean(1)
    factor = (density[index] / density[:, None]).mean(1)
    return factor > torch.quantile(factor.float(), 1 - CONTAMINATION).to(factor)


def resolve(tokens: Tensor, outliers: Tensor, grid: tuple[int, int]) -> Tensor:
    """``[N, D]`` ``tokens`` with each outlier replaced by the mean of its non-outlier 3 x 3
    grid neighbours, where it has any (``clip/model.py`` L348-373)."""
    h, w = grid
    keep = (~outliers).to(tokens).reshape(1, 1, h, w)
    ring = torch.ones(1, 1, 3, 3, dtype=tokens.dtype, device=tokens.device)
    ring[0, 0, 1, 1] = 0
    fmap = tokens.T.reshape(-1, 1, h, w)
    total = F.conv2d(fmap * keep, ring, padding=1)
    count = F.conv2d(keep, ring, padding=1)
    mean = (total / count.clamp_min(1)).reshape(-1, h * w).T
    update = (outliers & (count.reshape(-1) > 0))[:, None]
    return torch.where(update, mean, tokens)


def similarity(tokens: Tensor) -> Tensor:
    """``[B, N, N]`` the cosine similarities of ``tokens`` ``[B, N, D]``."""
    unit = F.normalize(tokens, dim=-1)
    return unit @ unit.transpose(-1, -2)


def aggregate(tokens: Tensor, similarities: Tensor) -> Tensor:
    """``tokens`` mixed by ``similarities`` below ``BETA`` set to 0 and rows normalised
    (``clip/model.py`` L285-287, L343-346)."""
    weights = torch.where(similarities < BETA, torch.zeros_like(similarities), similarities)
    return (weights / (weights.sum(-1, keepdim=True) + 1e-6)) @ tokens


def self_adjusting_attention(k: Tensor, mid: Tensor, scale: float) -> Tensor:
    """``[B, heads, N, N]`` the last block's ``A = (softmax(3 (M - mean M)) + softmax(s k
    k^T)) / 2`` for keys ``k`` ``[B, heads, N, d]`` and ``M`` = ``mid`` ``[B, N, N]``, the
    first softmax over entries at or above the image's mean (``clip/model.py`` L330-335)."""
    centred = 3.0 * (mid - mid.mean(dim=(-1, -2), keepdim=True))
    centred = centred.masked_fill(centred < 0, float("-inf"))
    return (torch.softmax(centred, dim=-1)[:, None]
            + torch.softmax(scale * k @ k.transpose(-1, -2), dim=-1)) / 2


def scclip_tokens(outputs: list[Tensor], grid: tuple[int, int],
                  branch: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """``[B, N, D]`` SC-CLIP's last-block output for the patches (module docstring), from
    ``outputs`` the block outputs ``[B, 1 + N, D]`` of every block but the last (class token
    first) and ``branch(x, M)`` the last block's attention branch on patch tokens ``x`` with
    :func:`self_adjusting_attention` for ``M``."""
    n = grid[0] * grid[1]
    if n <= NEIGHBOURS:
        raise UserInputError(f"features: scclip needs more than {NEIGHBOURS} patches for its "
                             f"anomaly search; this input gives {n}")
    entering = outputs[-1]
    cls, patches = entering[:, :1], entering[:, 1:]
    outliers = [anomalies(p) for p in patches]
    patches = torch.stack([resolve(p, o, grid) for p, o in zip(patches, outliers, strict=True)])
    pre = torch.stack([resolve(p, o, grid)
                       for p, o in zip(outputs[PRE_ADJUST][:, 1:], outliers, strict=True)])
    mid = similarity(pre)
    after = similarity(outputs[POST_ADJUST][:, 1:])
    x = aggregate(branch(aggregate(patches, mid), mid) + CLASS_SHARE * cls, after)
    fused = sum(outputs[i] for i in FUSED)
    y = aggregate(branch(fused[:, 1:], mid) + CLASS_SHARE * fused[:, :1], after)
    return x + y
