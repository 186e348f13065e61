"""Hard-negative mining by global score, in both directions (ConceptOT Sec. 2.4, Alg. 2
line 6): for image i the K_h captions x_j, j != i, with the highest ``s_g(I_i, x_j)``; for
caption i the K_h images I_j, j != i, with the highest ``s_g(I_j, x_i)``.

"j != i" is read as "j is not a positive of i": besides the diagonal, a pair is excluded
when it shows the same image (COCO has five captions per image, several can share a batch)
or when its caption is the same text as the positive's caption (case and white space
ignored; the synthetic world repeats short captions such as "a red circle"). Either would
be a false negative, a correct match the loss would push away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class HardNegatives:
    """Mined negatives of a batch of B positives.

    Attributes:
        text: ``[B, K]`` caption indices (into the batch) per image: ``N_X(i)``.
        text_valid: ``[B, K]`` bool, False where fewer than K candidates were left.
        image: ``[B, K]`` image indices per caption: ``N_I(i)``.
        image_valid: ``[B, K]`` bool.
    """

    text: Tensor
    text_valid: Tensor
    image: Tensor
    image_valid: Tensor


def caption_ids(captions: Sequence[str]) -> Tensor:
    """``[n]`` long: equal ids for captions that are the same text up to case and white
    space (first occurrence order)."""
    index: dict[str, int] = {}
    return torch.tensor(
        [index.setdefault(" ".join(c.lower().split()), len(index)) for c in captions],
        dtype=torch.long,
    )


def positive_mask(image_ids: Tensor, text_ids: Tensor) -> Tensor:
    """``[B, B]`` bool: True where pair j is no negative for pair i (same image or same
    caption text; the diagonal included)."""
    same_image = image_ids[:, None] == image_ids[None, :]
    same_text = text_ids[:, None] == text_ids[None, :]
    return same_image | same_text


def mine_hard_negatives(sim: Tensor, k: int, excluded: Tensor | None = None) -> HardNegatives:
    """Top-``k`` hard negatives of a ``[B, B]`` global-score matrix ``sim[i, j] =
    s_g(I_i, x_j)`` (positives on the diagonal), both directions.

    Args:
        sim: global scores; not differentiated (mining is a selection).
        k: negatives per direction, ``K_h``.
        excluded: ``[B, B]`` bool pairs that are not negatives (:func:`positive_mask`);
            the diagonal is always excluded.

    Returns:
        :class:`HardNegatives`; where fewer than ``k`` candidates exist the surplus slots
        are marked invalid (their indices are arbitrary and must be masked out).
    """
    if sim.dim() != 2 or sim.shape[0] != sim.shape[1]:
        raise ValueError(f"sim must be square [B, B], got {tuple(sim.shape)}")
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    b = sim.shape[0]
    block = torch.eye(b, dtype=torch.bool, device=sim.device)
    if excluded is not None:
        block = block | excluded.to(sim.device)
    scores = sim.detach().masked_fill(block, -torch.inf)
    kk = min(k, b)
    t_val, t_idx = scores.topk(kk, dim=1)
    i_val, i_idx = scores.T.topk(kk, dim=1)
    if kk < k:  # a batch smaller than K_h + 1: pad with invalid slots
        pad = (0, k - kk)
        t_val = torch.nn.functional.pad(t_val, pad, value=-torch.inf)
        i_val = torch.nn.functional.pad(i_val, pad, value=-torch.inf)
        t_idx = torch.nn.functional.pad(t_idx, pad)
        i_idx = torch.nn.functional.pad(i_idx, pad)
    return HardNegatives(t_idx, torch.isfinite(t_val), i_idx, torch.isfinite(i_val))
