"""Image-text retrieval metrics: Recall@K both ways and the two-stage protocol of ConceptOT
App. G.4 (global top-k candidates, then rerank by ``g + lambda_l * s_l``).

Scores are ``[n_images, n_texts]``. Ground truth is either the 1:1 diagonal (square scores)
or, as for COCO's five captions per image, ``gt[i]`` = the text ids of image ``i``; every
text must belong to at least one image and every image must have at least one text.

Ties are counted against the match (pessimistic): a non-matching candidate scoring exactly
as high as the best match ranks above it. That keeps degenerate scorers (constant scores)
at zero rather than at a lucky R@1, and makes ``-inf`` non-candidates unretrievable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from otviz.methods.base import no_alignment

GroundTruth = Sequence[Sequence[int]] | None
LocalScoreFn = Callable[[Tensor, Tensor], Tensor]
DIRECTIONS = ("i2t", "t2i")


def relevance(gt: GroundTruth, n_images: int, n_texts: int) -> Tensor:
    """``[n_images, n_texts]`` bool: True where text ``t`` describes image ``i``.

    ``gt=None`` means the diagonal (``n_images == n_texts``); otherwise ``gt[i]`` lists the
    text ids of image ``i``. Raises ``ValueError`` for out-of-range ids, an image with no
    text or a text with no image."""
    if gt is None:
        if n_images != n_texts:
            raise ValueError(
                f"1:1 ground truth needs square scores, got {n_images} images x {n_texts} texts"
            )
        return torch.eye(n_images, dtype=torch.bool)
    if len(gt) != n_images:
        raise ValueError(f"ground truth lists {len(gt)} images, scores have {n_images}")
    rel = torch.zeros(n_images, n_texts, dtype=torch.bool)
    for i, texts in enumerate(gt):
        ids = torch.as_tensor(list(texts), dtype=torch.long)
        if ids.numel() == 0:
            raise ValueError(f"image {i} has no matching text")
        if ids.min() < 0 or ids.max() >= n_texts:
            raise ValueError(f"image {i}: text ids outside [0, {n_texts})")
        rel[i, ids] = True
    orphans = (~rel.any(0)).nonzero().flatten()
    if orphans.numel():
        raise ValueError(f"texts {orphans[:5].tolist()} belong to no image")
    return rel


def match_ranks(scores: Tensor, rel: Tensor, chunk: int = 1024) -> Tensor:
    """``[n_queries]`` 0-based rank of each row's best relevant column: the number of
    non-relevant columns scoring at least as high (ties against the match)."""
    ranks = []
    for s in range(0, scores.shape[0], chunk):
        sc, r = scores[s : s + chunk], rel[s : s + chunk].to(scores.device)
        best = sc.masked_fill(~r, float("-inf")).amax(dim=1, keepdim=True)
        ranks.append(((sc >= best) & ~r).sum(dim=1))
    return torch.cat(ranks).cpu()


def recall_at_k(
    scores: Tensor,
    gt: GroundTruth = None,
    ks: Sequence[int] = (1, 5, 10),
    directions: Sequence[str] = DIRECTIONS,
) -> dict[str, float]:
    """Recall@K (ConceptOT App. G.4) as fractions in [0, 1].

    Image->text (``i2t``): a hit when any of the image's texts is among its top K texts.
    Text->image (``t2i``): a hit when the text's image is among its top K images.

    Args:
        scores: ``[n_images, n_texts]`` similarity (higher is better; ``-inf`` allowed).
        gt: ``None`` for 1:1 (diagonal), else ``gt[i]`` = text ids of image ``i``.
        ks: the cut-offs K.
        directions: which of ``"i2t"``, ``"t2i"`` to compute.

    Returns:
        ``{"i2t_r1": ..., "i2t_r5": ..., "t2i_r1": ..., ...}``.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be [n_images, n_texts], got {tuple(scores.shape)}")
    unknown = set(directions) - set(DIRECTIONS)
    if unknown:
        raise ValueError(f"unknown directions {sorted(unknown)}; use {DIRECTIONS}")
    scores = scores.detach().float()
    if torch.isnan(scores).any():
        raise ValueError("scores contain NaN (a NaN would rank as a hit)")
    rel = relevance(gt, *scores.shape)
    out: dict[str, float] = {}
    for name in directions:
        ranks = match_ranks(scores, rel) if name == "i2t" else match_ranks(scores.T, rel.T)
        for k in ks:
            out[f"{name}_r{k}"] = float((ranks < k).float().mean())
    return out


def candidate_mask(global_scores: Tensor, k: int, direction: str) -> Tensor:
    """``[n_images, n_texts]`` bool: the global top-``k`` texts of every image (``"i2t"``)
    or the global top-``k`` images of every text (``"t2i"``)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    s = global_scores if direction == "i2t" else global_scores.T
    top = s.topk(min(k, s.shape[1]), dim=1).indices
    mask = torch.zeros_like(s, dtype=torch.bool).scatter_(1, top, True)
    return mask if direction == "i2t" else mask.T


def local_scores_at(
    mask: Tensor, local_score_fn: LocalScoreFn, chunk_size: int | None = None
) -> Tensor:
    """``[n_images, n_texts]`` float: ``local_score_fn`` at the True pairs of ``mask`` (NaN
    elsewhere). The pairs go to ``local_score_fn(image_idx [P], text_idx [P]) -> [P]`` in
    one batched call, or in calls of ``chunk_size`` pairs (memory), never one by one."""
    image_idx, text_idx = mask.nonzero(as_tuple=True)
    step = chunk_size or max(1, image_idx.numel())
    parts = []
    for s in range(0, image_idx.numel(), step):
        i, t = image_idx[s : s + step], text_idx[s : s + step]
        out = local_score_fn(i, t)
        if out.shape != i.shape:
            raise ValueError(f"local_score_fn returned {tuple(out.shape)} for {i.numel()} pairs")
        parts.append(out.detach().float().cpu())
    local = torch.full(mask.shape, float("nan"))
    if parts:
        local[image_idx, text_idx] = torch.cat(parts)
    return local


def rerank(
    global_scores: Tensor, local: Tensor, candidates: Tensor, lambda_l: float
) -> Tensor:
    """``g + lambda_l * s_l`` on the candidates, ``-inf`` elsewhere (ConceptOT App. G.4) and
    at a pair with nothing to align (an empty caption or patch set, scored
    :data:`otviz.methods.base.NO_ALIGNMENT`), so it ranks last at every ``lambda_l``."""
    combined = global_scores.detach().float().cpu() + lambda_l * local
    return combined.masked_fill(~candidates | no_alignment(local), float("-inf"))


def two_stage_rerank(
    global_scores: Tensor,
    local_score_fn: LocalScoreFn,
    k: int,
    lambda_l: float,
    direction: str = "i2t",
    chunk_size: int | None = None,
) -> Tensor:
    """Two-stage retrieval of ConceptOT App. G.4 for one direction.

    Stage 1 keeps the global top-``k`` candidates of every query (rows for ``"i2t"``,
    columns for ``"t2i"``); stage 2 scores only those pairs with the local score and ranks
    them by ``s = g + lambda_l * s_l``.

    Args:
        global_scores: ``[n_images, n_texts]`` global cosine ``g``.
        local_score_fn: ``(image_idx [P], text_idx [P]) -> s_l [P]``, called batched.
        k: candidates per query (128 in the paper).
        lambda_l: local weight.
        direction: ``"i2t"`` or ``"t2i"``.
        chunk_size: pairs per call of ``local_score_fn`` (``None``: all in one call).

    Returns:
        ``[n_images, n_texts]`` reranked scores, ``-inf`` at non-candidates (so they rank
        below every candidate).
    """
    mask = candidate_mask(global_scores, k, direction)
    return rerank(global_scores, local_scores_at(mask, local_score_fn, chunk_size), mask, lambda_l)


def two_stage_recall(
    global_scores: Tensor,
    local_score_fn: LocalScoreFn,
    k: int,
    lambda_l: float,
    gt: GroundTruth = None,
    ks: Sequence[int] = (1, 5, 10),
    chunk_size: int | None = None,
) -> dict[str, float]:
    """Recall@K both ways under the two-stage protocol (ConceptOT App. G.4).

    The local score is computed once for the union of both directions' candidate pairs,
    then each direction is reranked among its own candidates."""
    masks = {d: candidate_mask(global_scores, k, d) for d in DIRECTIONS}
    local = local_scores_at(masks["i2t"] | masks["t2i"], local_score_fn, chunk_size)
    out: dict[str, float] = {}
    for d, mask in masks.items():
        out |= recall_at_k(rerank(global_scores, local, mask, lambda_l), gt, ks, (d,))
    return out
