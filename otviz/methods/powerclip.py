"""PowerCLIP: powerset alignment of region masks with parse-tree nodes (PowerCLIP Eq. 1-16).

Per pair: region embeddings pool the projected patches inside each region mask (Eq. 2),
phrase embeddings sum the normalised leaf embeddings of each tree node (Eq. 3-4), and the
powerset score is ``T2R + R2T`` by the NLAs (Eq. 16; NLA-T1 softplus, NLA-T2 tanh) or, with
``exact``, by enumerating the powerset (Eq. 6-7, at most 12 regions); the aggregations live
in :mod:`otviz.ot.powerset`, the embeddings and the triplet loss here.

Region proposals when the batch carries none (``config.extra["proposals"]``): ``"grid"``
cells (at most ``n_regions``, :func:`otviz.patch_grid.masks.cell_layout`) or ``"boxes"``, the
PowerCLIP-R random boxes it trains on (Sec. 3.2, ``n_regions`` boxes, 5 to 15 as in Sec. 4
and Table 7, drawn with ``proposal_seed``, the same boxes for every image of the batch).
Picture-dependent regions (superpixels, SAM: :mod:`otviz.patch_grid.masks`,
:mod:`otviz.patch_grid.sam`) come with the batch (``PairBatch.regions``). A trained head records
``"boxes"`` (:meth:`otviz.train.config.TrainConfig.method_config`); a head without the key
uses the grid. Nodes default to the single content tokens (the "w/o parse trees" ablation,
Table 6).

Scores. The powerset score is a sum of region-phrase inner products, not a cosine: with
``R`` regions and phrase norms ``||p_B||`` (a node of ``L`` leaves has norm up to ``L``) it
lies in ``[-S_max, S_max]``, ``S_max = R (mean_B ||p_B|| + max_B ||p_B||)`` (every
``q_mB`` at its Cauchy-Schwarz bound ``||p_B||``; T2R is at most ``R mean_B ||p_B||`` and
R2T at most ``R max_B ||p_B||``). ``Alignment.local_score`` is ``S / S_max``, on the
cosine-like scale of the other methods, wherever it is combined with ``s_g`` or compared;
``extras["raw_local_score"]`` keeps ``S``. Training uses the raw ``S`` (Eq. 8-9).

Phrase map of a node ``B`` (:meth:`PowerCLIP.phrase_patch_map`, used by the grounding eval
and the views): Fig. 6's text-to-patch similarity of the phrase, ``s_B(n) = <v_n / ||v_n||,
p_B>`` (Eq. 10's region-node score of one-patch regions, under the head's projections),
weighted by the membership of the region subset the powerset alignment selected for ``B``:
``map_B(n) = (s_B(n) - min_n' s_B(n')) u_B(n)`` with the soft union ``u_B(n) = 1 - prod_m
(1 - a_mB R_mn)`` of ``B``'s best subset ``A*_B = argmax_A Q_{A,B}``, ``a_mB = sigma(q_mB /
tau)`` (the derivative of NLA-T1's ``tau softplus(q / tau)``; ``1[q_mB > 0]`` in exact mode,
Corollary 1). Fig. 6 draws ``s_B`` (the phrase decides where it peaks); the alignment
decides which regions carry it (Sec. 3.2: the phrase is matched to a subset of regions). A
node whose best subset is empty (every ``a_mB`` below :data:`EMPTY_SUBSET`: no region
matches) keeps ``s_B`` unweighted (``u_B = 1``), which the views label "Fig. 6 sim.". A
phrase uses the tree node whose token set overlaps its tokens best (Jaccard; the phrase's
own node when it is one).

The plan (for the plan views; PowerCLIP itself has none): each valid node B gets mass
``max_m membership_mB / K``, spread uniformly over its tokens and over the soft union
``1 - prod_m (1 - membership_mB R_mn)`` of its best subset's regions; a node whose best
subset is empty keeps its mass out of the plan, which the marginals show.

``config.extra``: ``tau`` (1e-3), ``alpha`` (0.75), ``exact`` (False), ``n_regions`` (9),
``proposals`` ("grid"), ``proposal_seed`` (0), ``gamma`` (triplet margin, 0.2; the paper
gives none) and ``negatives`` ("hardest", Eq. 9, or "all": see :func:`triplet_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.knobs import TRIPLET_NEGATIVES
from otviz.methods.base import POWERSET_TRIPLET, Alignment, DensePlan, PairBatch, register
from otviz.methods.projected import ProjectedMethod, build_alignment
from otviz.ot.powerset import exact_t2r, powerset_similarity
from otviz.patch_grid.masks import cell_layout, grid_cells, paper_boxes

PROPOSALS = ("grid", "boxes")

def region_embeddings(patches: Tensor, regions: Tensor) -> tuple[Tensor, Tensor]:
    """Per-region embeddings ``phi(I | R_m) = r_m / ||r_m||``, ``r_m = sum_n R_mn v_n`` (Eq. 2).

    Args:
        patches: ``[B, N, d]`` (projected) patch embeddings ``v_n``.
        regions: ``[B, R, N]`` bool region masks; an empty mask is an absent region.

    Returns:
        ``([B, R, d] embeddings (zero for empty regions), [B, R] bool validity)``.
    """
    valid = regions.any(-1)
    pooled = regions.to(patches.dtype) @ patches
    return F.normalize(pooled, dim=-1) * valid[..., None].to(patches.dtype), valid


def leaf_partition(nodes: Tensor, token_mask: Tensor | None = None) -> Tensor:
    """``[B, M, M]`` bool: tokens ``m, m'`` lie in the same leaf token mask ``P_{m'}``.

    A leaf is a maximal group of tokens that belong to exactly the same tree nodes (the atoms
    of the node sets). With word-level pre-terminal nodes a leaf is one word (all its BPE
    tokens); with phrase-level leaves, e.g. an NP "a dog" without word nodes, the leaf is the
    phrase, as in PowerCLIP's example (Sec. 3.3). Tokens in no node belong to no leaf.

    Args:
        nodes: ``[B, K, M]`` bool token sets of the (valid) tree nodes.
        token_mask: optional ``[B, M]`` bool validity of tokens.
    """
    member = nodes if token_mask is None else nodes & token_mask[:, None, :]
    sig = member.transpose(1, 2).to(torch.float64)  # [B, M, K] node memberships per token
    shared = sig @ sig.transpose(1, 2)  # common memberships
    count = sig.sum(-1)
    covered = count > 0
    same = (shared == count[:, :, None]) & (shared == count[:, None, :])
    return same & covered[:, :, None] & covered[:, None, :]


def phrase_embeddings(
    tokens: Tensor,
    nodes: Tensor,
    node_mask: Tensor | None = None,
    token_mask: Tensor | None = None,
) -> Tensor:
    """Phrase embeddings ``p_B = sum_{P_m' in Leaf(B)} psi(T | P_m')`` (Eq. 3) with
    ``psi(T | P) = p / ||p||``, ``p = sum_{n in P} t_n`` (Eq. 4); leaves from
    :func:`leaf_partition`.

    Args:
        tokens: ``[B, M, d]`` (projected) token embeddings.
        nodes: ``[B, K, M]`` bool token sets of the tree nodes.
        node_mask: optional ``[B, K]`` bool, True for real nodes.
        token_mask: optional ``[B, M]`` bool, True for real tokens.

    Returns:
        ``[B, K, d]`` phrase embeddings (zero for masked or empty nodes).
    """
    if node_mask is not None:
        nodes = nodes & node_mask[:, :, None]
    if token_mask is not None:
        nodes = nodes & token_mask[:, None, :]
    same = leaf_partition(nodes).to(tokens.dtype)  # [B, M, M]
    leaf_psi = F.normalize(same @ tokens, dim=-1)  # psi of each token's leaf, [B, M, d]
    leaf_size = same.sum(-1).clamp_min(1.0)
    # every token of a leaf carries 1/|leaf| of the leaf's psi, so each leaf counts once
    return nodes.to(tokens.dtype) @ (leaf_psi / leaf_size[..., None])


def region_node_scores(region_emb: Tensor, phrase_emb: Tensor) -> Tensor:
    """``q[..., m, B] = <phi(I | R_m), p_B>`` (Eq. 10 summed over the leaves of B, Eq. 18).

    Shapes broadcast like ``matmul``: ``[B, R, d] x [B, K, d] -> [B, R, K]`` for pairs, or
    ``region_emb[:, None]`` against ``phrase_emb[None]`` for a ``[C, C, R, K]`` matrix.
    """
    return region_emb @ phrase_emb.transpose(-1, -2)


def triplet_loss(
    sim: Tensor, gamma: float, negatives: str = "hardest", excluded: Tensor | None = None
) -> Tensor:
    """``Phi_gamma(X) + Phi_gamma(X^T)`` (Eq. 8) for ``[..., C, C]`` similarity matrices
    whose diagonals hold the matched pairs.

    ``negatives="hardest"`` is Eq. 9: the mean over rows of the hinge on the hardest
    negative. ``"all"`` averages the hinge over every negative of the row instead (the
    "sum of hinges" of VSE++, Faghri et al. 2018, normalised by the count): on a frozen
    backbone the hardest-negative form collapses to the trivial solution (all ``q < 0``,
    scores constant, loss ``2 gamma``), which the mean over negatives avoids.

    Args:
        sim: ``[..., C, C]`` similarities, matched pairs on the diagonal.
        gamma: margin.
        negatives: ``"hardest"`` or ``"all"``.
        excluded: optional ``[C, C]`` bool, pairs that are no negatives (duplicate
            captions or images; the diagonal is always excluded).
    """
    if negatives not in TRIPLET_NEGATIVES:
        raise ValueError(f"negatives must be one of {TRIPLET_NEGATIVES}, got {negatives!r}")
    eye = torch.eye(sim.shape[-1], dtype=torch.bool, device=sim.device)
    skip = eye if excluded is None else eye | excluded.to(sim.device)

    def phi(x: Tensor, skip: Tensor) -> Tensor:
        diag = x.diagonal(dim1=-2, dim2=-1)[..., None]
        if negatives == "hardest":
            hardest = x.masked_fill(skip, -torch.inf).amax(-1, keepdim=True)
            return F.relu(hardest - diag + gamma)[..., 0].mean(-1)
        hinge = F.relu(x - diag + gamma).masked_fill(skip, 0.0)
        count = (~skip).sum(-1).clamp_min(1)
        return (hinge.sum(-1) / count).mean(-1)

    return phi(sim, skip) + phi(sim.transpose(-1, -2), skip.transpose(-1, -2))


def _of_best_node(alignment: Alignment, token_select: Tensor, key: str) -> Tensor:
    """``[B, N]`` row of the ``[B, K, N]`` extra ``key`` at the node that best matches
    ``token_select`` (``[B, M]`` or ``[M]``, :func:`best_node`)."""
    ex = alignment.extras
    sel = token_select.bool() & alignment.token_mask.bool()  # [M] broadcasts to [B, M]
    node = best_node(ex["nodes"], ex["node_mask"], sel)
    rows = ex[key]
    return rows[torch.arange(rows.shape[0], device=rows.device), node]


#: A membership map whose peak is below this has an empty best subset (no region chosen).
EMPTY_SUBSET = 1e-6


def subset_cover(member: Tensor, regions: Tensor) -> Tensor:
    """``[B, K, N]`` soft union ``u_B(n) = 1 - prod_m (1 - a_mB R_mn)`` of each node's
    selected regions (module docstring), from memberships ``member [B, K, R]`` and region
    masks ``regions [B, R, N]``."""
    miss = 1.0 - member[..., None] * regions.to(member.dtype)[:, None]  # [B, K, R, N]
    return 1.0 - miss.prod(2)


def phrase_maps(similarity: Tensor, cover: Tensor) -> Tensor:
    """``[B, K, N]`` phrase maps ``map_B(n) = (s_B(n) - min_n' s_B(n')) u_B(n)`` (module
    docstring): the text-to-patch similarity ``similarity [B, K, N]`` (Fig. 6) weighted by
    the soft union ``cover [B, K, N]`` of the selected subset, unweighted where that subset
    is empty."""
    shifted = similarity - similarity.amin(-1, keepdim=True)
    empty = cover.amax(-1, keepdim=True) < EMPTY_SUBSET
    return shifted * torch.where(empty, torch.ones_like(cover), cover)


@dataclass
class PowersetInputs:
    """Region and phrase embeddings of a batch with their masks."""

    regions: Tensor  # [B, R, N] bool
    region_emb: Tensor  # [B, R, d]
    region_mask: Tensor  # [B, R] bool
    nodes: Tensor  # [B, K, M] bool
    node_mask: Tensor  # [B, K] bool
    phrase_emb: Tensor  # [B, K, d]
    patch_emb: Tensor  # [B, N, d] projected patch embeddings v_n


def proposal_regions(grid: tuple[int, int], kind: str, n_regions: int, seed: int = 0) -> Tensor:
    """``[R, N]`` region proposals of the module docstring: ``"grid"`` cells or seeded
    random ``"boxes"``."""
    if kind == "grid":
        return grid_cells(grid, *cell_layout(grid, n_regions))
    if kind == "boxes":
        return paper_boxes(grid, n_regions, seed)
    raise ValueError(f"unknown region proposals {kind!r}; choose one of {PROPOSALS}")


def default_nodes(batch: PairBatch) -> tuple[Tensor, Tensor]:
    """One node per content token: ``([B, M, M] nodes, [B, M] node mask)``."""
    m = batch.token_mask.shape[1]
    eye = torch.eye(m, dtype=torch.bool, device=batch.token_mask.device)
    return eye[None] & batch.token_mask[:, :, None], batch.token_mask


def score_bound(inp: PowersetInputs) -> Tensor:
    """``[B]`` ``S_max = R (mean_B ||p_B|| + max_B ||p_B||)`` of the module docstring."""
    norms = torch.linalg.vector_norm(inp.phrase_emb, dim=-1) * inp.node_mask
    n_nodes = inp.node_mask.sum(-1).clamp_min(1)
    n_regions = inp.region_mask.sum(-1)
    return n_regions * (norms.sum(-1) / n_nodes + norms.amax(-1))


def best_node(nodes: Tensor, node_mask: Tensor, token_select: Tensor) -> Tensor:
    """``[B]`` index of the valid node whose token set has the largest Jaccard overlap with
    ``token_select [B, M]`` (ties: the first)."""
    sel = token_select.bool()[:, None, :]
    inter = (nodes & sel).sum(-1).to(torch.float64)
    union = (nodes | sel).sum(-1).clamp_min(1).to(torch.float64)
    return (inter / union).masked_fill(~node_mask, -1.0).argmax(-1)


@register
class PowerCLIP(ProjectedMethod):
    """Powerset alignment (PowerCLIP)."""

    name = "powerclip"
    label = "PowerCLIP"
    order = 80
    local_objective = POWERSET_TRIPLET
    local_weight_field = "lambda_powerset"
    uses_trees = True
    uses_regions = True
    paper = "PowerCLIP Eq. 1-16"

    @classmethod
    def train_settings(cls, config: Any) -> dict[str, Any]:
        """The powerset settings of the training config, with the PowerCLIP-R random boxes
        as proposals (a head is evaluated on the kind of regions it trains on)."""
        return {"extra": {
            "tau": config.powerset_tau,
            "alpha": config.powerset_alpha,
            "gamma": config.powerset_gamma,
            "negatives": config.powerset_negatives,
            "n_regions": config.n_regions,
            "proposals": "boxes",
        }}

    @property
    def tau(self) -> float:
        return float(self.config.extra.get("tau", 1e-3))

    @property
    def alpha(self) -> float:
        return float(self.config.extra.get("alpha", 0.75))

    @property
    def exact(self) -> bool:
        return bool(self.config.extra.get("exact", False))

    @property
    def proposals(self) -> str:
        return str(self.config.extra.get("proposals", "grid"))

    def default_regions(self, batch: PairBatch) -> Tensor:
        """``[B, R, N]`` the configured proposals, the same for every image of the batch."""
        regions = proposal_regions(batch.grid, self.proposals,
                                   int(self.config.extra.get("n_regions", 9)),
                                   int(self.config.extra.get("proposal_seed", 0)))
        return regions.to(batch.patch_mask.device)[None].expand(batch.size, -1, -1)

    def inputs(self, batch: PairBatch) -> PowersetInputs:
        """Region / phrase embeddings (Eq. 2-4) with the documented defaults."""
        z, y = self.project(batch)
        regions = batch.regions if batch.regions is not None else self.default_regions(batch)
        regions = regions & batch.patch_mask[:, None, :]
        if batch.nodes is None:
            nodes, node_mask = default_nodes(batch)
        else:
            nodes = batch.nodes & batch.token_mask[:, None, :]
            node_mask = batch.node_mask if batch.node_mask is not None else nodes.any(-1)
            node_mask = node_mask & nodes.any(-1)
        region_emb, region_mask = region_embeddings(z, regions)
        phrase = phrase_embeddings(y, nodes, node_mask, batch.token_mask)
        return PowersetInputs(regions, region_emb, region_mask, nodes, node_mask, phrase, z)

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
            best = (self.tau * F.softplus(qt / self.tau) * rmask).sum(-1)
        return member, best

    def _plan(self, inp: PowersetInputs, member: Tensor, cover: Tensor) -> Tensor:
        """``[B, N, M]`` plan described in the module docstring."""
        dtype = member.dtype
        patch_dist = cover / cover.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        nodes = inp.nodes.to(dtype)
        token_dist = nodes / nodes.sum(-1, keepdim=True).clamp_min(1.0)
        k_valid = inp.node_mask.to(dtype).sum(-1, keepdim=True).clamp_min(1.0)
        weight = inp.node_mask.to(dtype) * member.amax(-1) / k_valid  # [B, K]
        return patch_dist.transpose(1, 2) @ (weight[..., None] * token_dist)

    def align(self, batch: PairBatch) -> Alignment:
        inp = self.inputs(batch)
        q = region_node_scores(inp.region_emb, inp.phrase_emb)  # [B, R, K]
        raw = powerset_similarity(
            q, self.tau, self.alpha, inp.region_mask, inp.node_mask, self.exact
        )
        member, best = self._membership(q, inp)
        cover = subset_cover(member, inp.regions)
        plan = self._plan(inp, member, cover)
        # Fig. 6's text-to-patch similarity <v_n / ||v_n||, p_B>: q of one-patch regions
        similarity = region_node_scores(
            F.normalize(inp.patch_emb, dim=-1), inp.phrase_emb).transpose(1, 2)
        extras = {
            "regions": inp.regions,
            "region_mask": inp.region_mask,
            "nodes": inp.nodes,
            "node_mask": inp.node_mask,
            "region_node_scores": q,
            "node_best_regions": member,
            "node_best_score": best,
            "node_subset_cover": cover,  # [B, K, N]
            "node_patch_similarity": similarity,  # [B, K, N]
            "node_patch_maps": phrase_maps(similarity, cover),  # [B, K, N]
            "raw_local_score": raw,
            "exact": self.exact,
        }
        return build_alignment(
            batch,
            DensePlan(plan),
            raw / score_bound(inp).clamp_min(torch.finfo(raw.dtype).tiny),
            row_marginal=plan.sum(2),
            col_marginal=plan.sum(1),
            extras=extras,
        )

    @staticmethod
    def phrase_patch_map(alignment: Alignment, token_select: Tensor) -> Tensor:
        """``[B, N]`` phrase map (module docstring, :func:`phrase_maps`): the Fig. 6
        similarity of the node ``B`` that best matches ``token_select`` (``[B, M]`` or
        ``[M]``) weighted by the soft union of its selected regions."""
        return _of_best_node(alignment, token_select, "node_patch_maps")

    @classmethod
    def shown_patch_map(cls, alignment: Alignment, token_select: Tensor) -> tuple[Tensor, str]:
        """The phrase map (:meth:`phrase_patch_map`), labelled "Fig. 6 sim." where the
        node's best subset is empty and the map is the unweighted similarity."""
        cover = _of_best_node(alignment, token_select, "node_subset_cover")
        empty = bool((cover.amax(-1) < EMPTY_SUBSET).any())
        return cls.phrase_patch_map(alignment, token_select), "Fig. 6 sim." if empty else ""

    @staticmethod
    def phrase_similarity_map(alignment: Alignment, token_select: Tensor) -> Tensor:
        """``[B, N]`` text-to-patch similarity of the phrase (PowerCLIP Fig. 6): ``<v_n /
        ||v_n||, p_B>`` for the node ``B`` that best matches ``token_select``, i.e. Eq. 10's
        region-node score of one-patch regions; signed, a cosine per leaf of ``B``."""
        return _of_best_node(alignment, token_select, "node_patch_similarity")

    def powerset_loss(self, batch: PairBatch, excluded: Tensor | None = None) -> Tensor:
        """Triplet loss ``Phi(S) + Phi(S^T)`` (Eq. 8-9, 16) over the ``C x C`` raw NLA
        similarities of the batch's images and captions (pair i matched with pair i);
        ``excluded`` ``[C, C]``: pairs that are no negatives (see :func:`triplet_loss`)."""
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
        return triplet_loss(sim, float(self.config.extra.get("gamma", 0.2)),
                            str(self.config.extra.get("negatives", "hardest")), excluded)
