"""The OT-CLIP loss family for global image/text embeddings (OT-CLIP Sec. 3, Eq. 5-10).

CLIP's loss is inverse OT (Eq. 5-7): with the cost ``C_ij = 1 - cos(z_i^I, z_j^T)`` of a batch
of n matched pairs and the supervision ``P~ = I`` (pair i matches pair i), the loss is
``KL(P~ || P)`` where ``P`` solves ``min_{P in C} <C, P> - eps H(P)`` and ``eps`` is the
temperature ``1 / logit_scale``. The constraint set, or the regularised problem, picks the
member of the family:

============== ======================================================================
kind           inner problem
============== ======================================================================
infonce        ``C(1)`` and ``C'(1)``: row / column softmax, both KLs averaged (Eq. 4-6)
entropic_ot    ``U(1, 1)``: balanced Sinkhorn (Sec. 3.2)
dbot           ``P 1 = 1``, ``1 - delta <= P^T 1 <= 1 + delta`` (Eq. 8), both orientations
unbalanced_ot  KL-relaxed marginals, Eq. 9 with ``alpha0 = 0``
fgw_ot         ``U(1, 1)`` plus the Gromov term ``-alpha0 <D1, P D2 P^T>`` (Eq. 9-10)
ufg_ot         Gromov term and KL-relaxed marginals (Eq. 9, the general case)
============== ======================================================================

``KL`` is the generalized ``KL(x || y) = sum x log(x / y) - x + y`` of Eq. 9 (it matters for
the unbalanced kinds, whose plans do not have mass n); the loss is divided by n.

Choices where the paper leaves room (all overridable through :class:`OTCLIPLossConfig`):

* marginals ``a = b = 1`` (the supervision ``I`` lies in ``U(1, 1)``, as in Eq. 6);
* DBOT averages the row-anchored and the column-anchored problem, as InfoNCE averages its
  two directions, so ``delta -> inf`` gives InfoNCE and ``delta = 0`` entropic OT;
* the KL weights ``alpha1 = alpha2`` default to ``eps / 2``, reproducing the damping
  exponent ``1/3`` of App. A.4's settings (``a2 / (a2 + a1 + tau)`` with all 0.01);
* ``alpha0 = 0.01`` (App. A.4's ``a0``) weighs the Gromov term for the unit-mass plan
  (:mod:`otviz.ot.fgw`), for fgw_ot and ufg_ot alike; D1 / D2 are cosine similarities as
  in App. A.3's code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.knobs import OTCLIP_LOSSES
from otviz.ot.dbot import dbot_log
from otviz.ot.fgw import Structure, fgw_sinkhorn, structure_matrix

KINDS = OTCLIP_LOSSES


@dataclass
class OTCLIPLossConfig:
    """Inner-solver settings of the OT-CLIP losses (defaults from OT-CLIP App. A).

    Attributes:
        n_iters: (generalized) Sinkhorn / Dykstra iterations per inner solve (App. A: 5).
        dbot_delta: half-width ``delta`` of DBOT's column box (Eq. 8).
        marginal_weight: KL weight ``alpha1 = alpha2`` of the unbalanced kinds; ``None``:
            ``eps / 2``; ``float('inf')``: hard marginals.
        alpha0: Gromov weight of fgw_ot and ufg_ot.
        n_outer_fgw, n_outer_ufg: linearisation steps (App. A.3: N = 5; App. A.4: num = 4).
        structure: D1 / D2 kind, cosine ``"similarity"`` or ``"distance"`` (Eq. 10).
    """

    n_iters: int = 5
    dbot_delta: float = 0.5
    marginal_weight: float | None = None
    alpha0: float = 0.01
    n_outer_fgw: int = 5
    n_outer_ufg: int = 4
    structure: Structure = "similarity"


def kl_to_identity(plan: Tensor) -> Tensor:
    """``KL(I || P) / n`` for a ``[B, n, n]`` plan: ``(-sum_i log P_ii - n + sum P) / n``."""
    n = plan.shape[-1]
    log_diag = torch.log(plan.diagonal(dim1=-2, dim2=-1).clamp_min(torch.finfo(plan.dtype).tiny))
    return ((-log_diag.sum(-1) - n + plan.sum((-2, -1))) / n).mean()


def otclip_loss(
    image_emb: Tensor,
    text_emb: Tensor,
    logit_scale: float | Tensor,
    kind: str,
    config: OTCLIPLossConfig | None = None,
) -> Tensor:
    """The OT-CLIP loss ``kind`` of a batch of n matched pairs (row i of each input).

    Args:
        image_emb, text_emb: ``[n, E]`` global embeddings (normalised here).
        logit_scale: CLIP's (exponentiated) logit scale; ``eps = 1 / logit_scale``.
        kind: one of :data:`KINDS`.
        config: inner-solver settings.

    Returns:
        Scalar loss, differentiable in the embeddings and the logit scale.
    """
    cfg = config or OTCLIPLossConfig()
    img = F.normalize(image_emb, dim=-1)
    txt = F.normalize(text_emb, dim=-1)
    cost = (1.0 - img @ txt.T)[None]
    eps = 1.0 / logit_scale
    n = cost.shape[-1]
    ones = torch.ones(1, n, dtype=cost.dtype, device=cost.device)
    if kind == "infonce":
        row = torch.softmax(-cost / eps, dim=2)
        col = torch.softmax(-cost / eps, dim=1)
        return 0.5 * (kl_to_identity(row) + kl_to_identity(col))
    if kind == "dbot":
        low = (ones - cfg.dbot_delta).clamp_min(0.0)
        high = ones + cfg.dbot_delta
        row = dbot_log(cost, ones, low, high, eps, cfg.n_iters, tol=None).plan
        col = dbot_log(cost.transpose(1, 2), ones, low, high, eps, cfg.n_iters, tol=None).plan
        return 0.5 * (kl_to_identity(row) + kl_to_identity(col))
    if kind not in KINDS:
        raise ValueError(f"unknown OT-CLIP loss {kind!r}; known: {', '.join(KINDS)}")
    relaxed = kind in ("unbalanced_ot", "ufg_ot")
    tau = float("inf")
    if relaxed:
        tau = 0.5 * eps if cfg.marginal_weight is None else cfg.marginal_weight
    alpha0, n_outer = 0.0, 0
    if kind == "fgw_ot":
        alpha0, n_outer = cfg.alpha0, cfg.n_outer_fgw
    elif kind == "ufg_ot":
        alpha0, n_outer = cfg.alpha0, cfg.n_outer_ufg
    d1 = structure_matrix(img[None], cfg.structure)
    d2 = structure_matrix(txt[None], cfg.structure)
    res = fgw_sinkhorn(
        cost, ones, ones, eps, d1, d2, alpha0, n_outer, cfg.n_iters, tau_a=tau, tau_b=tau,
        scaling="unit_mass", tol=None,  # the losses' fixed iterations, as trained
    )
    return kl_to_identity(res.plan)
