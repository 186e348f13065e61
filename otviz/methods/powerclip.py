"""PowerCLIP: powerset alignment of region masks with parse-tree nodes (PowerCLIP Eq. 1-16).

Per pair: region embeddings pool the projected patches inside each region mask (Eq. 2),
phrase embeddings sum the normalised leaf embeddings of each tree node (Eq. 3-4), and the
local score is ``T2R + R2T`` by the NLAs (Eq. 16; NLA-T1 softplus, NLA-T2 tanh) or, with
``exact``, by enumerating the powerset (Eq. 6-7, at most 12 regions).

Defaults when the batch carries no structure: regions are ``rows x cols`` grid cells with at
most ``n_regions`` cells (:func:`otviz.regions.cell_layout`), nodes are the single content
tokens (PowerCLIP's "w/o parse trees" ablation, Table 6).

The plan (for heatmaps; PowerCLIP itself has none): each valid node B gets mass ``1/K``,
spread uniformly over its tokens and over the patches of its best-matching region subset
``A*_B = argmax_A Q_{A,B}``, taken as the union of its regions. The membership of region m in
``A*_B`` is ``1[q_mB > 0]`` in exact mode (Corollary 1) and ``sigmoid(q_mB / tau)`` with the
NLAs (the derivative of NLA-T1's ``tau softplus(q / tau)``: a soft version of the same set),
and the union is ``1 - prod_m (1 - membership_m R_mn)``. A node whose best subset is empty
(no region scores positively) keeps its mass out of the plan, which the marginals show.
The ``heatmap`` of a phrase therefore lights the patches of the best region subsets of the
nodes that contain its tokens, weighted by their share of those nodes.

``config.extra``: ``tau`` (1e-3), ``alpha`` (0.75), ``exact`` (False), ``n_regions`` (9),
``gamma`` (triplet margin of :meth:`PowerCLIP.powerset_loss`, 0.2; the paper gives none).
Note the local score is a sum of region-phrase cosines, not a cosine: its scale grows with
the numbers of regions and leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from otviz.methods.base import Alignment, DensePlan, PairBatch, register
from otviz.methods.projected import ProjectedMethod, build_alignment
from otviz.ot.powerset import (
    exact_t2r,
    phrase_embeddings,
    powerset_similarity,
    region_embeddings,
    region_node_scores,
    triplet_loss,
)
from otviz.regions import cell_layout, grid_cells


@dataclass
class PowersetInputs:
    """Region and phrase embeddings of a batch with their masks."""

    regions: Tensor  # [B, R, N] bool
    region_emb: Tensor  # [B, R, d]
    region_mask: Tensor  # [B, R] bool
    nodes: Tensor  # [B, K, M] bool
    node_mask: Tensor  # [B, K] bool
    phrase_emb: Tensor  # [B, K, d]


def default_regions(batch: PairBatch, n_regions: int) -> Tensor:
    """``[B, R, N]`` grid cells (at most ``n_regions``) of the batch's patch grid."""
    cells = grid_cells(batch.grid, *cell_layout(batch.grid, n_regions))
    return cells.to(batch.patch_mask.device)[None].expand(batch.size, -1, -1)


def default_nodes(batch: PairBatch) -> tuple[Tensor, Tensor]:
    """One node per content token: ``([B, M, M] nodes, [B, M] node mask)``."""
    m = batch.token_mask.shape[1]
    eye = torch.eye(m, dtype=torch.bool, device=batch.token_mask.device)
    return eye[None] & batch.token_mask[:, :, None], batch.token_mask


@register
class PowerCLIP(ProjectedMethod):
    """Powerset alignment (PowerCLIP)."""

    name = "powerclip"
    paper = "PowerCLIP Eq. 1-16"

    @property
    def tau(self) -> float:
        return float(self.config.extra.get("tau", 1e-3))

    @property
    def alpha(self) -> float:
        return float(self.config.extra.get("alpha", 0.75))

    @property
    def exact(self) -> bool:
        return bool(self.config.extra.get("exact", False))

    def inputs(self, batch: PairBatch) -> PowersetInputs:
        """Region / phrase embeddings (Eq. 2-4) with the documented defaults."""
        z, y = self.project(batch)
        regions = batch.regions
        if regions is None:
            regions = default_regions(batch, int(self.config.extra.get("n_regions", 9)))
        regions = regions & batch.patch_mask[:, None, :]
        if batch.nodes is None:
            nodes, node_mask = default_nodes(batch)
        else:
            nodes = batch.nodes & batch.token_mask[:, None, :]
            node_mask = batch.node_mask if batch.node_mask is not None else nodes.any(-1)
            node_mask = node_mask & nodes.any(-1)
        region_emb, region_mask = region_embeddings(z, regions)
        phrase = phrase_embeddings(y, nodes, node_mask, batch.token_mask)
        return PowersetInputs(regions, region_emb, region_mask, nodes, node_mask, phrase)

    def _membership(self, q: Tensor, inp: PowersetInputs) -> tuple[Tensor, Tensor]:
        """``[B, K, R]`` membership of each region in each node's best subset and the
        ``[B, K]`` best-subset score per node (exact: ``max_A Q_AB``; NLA: its soft max)."""
        rmask = inp.region_mask[:, None, :].to(q.dtype)
        if self.exact:
            t2r_best = exact_t2r(q, inp.region_mask, inp.node_mask)[1]
            member = t2r_best.to(q.dtype)
            best = (member * q.transpose(1, 2)).sum(-1)
        else:
            qt = q.transpose(1, 2)
            member = torch.sigmoid(qt / self.tau) * rmask
            best = (self.tau * torch.nn.functional.softplus(qt / self.tau) * rmask).sum(-1)
        return member, best

    def _plan(self, inp: PowersetInputs, member: Tensor) -> Tensor:
        """``[B, N, M]`` plan described in the module docstring."""
        dtype = member.dtype
        regions = inp.regions.to(dtype)  # [B, R, N]
        miss = 1.0 - member[..., None] * regions[:, None]  # [B, K, R, N]
        cover = 1.0 - miss.prod(2)  # [B, K, N] soft union of the chosen regions
        patch_dist = cover / cover.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        nodes = inp.nodes.to(dtype)
        token_dist = nodes / nodes.sum(-1, keepdim=True).clamp_min(1.0)
        k_valid = inp.node_mask.to(dtype).sum(-1, keepdim=True).clamp_min(1.0)
        weight = inp.node_mask.to(dtype) * member.amax(-1) / k_valid  # [B, K]
        return patch_dist.transpose(1, 2) @ (weight[..., None] * token_dist)

    def align(self, batch: PairBatch) -> Alignment:
        inp = self.inputs(batch)
        q = region_node_scores(inp.region_emb, inp.phrase_emb)  # [B, R, K]
        score = powerset_similarity(
            q, self.tau, self.alpha, inp.region_mask, inp.node_mask, self.exact
        )
        member, best = self._membership(q, inp)
        plan = self._plan(inp, member)
        extras = {
            "regions": inp.regions,
            "region_mask": inp.region_mask,
            "nodes": inp.nodes,
            "node_mask": inp.node_mask,
            "region_node_scores": q,
            "node_best_regions": member,
            "node_best_score": best,
            "exact": self.exact,
        }
        return build_alignment(
            batch,
            DensePlan(plan),
            score,
            row_marginal=plan.sum(2),
            col_marginal=plan.sum(1),
            extras=extras,
        )

    def powerset_loss(self, batch: PairBatch) -> Tensor:
        """Triplet loss ``Phi(S) + Phi(S^T)`` (Eq. 8-9, 16) over the ``C x C`` similarity of
        the batch's images and captions (pair i matched with pair i)."""
        inp = self.inputs(batch)
        q = region_node_scores(inp.region_emb[:, None], inp.phrase_emb[None])  # [C, C, R, K]
        sim = powerset_similarity(
            q,
            self.tau,
            self.alpha,
            inp.region_mask[:, None, :],
            inp.node_mask[None, :, :],
            self.exact,
        )
        return triplet_loss(sim, float(self.config.extra.get("gamma", 0.2)))
