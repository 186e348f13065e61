"""What the "Phrases & regions" view reads off one PowerCLIP alignment: the region-node
scores, the exact best region subset of every node next to PowerCLIP's soft one, and the
exact T2R / R2T aggregations next to their NLA approximations (PowerCLIP Eq. 6-7, 14-16,
Theorem 1, Eq. 78), so the view only draws."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from otviz.methods.base import Alignment
from otviz.ot.powerset import (
    MAX_EXACT_REGIONS,
    exact_r2t,
    exact_t2r,
    nla_t1,
    nla_t2,
    powerset_scores,
)


def powerset_summary(
    q: Tensor, region_mask: Tensor, node_mask: Tensor, tau: float, alpha: float
) -> dict[str, float | None]:
    """Exact T2R / R2T (enumerated powerset; ``None`` above :data:`MAX_EXACT_REGIONS`
    regions), NLA-T1 / NLA-T2 at ``tau`` and ``alpha``, the Theorem 1 bound
    ``tau * M * log 2`` and the Eq. 78 bracket ``Lambda(0) = max_B Q_{all,B} / 2``,
    ``Lambda(1) = max_{A,B} Q_{A,B}`` of R2T, all from one ``q [1, R, K]``."""
    m = int(region_mask.sum())
    out: dict[str, float | None] = {
        "M": m,
        "tau": tau,
        "alpha": alpha,
        "nla_t1": float(nla_t1(q, tau, region_mask, node_mask)[0]),
        "nla_t2": float(nla_t2(q, tau, alpha, region_mask, node_mask)[0]),
        "t1_bound": tau * m * math.log(2.0),
        "t2r": None,
        "r2t": None,
        "lambda0": None,
        "lambda1": None,
    }
    if q.shape[-2] <= MAX_EXACT_REGIONS:
        qa = powerset_scores(q, region_mask)[0][:, node_mask[0]]  # [2^R, K_valid]
        out["t2r"] = float(exact_t2r(q, region_mask, node_mask)[0][0])
        out["r2t"] = float(exact_r2t(q, region_mask, node_mask)[0])
        out["lambda0"] = float(qa[-1].max()) / 2.0
        out["lambda1"] = float(qa.max())
    return out


@dataclass
class PowersetReadout:
    """One pair's PowerCLIP alignment as the view reads it.

    Attributes:
        node_mask: ``[K]`` bool, the nodes that kept a token.
        regions: ``[R, N]`` bool region masks.
        q: ``[R, K]`` region-node scores.
        exact_best: ``[K, R]`` bool exact best subsets ``argmax_A Q_{A,B}`` (``None`` above
            :data:`MAX_EXACT_REGIONS` regions).
        soft_best: ``[K, R]`` the method's memberships.
        best_score: ``[K]`` the method's best-subset score of each node.
        cover: ``[K, N]`` soft union of each node's chosen regions over the tokens.
        phrase_map: ``[K, N]`` each node's phrase map (Fig. 6 similarity on its chosen
            regions, :func:`otviz.methods.powerclip.phrase_maps`).
        summary: :func:`powerset_summary` at the requested ``tau``.
    """

    node_mask: Tensor
    regions: np.ndarray
    q: np.ndarray
    exact_best: np.ndarray | None
    soft_best: np.ndarray
    best_score: np.ndarray
    cover: np.ndarray
    phrase_map: np.ndarray
    summary: dict[str, float | None]


def powerset_readout(alignment: Alignment, tau: float, alpha: float) -> PowersetReadout:
    """The :class:`PowersetReadout` of the first pair of a PowerCLIP ``alignment`` (its
    ``extras``), the NLA column of the summary at ``tau`` and ``alpha``."""
    extras = alignment.extras
    q, region_mask = extras["region_node_scores"], extras["region_mask"]
    node_mask = extras["node_mask"]
    exact_best = None
    if q.shape[-2] <= MAX_EXACT_REGIONS:
        exact_best = exact_t2r(q, region_mask, node_mask)[1][0].numpy()
    return PowersetReadout(
        node_mask=node_mask[0],
        regions=extras["regions"][0].numpy(),
        q=q[0].double().numpy(),
        exact_best=exact_best,
        soft_best=extras["node_best_regions"][0].double().numpy(),
        best_score=extras["node_best_score"][0].double().numpy(),
        cover=extras["node_subset_cover"][0].double().numpy(),
        phrase_map=extras["node_patch_maps"][0].double().numpy(),
        summary=powerset_summary(q, region_mask, node_mask, tau, alpha),
    )
