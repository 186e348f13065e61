"""ConceptOT: low-rank unbalanced OT through learned concept anchors (Eq. 1-8, Alg. 1)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from otviz.methods.base import Alignment, MethodConfig, PairBatch, register
from otviz.methods.masses import ReferenceMasses
from otviz.methods.projected import ProjectedMethod, build_alignment
from otviz.methods.start import BackboneStart
from otviz.ot import LowRankProblem, LowRankSettings
from otviz.ot.lowrank import solve_lowrank, stabilised_score


def anchor_diversity(anchors: Tensor) -> Tensor:
    """``Omega_div(P) = 1 / (r (r - 1)) sum_{k != l} (p_k . p_l)^2`` for unit anchors
    (ConceptOT Sec. 2.3)."""
    r = anchors.shape[0]
    gram = anchors @ anchors.T
    off = gram.pow(2).sum() - gram.diagonal().pow(2).sum()
    return off / max(r * (r - 1), 1)


@register
class ConceptOT(ProjectedMethod):
    """Low-rank Nystrom UOT (:func:`otviz.ot.lowrank.lowrank_uot`) through ``config.rank``
    unit-norm anchors ``P`` (initialised ``N(0, 0.02)`` as in App. G.1, normalised in the
    forward pass), softplus reference masses (Eq. 1-2), ``config.n_iters`` iterations and the
    solver variant ``config.lowrank_variant``. Score: Eq. 8 evaluated implicitly, passed
    through ``tanh`` for the faithful variant (App. H) and raw for the positive one (already
    a mean of cosines). When the batch repeats images or captions (:class:`PairSides`), the
    projections and anchor kernels are formed once per distinct image and caption. The plan
    stays factored; ``extras`` carry the anchor views: the unit
    ``anchors [r, d_c]``, ``anchor_cosine [r, r]``, ``patch_anchor_cosine [B, N, r]``,
    ``patch_anchor_affinity [B, N, r]`` and ``token_anchor_affinity [B, M, r]`` (``K_ZP``,
    ``K_YP`` over each patch's / token's best anchor, in ``(0, 1]``), ``score_raw`` and
    ``transported_mass``.

    Training-free (``config.trainable=False``): identity projections, uniform masses and
    anchors from k-means of token embeddings (:meth:`fit_training_free`); a head started
    from the backbone starts there too (:meth:`start_from_backbone`), and its training may
    hold the anchors there or pull them back toward them (``TrainConfig.anchor_hold`` /
    ``anchor_pull``, :mod:`otviz.train.anchor_tether`).
    """

    name = "conceptot"
    label = "ConceptOT"
    order = 60
    paper_epochs = 3
    paper = "ConceptOT Eq. 1-8, Alg. 1"
    uses_rank = True  # the benchmark sweeps config.rank

    def __init__(self, patch_dim: int, token_dim: int, config: MethodConfig | None = None):
        super().__init__(patch_dim, token_dim, config)
        cfg = self.config
        self.masses = ReferenceMasses(patch_dim, token_dim, cfg.trainable)
        init = torch.randn(cfg.rank, self.concept_dim) * 0.02
        self.anchors = nn.Parameter(init, requires_grad=cfg.trainable)

    @property
    def solver_settings(self) -> LowRankSettings:
        """The low-rank solver's knobs from the config: ``n_iters`` fixed iterations
        (Alg. 1's ``L``, ``tol=None``)."""
        cfg = self.config
        return LowRankSettings(
            eps=cfg.eps, tau_a=cfg.tau_v, tau_b=cfg.tau_t, n_iters=cfg.n_iters, tol=None,
            kpp_reg=cfg.kpp_reg, variant=cfg.lowrank_variant,
        )

    def unit_anchors(self) -> Tensor:
        """``[r, d_c]`` L2-normalised anchors ``P``."""
        return F.normalize(self.anchors, dim=-1)

    def align(self, batch: PairBatch) -> Alignment:
        z, z_scale, y, sides = self.project_distinct(batch)
        source = batch if sides is None else sides
        mu, nu = self.masses(batch)
        anchors = self.unit_anchors()
        cfg = self.config
        problem = LowRankProblem(
            z,
            y,
            anchors,
            mu,
            nu,
            row_mask=source.patch_mask,
            col_mask=source.token_mask,
            z_scale=z_scale,
            image_index=None if sides is None else sides.image,
            text_index=None if sides is None else sides.text,
        )
        res = solve_lowrank(problem, self.solver_settings)
        plan = res.factors
        score = stabilised_score(res.score) if cfg.lowrank_variant == "faithful" else res.score
        extras = {
            "anchors": anchors,
            "anchor_cosine": anchors @ anchors.T,
            "patch_anchor_cosine": res.extras["patch_anchor_cosine"],
            "patch_anchor_affinity": res.extras["patch_anchor_affinity"],
            "token_anchor_affinity": res.extras["token_anchor_affinity"],
            "score_raw": res.score,
            "transported_mass": res.mass,
        }
        return build_alignment(
            batch,
            plan,
            score,
            row_marginal=res.row_marginal,
            col_marginal=res.col_marginal,
            row_reference=mu,
            col_reference=nu,
            marginal_error=res.marginal_error,
            extras=extras,
        )

    def regulariser(self) -> Tensor:
        """The anchor diversity penalty ``Omega_div(P)`` (Eq. 10 weights it by beta)."""
        return anchor_diversity(self.unit_anchors())

    def start_from_backbone(self, start: BackboneStart) -> None:
        """Projections at the model's own and anchors fitted as the training-free
        configuration fits them (:meth:`fit_training_free` on ``start.fit_batch``)."""
        super().start_from_backbone(start)
        if start.fit_batch is not None:
            self.fit_training_free(start.fit_batch)

    @torch.no_grad()
    def fit_training_free(self, batch: PairBatch) -> None:
        """Anchors = k-means centroids (scikit-learn, seed ``config.extra['seed']``, default
        0) of the batch's valid token embeddings in the concept space, normalised. With
        fewer distinct tokens than ``r``, the remaining anchors are seeded random unit
        vectors (near-orthogonal to everything in high dimension)."""
        seed = int(self.config.extra.get("seed", 0))
        tokens = self.proj_t(batch.tokens)[batch.token_mask].double().cpu().numpy()
        r = self.anchors.shape[0]
        n_clusters = min(r, len(np.unique(tokens.round(6), axis=0)))
        centres = torch.empty(0, self.concept_dim, dtype=torch.float64)
        if n_clusters > 0:
            from sklearn.cluster import KMeans  # here: scikit-learn takes ~1 s to import

            km = KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit(tokens)
            centres = torch.from_numpy(km.cluster_centers_)
        gen = torch.Generator().manual_seed(seed)
        extra = torch.randn(r - centres.shape[0], self.concept_dim, generator=gen)
        anchors = torch.cat([centres, extra.double()], 0)
        self.anchors.copy_(F.normalize(anchors, dim=-1).to(self.anchors))
