"""Weak phrase grounding metrics (ConceptOT Sec. 2.6) and anchor diversity (ConceptOT
Fig. 4).

A phrase heatmap ``h_i(J) = sum_{j in J} Pi_ij`` over the patch grid (``Alignment.heatmap``)
is scored against the phrase's gold pixel box in two ways:

* pointing game: is the point the hottest token looks at (its receptive-field centre in the
  tower's token geometry, :class:`otviz.patch_grid.tokens.TokenGeometry`) inside the gold box?
  Ties for the peak are broken uniformly at random and the hit is its expectation
  (:func:`expected_hits`): one rule for every table that shows pointing (the grounding
  table, the trust table, the Align Trust panel, Browse, ``otviz eval --dataset``);
* box: threshold the heatmap at a fraction of its peak, take the envelope of the kept
  tokens' cells in pixels (:func:`otviz.patch_grid.boxes.heatmap_boxes`) and measure its IoU with
  the gold box; ``hit@0.5`` is the share of IoU >= 0.5.

Boxes are ``(x0, y0, x1, y1)`` in pixels, half-open like the world's boxes (a point ``x``
is inside when ``x0 <= x < x1``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.patch_grid.boxes import Geometries, heatmap_boxes, token_centres

#: The pointing game's tolerance, in source pixels: a peak within this distance (each axis)
#: of a gold box counts as a hit in the ``pointing_tol`` columns (the common 15 px; the
#: strict game, ``pointing``, needs the peak inside the box).
TOLERANCE_PX = 15.0


def grown_boxes(boxes: Tensor, scale: tuple[float, float], tolerance: float = TOLERANCE_PX
                ) -> Tensor:
    """``[..., 4]`` pixel boxes grown by ``tolerance`` source pixels on every side, ``scale``
    the ``(x, y)`` pixels of the picture per source pixel (``Sample.pixel_scale``)."""
    tx, ty = tolerance * scale[0], tolerance * scale[1]
    return boxes + boxes.new_tensor([-tx, -ty, tx, ty])


def phrase_token_select(token_word: Tensor, token_mask: Tensor, spans: Tensor) -> Tensor:
    """``[n, L]`` bool: the content tokens whose caption word lies in ``[start, end)``.

    Args:
        token_word: ``[n, L]`` word index of each token position (-1: none).
        token_mask: ``[n, L]`` bool, True for content tokens.
        spans: ``[n, 2]`` word spans ``(start, end)`` (e.g. a world ``Phrase``'s
            ``start``/``end``), one per row.
    """
    start, end = spans[:, :1], spans[:, 1:]
    return (token_word >= start) & (token_word < end) & token_mask


def points_in_boxes(points: Tensor, boxes: Tensor) -> Tensor:
    """``[...]`` bool: point ``(x, y)`` inside its half-open pixel box (``[..., 2]`` points,
    ``[..., 4]`` boxes, broadcast)."""
    x, y = points[..., 0], points[..., 1]
    b = boxes.to(torch.float64).cpu()
    return (b[..., 0] <= x) & (x < b[..., 2]) & (b[..., 1] <= y) & (y < b[..., 3])


def is_flat(heatmaps: Tensor) -> Tensor:
    """``[n]`` bool: the heatmap has one value everywhere (it points nowhere)."""
    return (heatmaps.amax(dim=1) == heatmaps.amin(dim=1)).cpu()


def tokens_in_boxes(geometry: Geometries, boxes: Tensor) -> Tensor:
    """``[n, N]`` bool: the tokens that look inside their row's gold box (``[n, 4]``), or
    inside any of its ``K`` gold boxes (``[n, K, 4]``; NaN boxes hold no point): the
    phrase's gold region on the token grid."""
    centres = token_centres(geometry, boxes.shape[0])  # [n, N, 2]
    many = boxes if boxes.dim() == 3 else boxes[:, None, :]
    return points_in_boxes(centres[:, :, None, :], many[:, None, :, :]).any(dim=2)


def peak_tokens(heatmaps: Tensor) -> Tensor:
    """``[n, N]`` bool: the tokens tied for each heatmap's maximum, the heat read with negative
    values as none (as the boxes read it, :func:`otviz.patch_grid.boxes.kept_tokens`) and
    compared in single precision (the trust maps' precision); a flat heatmap, or one with no
    positive heat, ties every token."""
    heat = heatmaps.detach().float().cpu().clamp_min(0.0)
    return heat == heat.amax(dim=1, keepdim=True)


def expected_hits(heatmaps: Tensor, inside: Tensor) -> Tensor:
    """``[n]`` float64: the pointing game's expected hit when the peak is drawn uniformly among
    the tied maxima (:func:`peak_tokens`): the share of the tied tokens that lie in the gold
    region ``inside`` (``[n, N]`` bool, :func:`tokens_in_boxes`).

    The pointing game (Zhang et al., IJCV 2018, Sec. 5.1) counts a hit when the map's maximum
    falls in the object; a map without ties scores 1 or 0 as there, a flat map the chance of
    a random token (the share of the tokens in the gold region), and a gold region that
    holds no token 0 (nothing can point into it; :func:`empty_regions` counts them).
    Quantus 0.6.0 counts a tie as a hit when any tied pixel is inside, so a flat map hits
    whenever the region is not empty, and an empty region as a hit.
    """
    tied = peak_tokens(heatmaps)
    inside = inside.to(device=tied.device, dtype=torch.bool)
    return (tied & inside).sum(dim=1).double() / tied.sum(dim=1).double()


def empty_regions(inside: Tensor) -> Tensor:
    """``[n]`` bool: the gold regions (``[n, N]`` bool) that hold no token: they score 0."""
    return ~inside.to(torch.bool).any(dim=1).cpu()


#: The pointing game's tie rule in words (the start of :func:`pointing_note`).
POINTING_RULE = ("pointing game: a tie for the peak is broken uniformly at random and a phrase "
                 "scores the expected hit, the share of the tied tokens in its gold region (a "
                 "flat map: the chance of a random token)")


def pointing_note(empty: int) -> str:
    """A table's note on the pointing game's tie rule, with the number of phrases whose gold
    region holds no token (``empty``)."""
    return f"{POINTING_RULE}; {empty} phrase(s) whose gold region holds no token score 0"


def pointing_hits(heatmaps: Tensor, geometry: Geometries, gold_boxes: Tensor) -> Tensor:
    """``[n]`` float64 in ``[0, 1]``: each heatmap's expected pointing-game hit
    (:func:`expected_hits`) on the tokens that look inside its gold box.

    Args:
        heatmaps: ``[n, N]`` over the token grid, row-major.
        geometry: the token geometry on the picture (one, or one per heatmap).
        gold_boxes: ``[n, 4]`` pixel boxes, or ``[n, K, 4]``: any of ``K`` boxes (NaN: none).
    """
    return expected_hits(heatmaps, tokens_in_boxes(geometry, gold_boxes.cpu()))


def peak_locations(heatmaps: Tensor, geometry: Geometries, boxes: Tensor) -> Tensor:
    """``[n, K + 2]`` float64: where each heatmap's peak lies among ``K`` candidate boxes, with
    the pointing game's tie rule (:func:`expected_hits`: the peak drawn uniformly among the
    tied maxima, :func:`peak_tokens`). Column ``k < K``: the share of the tied tokens whose
    centre lies in box ``k`` (the first box containing it); column ``K``: in none
    (elsewhere); column ``K + 1``: 1 for a flat heatmap (no peak; its other columns are 0).
    A map with one maximum puts all its weight on one column.

    Args:
        heatmaps: ``[n, N]`` over the token grid.
        geometry: the token geometry on the picture (one, or one per heatmap).
        boxes: ``[n, K, 4]`` pixel boxes per heatmap.
    """
    n, k = heatmaps.shape[0], boxes.shape[1]
    tied = peak_tokens(heatmaps).double()  # [n, N]
    centres = token_centres(geometry, n)  # [n, N, 2]
    inside = points_in_boxes(centres[:, :, None, :], boxes[:, None, :, :])  # [n, N, K]
    first = torch.where(inside, torch.arange(k), k).amin(dim=2)  # [n, N]: box, K elsewhere
    shares = (F.one_hot(first, k + 1).double() * tied[..., None]).sum(dim=1)
    shares = shares / tied.sum(dim=1, keepdim=True)
    flat = is_flat(heatmaps)
    shares[flat] = 0.0
    return torch.cat([shares, flat[:, None].double()], dim=1)


def pointing_game(heatmaps: Tensor, geometry: Geometries, gold_boxes: Tensor) -> float:
    """Pointing-game accuracy: the mean of :func:`pointing_hits`."""
    return float(pointing_hits(heatmaps, geometry, gold_boxes).mean())


def box_iou(a: Tensor, b: Tensor) -> Tensor:
    """``[n]`` IoU of the paired boxes ``a[i]``, ``b[i]`` (``[n, 4]`` each, ``x0, y0, x1,
    y1``). Empty boxes (zero union) have IoU 0."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    iw = (torch.minimum(a[:, 2], b[:, 2]) - torch.maximum(a[:, 0], b[:, 0])).clamp(min=0)
    ih = (torch.minimum(a[:, 3], b[:, 3]) - torch.maximum(a[:, 1], b[:, 1])).clamp(min=0)
    inter = iw * ih

    def area(x: Tensor) -> Tensor:
        return (x[:, 2] - x[:, 0]).clamp(min=0) * (x[:, 3] - x[:, 1]).clamp(min=0)

    union = area(a) + area(b) - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(union))


def grounding_scores(
    heatmaps: Tensor, geometry: Geometries, gold_boxes: Tensor, threshold: float = 0.5
) -> dict[str, float]:
    """Pointing game, mean IoU and hit@0.5 of heatmap boxes (ConceptOT Sec. 2.6).

    Args:
        heatmaps: ``[n, N]`` phrase heatmaps.
        geometry: the token geometry on the picture (one, or one per heatmap).
        gold_boxes: ``[n, 4]`` gold pixel boxes.
        threshold: fraction of the peak a patch must reach to join the predicted box.

    Returns:
        ``{"pointing", "mean_iou", "hit@0.5", "n"}``.
    """
    if heatmaps.shape[0] != gold_boxes.shape[0]:
        raise ValueError(f"{heatmaps.shape[0]} heatmaps but {gold_boxes.shape[0]} gold boxes")
    if heatmaps.shape[0] == 0:
        raise ValueError("no heatmaps")
    heat = heatmaps.detach().float().cpu()
    pred = heatmap_boxes(heat, geometry, threshold)
    iou = box_iou(pred, gold_boxes.cpu())
    return {
        "pointing": pointing_game(heat, geometry, gold_boxes),
        "mean_iou": float(iou.mean()),
        "hit@0.5": float((iou >= 0.5).double().mean()),
        "n": float(heat.shape[0]),
    }


def mean_offdiag_cosine(anchors: Tensor) -> float:
    """Mean cosine similarity between distinct anchors, ``1/(r(r-1)) sum_{i != j}
    cos(p_i, p_j)`` (ConceptOT Fig. 4 reports 0.19 for its 32 anchors; lower is more
    diverse)."""
    if anchors.dim() != 2 or anchors.shape[0] < 2:
        raise ValueError(f"need anchors [r >= 2, d], got {tuple(anchors.shape)}")
    p = F.normalize(anchors.detach().double(), dim=1)
    gram = p @ p.T
    r = p.shape[0]
    return float((gram.sum() - gram.diagonal().sum()) / (r * (r - 1)))
