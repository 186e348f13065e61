"""PowerCLIP powerset aggregations (PowerCLIP Eq. 5-7, 11-16, App. A-B).

The exact region-set-to-tree (R2T, Eq. 6/42) and tree-to-region-set (T2R, Eq. 7/21)
aggregations by enumerating the powerset of the region masks, and their linear-time
Non-Linear Aggregator approximations NLA-T1 (Eq. 14, Theorem 1) and NLA-T2 (Eq. 15, Theorem 2).

Every aggregator takes the region-node score tensor ``q [..., R, K]`` with
``q[..., m, B] = <phi(I | R_m), p_B>`` (Eq. 18, the bilinear expansion of Eq. 5:
``Q_{A,B} = sum_{m in A} q[m, B]``; the embeddings and the triplet loss live in
:mod:`otviz.methods.powerclip`) and optional validity masks ``region_mask [..., R]`` and
``node_mask [..., K]`` (broadcastable), so the same code scores a batch of pairs
(``[B, R, K]``) or a whole ``C x C`` similarity matrix (``[C, C, R, K]``).

Masked regions count as absent: for the exact aggregators a padded region contributes
``q = 0`` and only duplicates every subset ``2^{#pad}`` times, which changes neither a maximum
nor the subset average; the NLAs drop its terms explicitly. Masked nodes are excluded from
every maximum, sum and node count ``K_j``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

MAX_EXACT_REGIONS = 12


def _mask_regions(q: Tensor, region_mask: Tensor | None) -> Tensor:
    return q if region_mask is None else q * region_mask[..., :, None].to(q.dtype)


def _node_mean(x: Tensor, node_mask: Tensor | None) -> Tensor:
    """Mean of ``x [..., K]`` over valid nodes (0 when a tree has none)."""
    if node_mask is None:
        return x.mean(-1)
    w = node_mask.to(x.dtype).expand_as(x)
    return (x * w).sum(-1) / w.sum(-1).clamp_min(1.0)


def _subset_indicators(n_regions: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """``[2^R, R]`` 0/1 rows: row ``s`` is the subset whose members are the set bits of ``s``
    (row 0 is the empty set)."""
    if n_regions > MAX_EXACT_REGIONS:
        raise ValueError(
            f"exact powerset enumeration supports at most {MAX_EXACT_REGIONS} regions, got "
            f"{n_regions}; use the NLA approximations (nla_t1 / nla_t2)"
        )
    s = torch.arange(2**n_regions)
    return ((s[:, None] >> torch.arange(n_regions)) & 1).to(dtype)


def powerset_scores(q: Tensor, region_mask: Tensor | None = None) -> Tensor:
    """All ``Q_{A,B} = <r_A, p_B> = sum_{m in A} q[m, B]`` (Eq. 1, 5, 19): ``[..., 2^R, K]``."""
    q = _mask_regions(q, region_mask)
    return _subset_indicators(q.shape[-2], q.dtype).to(q.device) @ q


def exact_t2r(
    q: Tensor, region_mask: Tensor | None = None, node_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Exact T2R similarity (Eq. 7/21-22): mean over nodes of the best region subset's score.

    Returns:
        ``(score [...], best [..., K, R] bool)``: the score and, per node, the members of its
        best-matching subset (``argmax_A Q_{A,B}``; by Corollary 1 the regions with
        ``q[m, B] > 0``).
    """
    qa = powerset_scores(q, region_mask)
    best_val, best_idx = qa.max(-2)
    best = _subset_indicators(q.shape[-2]).to(q.device)[best_idx].bool()
    if region_mask is not None:
        best = best & region_mask[..., None, :]
    return _node_mean(best_val, node_mask), best


def exact_r2t(
    q: Tensor, region_mask: Tensor | None = None, node_mask: Tensor | None = None
) -> Tensor:
    """Exact R2T similarity (Eq. 42-43): ``2^{-M} sum_A max_B Q_{A,B}``.

    The main text's Eq. 6 prints the normaliser as ``1/(2M)``; App. B (Eq. 42) and the
    Jensen bound Eq. 78 require ``1/2^M``, the mean over subsets, which is used here.
    """
    qa = powerset_scores(q, region_mask)
    if node_mask is not None:
        qa = qa.masked_fill(~node_mask[..., None, :], -torch.inf)
    best = qa.amax(-1)
    best = torch.where(torch.isfinite(best), best, torch.zeros_like(best))  # tree without nodes
    return best.mean(-1)


def nla_t1(
    q: Tensor, tau: float, region_mask: Tensor | None = None, node_mask: Tensor | None = None
) -> Tensor:
    """NLA-T1 (Eq. 11-14, softplus): ``mean_B sum_m tau * softplus(q[m, B] / tau)``.

    Equals ``mean_B tau * log sum_A exp(Q_{A,B} / tau)`` (App. A, Eq. 39), so it exceeds the
    exact T2R by at most ``tau * M * log 2`` (Theorem 1); ``tau -> 0`` is exact (Cor. 1).
    """
    s1 = tau * F.softplus(q / tau)
    if region_mask is not None:
        s1 = s1 * region_mask[..., :, None].to(q.dtype)
    return _node_mean(s1.sum(-2), node_mask)


def _log_cosh(x: Tensor) -> Tensor:
    """Overflow-free ``log cosh x = |x| + log(1 + exp(-2|x|)) - log 2``."""
    ax = x.abs()
    return ax + F.softplus(-2.0 * ax) - math.log(2.0)


def nla_t2(
    q: Tensor,
    tau: float,
    alpha: float,
    region_mask: Tensor | None = None,
    node_mask: Tensor | None = None,
) -> Tensor:
    """NLA-T2 (Eq. 11-13, 15, tanh): with ``zeta_alpha(x) = x + alpha log cosh x``,
    ``S3 = tau * log(K^{alpha-1} sum_B exp(sum_m zeta_alpha(q[m, B] / (2 tau))))``.

    Evaluated in the log domain (the exp of layer 2 is folded into a log-sum-exp). It lies
    within ``[Lambda(alpha) - tau Z, Lambda(alpha) + tau alpha log K]`` (Eq. 76) of the
    interpolant ``Lambda(alpha)`` (Eq. 47), and ``Lambda(0) <= R2T <= Lambda(1)`` (Eq. 78).
    """
    x = q / (2.0 * tau)
    s1 = x + alpha * _log_cosh(x)
    if region_mask is not None:
        s1 = s1 * region_mask[..., :, None].to(q.dtype)
    log_s2 = s1.sum(-2)  # [..., K], log of layer 2's output
    if node_mask is None:
        n_nodes = torch.full_like(log_s2[..., 0], log_s2.shape[-1])
    else:
        node_mask = node_mask.expand_as(log_s2)
        log_s2 = log_s2.masked_fill(~node_mask, -torch.inf)
        n_nodes = node_mask.to(q.dtype).sum(-1)
    lse = torch.logsumexp(log_s2, dim=-1)
    out = tau * (lse - (1.0 - alpha) * torch.log(n_nodes.clamp_min(1.0)))
    return torch.where(n_nodes > 0, out, torch.zeros_like(out))


def powerset_similarity(
    q: Tensor,
    tau: float = 1e-3,
    alpha: float = 0.75,
    region_mask: Tensor | None = None,
    node_mask: Tensor | None = None,
    exact: bool = False,
) -> Tensor:
    """``Q = R2T + T2R`` (Sec. 3.4, exact) or ``S = NLA-T1 + NLA-T2`` (Eq. 16)."""
    if exact:
        return exact_r2t(q, region_mask, node_mask) + exact_t2r(q, region_mask, node_mask)[0]
    return nla_t1(q, tau, region_mask, node_mask) + nla_t2(q, tau, alpha, region_mask, node_mask)
