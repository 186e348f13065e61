"""The trust table's localisation metrics, one row at a time, with one rule for ties.

Quantus 0.6.0 reads a tie for the peak as a hit when any tied pixel is in the gold mask (so a
flat map hits whenever the mask is not empty) and an empty mask as a hit; its rank accuracy
breaks ties by the sort's index order. Here every metric scores a row on its own and a tie is
broken uniformly at random, each metric's value being its expectation:

* pointing game (Zhang et al., IJCV 2018): on the token grid, by the grounding table's own
  function (:func:`~otviz.eval.grounding_metrics.expected_hits`), so the two tables cannot
  drift: the share of the tied peak tokens in the gold region;
* relevance mass accuracy (Arras et al., Inf. Fusion 2022, Eq. 2): the share of the map's
  relevance inside the gold mask; no ties to break; a map with no relevance is flat, and
  scores the mask's share of the pixels;
* relevance rank accuracy (Arras et al. 2022, Eq. 3): the share of the ``K`` most relevant
  pixels (``K`` the mask's size) inside the mask, the pixels tied at the ``K``-th value
  entering the top ``K`` at random (:func:`rank_accuracy`);
* AUC (Fawcett, Pattern Recognit. Lett. 2006, Sec. 7): the ROC area of the map as a score of
  the mask's pixels, a tied pair of an inside and an outside pixel counting 1/2 (the
  Mann-Whitney statistic with mid-ranks; Hanley and McNeil, Radiology 1982), which is the
  expected area under random tie-breaking and what Quantus' ``roc_curve`` gives.

A gold mask with no pixel (its box holds no token's centre) scores 0 in pointing, mass and
rank (nothing of the map can lie in it) and has no AUC (no positives, Fawcett 2006 Sec. 4);
the tables count those rows. A mask over the whole picture has no AUC either (no negatives).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from otviz.eval.grounding_metrics import expected_hits
from otviz.patch_grid.tokens import TokenGeometry


def token_values(pixels: np.ndarray, geometry: TokenGeometry) -> Tensor:
    """``[P, N]``: each token's value read at the first pixel of its cell on ``pixels``
    (``[P, 1, H, W]`` or ``[P, H, W]``): the token map a painted map
    (:func:`~otviz.eval.trust.adapter.to_pixels`) was drawn from, exactly (a token with no
    pixel reads 0)."""
    height, width = pixels.shape[-2:]
    flat = torch.as_tensor(np.ascontiguousarray(pixels)).reshape(-1, height * width)
    own = geometry.owner(width, height).reshape(-1)
    seen = own >= 0
    first = torch.full((geometry.n,), height * width, dtype=torch.long).scatter_reduce(
        0, own[seen], torch.arange(height * width)[seen], reduce="amin")
    padded = torch.cat([flat, flat.new_zeros(flat.shape[0], 1)], dim=1)
    return padded[:, first]


def pointing(maps: np.ndarray, masks: np.ndarray, geometry: TokenGeometry) -> np.ndarray:
    """``[P]`` expected pointing-game hits of the painted ``maps`` on the gold ``masks``
    (both ``[P, 1, H, W]``), read on the token grid."""
    inside = token_values(masks, geometry) > 0
    return expected_hits(token_values(maps, geometry), inside).numpy()


def mass_accuracy(maps: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """``[P]`` relevance mass accuracy (Arras et al. 2022, Eq. 2): relevance inside the mask
    over all relevance; a map with no relevance scores the mask's share of the pixels, an
    empty mask 0."""
    a, s = _rows(maps), _rows(masks) > 0
    total = a.sum(axis=1)
    inside = np.where(s, a, 0.0).sum(axis=1)
    share = s.mean(axis=1)
    return np.where(total > 0, inside / np.where(total > 0, total, 1.0), share)


def rank_accuracy(maps: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """``[P]`` expected relevance rank accuracy (Arras et al. 2022, Eq. 3) under random
    tie-breaking: with ``K`` the mask's size and ``v`` the ``K``-th largest value, the top
    ``K`` holds every pixel above ``v`` and ``m = K - #{a > v}`` of the pixels tied at ``v``
    drawn at random, so ``E[hits] = #{a > v, in mask} + m #{a = v, in mask} / #{a = v}``,
    divided by ``K``; an empty mask scores 0."""
    out = np.zeros(maps.shape[0])
    for p, (a, s) in enumerate(zip(_rows(maps), _rows(masks) > 0, strict=True)):
        k = int(s.sum())
        if k == 0:
            continue
        v = np.sort(a)[::-1][k - 1]
        above, tied = a > v, a == v
        m = k - int(above.sum())
        out[p] = ((s & above).sum() + m * (s & tied).sum() / tied.sum()) / k
    return out


def roc_auc(maps: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """``[P]`` the ROC area of each map as a score of its mask's pixels (Fawcett 2006), a tied
    (inside, outside) pair counting 1/2: ``(R - n1 (n1 + 1) / 2) / (n1 n0)`` with ``R`` the
    sum of the inside pixels' mid-ranks (Hanley and McNeil 1982); NaN when the mask is empty
    or covers every pixel."""
    from scipy.stats import rankdata  # here, not at import: the app's start does not pay it

    out = np.full(maps.shape[0], np.nan)
    for p, (a, s) in enumerate(zip(_rows(maps), _rows(masks) > 0, strict=True)):
        n1 = int(s.sum())
        n0 = s.size - n1
        if n1 and n0:
            ranks = rankdata(a, method="average")
            out[p] = (ranks[s].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)
    return out


def empty_masks(masks: np.ndarray) -> np.ndarray:
    """``[P]`` bool: the gold masks with no pixel (their box holds no token's centre)."""
    return ~(_rows(masks) > 0).any(axis=1)


def _rows(x: np.ndarray) -> np.ndarray:
    """``[P, ...]`` -> ``[P, D]`` float32 (the precision the maps are painted in)."""
    return np.asarray(x, dtype=np.float32).reshape(x.shape[0], -1)
