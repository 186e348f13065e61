"""OT-CLIP inference (OT-CLIP Sec. 4): zero-shot classification as (fused Gromov) matching,
long-tailed classification with a label prior, and selective classification.

All functions take one set of ``n`` image embeddings ``[n, d]`` and ``K`` class (prompt)
embeddings ``[K, d]``; the cost is ``C = 1 - cos`` and ``eps`` plays CLIP's temperature
(``1 / logit_scale``, 0.01 for CLIP's 100). The OT variants couple the whole set of
images, so the prediction for one image depends on the others (OT-CLIP App. D.2).

The FGW rules come in two scalings of the Gromov term (:mod:`otviz.ot.fgw`): the paper's
(Eq. 12 with Table 7's weights, rules ``fgw_isoftmax`` / ``fgw_pgd``) and the unit-mass plan
(``alpha0 / n`` in effect, rules ``fgw_isoftmax_unit`` / ``fgw_pgd_unit``, this package's
earlier default), kept side by side so the difference shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.ot._checks import SolverInputError, check_tensors
from otviz.ot._result import DEFAULT_TOL
from otviz.ot.fgw import Scaling, Structure, fgw_isoftmax, fgw_pgd, fgw_sinkhorn, structure_matrix
from otviz.ot.partial import partial_ot_log
from otviz.ot.unbalanced import sinkhorn_unbalanced_log


@dataclass
class Prediction:
    """Classification of ``n`` images into ``K`` classes.

    Attributes:
        labels: ``[n]`` predicted class per image.
        scores: ``[n, K]`` plan rows (for softmax: probabilities) the labels are argmaxes of.
        confidence: ``[n]`` the score used to rank images for acceptance.
        accepted: ``[n]`` bool; all True except for selective classification.
        marginal_error: ``[]`` solver convergence measure (``None`` for softmax).
    """

    labels: Tensor
    scores: Tensor
    confidence: Tensor
    accepted: Tensor
    marginal_error: Tensor | None = None


def _cost(image_emb: Tensor, class_emb: Tensor) -> Tensor:
    """``[1, n, K]`` cosine cost of one set of embeddings ``[n, d]`` and ``[K, d]`` (one
    floating dtype and device, one width; refused with :class:`SolverInputError`)."""
    check_tensors("zero-shot", image_emb=image_emb, class_emb=class_emb)
    if image_emb.dim() != 2 or class_emb.dim() != 2 or image_emb.shape[1] != class_emb.shape[1]:
        raise SolverInputError(
            f"zero-shot: image_emb and class_emb must be [n, d] and [K, d] of one width, got "
            f"{tuple(image_emb.shape)} and {tuple(class_emb.shape)}"
        )
    return (1.0 - F.normalize(image_emb, dim=-1) @ F.normalize(class_emb, dim=-1).T)[None]


def _prediction(
    plan: Tensor,
    accepted: Tensor | None = None,
    err: Tensor | None = None,
    confidence: Tensor | None = None,
) -> Prediction:
    labels = plan.argmax(1)
    conf = plan.max(1).values / plan.sum(1).clamp_min(1e-30) if confidence is None else confidence
    acc = torch.ones_like(labels, dtype=torch.bool) if accepted is None else accepted
    return Prediction(labels, plan, conf, acc, err)


#: OT-CLIP Table 7's Gromov weight ``a1`` (FGW zero-shot and long-tailed CIFAR-100).
TABLE7_ALPHA0 = 0.01

#: Zero-shot rules: name -> (FGW solver, Gromov scaling); ``softmax`` has none.
FGW_RULES: dict[str, tuple[str, Scaling]] = {
    "fgw_isoftmax": ("isoftmax", "paper"),
    "fgw_pgd": ("pgd", "paper"),
    "fgw_isoftmax_unit": ("isoftmax", "unit_mass"),
    "fgw_pgd_unit": ("pgd", "unit_mass"),
}
ZERO_SHOT_METHODS: tuple[str, ...] = ("softmax", *FGW_RULES)

#: Long-tailed rules: name -> ``alpha0`` of Eq. 14 (:func:`long_tailed_predict`): the fused
#: Gromov OT with Table 7's weight, and ``alpha0 = 0``, long-tailed Sinkhorn (the plain
#: entropic plan with the label prior as its class marginal).
LONG_TAILED_RULES: dict[str, float] = {"lt_fgw": TABLE7_ALPHA0, "lt_sinkhorn": 0.0}


def zero_shot_predict(
    image_emb: Tensor,
    class_emb: Tensor,
    method: str = "softmax",
    eps: float = 0.01,
    alpha0: float = TABLE7_ALPHA0,
    n_iters: int = 3,
    structure: Structure = "similarity",
) -> Prediction:
    """Zero-shot classification: softmax, FGromov OT-ISoftmax (Eq. 11-12) or FGromov OT-PGD
    (Eq. 13) over the row-only set ``C(1)``.

    Args:
        image_emb: ``[n, d]``; class_emb: ``[K, d]``.
        method: one of :data:`ZERO_SHOT_METHODS`: ``softmax``; ``fgw_isoftmax`` /
            ``fgw_pgd`` with the paper's Gromov term (Eq. 12 on the raw plan of mass ``n``);
            ``fgw_isoftmax_unit`` / ``fgw_pgd_unit`` on the unit-mass plan (``alpha0 / n``).
        eps: entropic regularisation / temperature.
        alpha0: weight of the Gromov term; default OT-CLIP Table 7's ``a1 = 0.01``.
        n_iters: linearisation steps (Table 7: 3-5).
        structure: ``"similarity"`` (App. B code) or ``"distance"`` (Eq. 10) for D1, D2.
    """
    cost = _cost(image_emb, class_emb)
    if method == "softmax":
        return _prediction(torch.softmax(-cost[0] / eps, dim=1))
    if method not in FGW_RULES:
        raise ValueError(f"unknown method {method!r}; use one of {ZERO_SHOT_METHODS}")
    kind, scaling = FGW_RULES[method]
    solver = fgw_isoftmax if kind == "isoftmax" else fgw_pgd
    d1 = structure_matrix(image_emb[None], structure)
    d2 = structure_matrix(class_emb[None], structure)
    res = solver(cost, None, eps, d1, d2, alpha0, n_iters, scaling)
    return _prediction(res.plan[0], err=res.marginal_error[0])


def long_tailed_predict(
    image_emb: Tensor,
    class_emb: Tensor,
    label_prior: Tensor,
    eps: float = 0.01,
    alpha0: float = TABLE7_ALPHA0,
    n_outer: int = 3,
    n_inner: int = 1000,
    prior_strength: float = float("inf"),
    structure: Structure = "similarity",
    scaling: Scaling = "paper",
    tol: float | None = DEFAULT_TOL,
) -> Prediction:
    """Long-tailed classification (OT-CLIP Sec. 4.2, Eq. 14): fused Gromov OT over
    ``U(1, n r)`` with the label distribution ``r``: class ``k`` receives ``n r_k`` images.

    Args:
        label_prior: ``[K]`` label distribution ``r`` (normalised here).
        alpha0: Gromov weight, default Table 7's CIFAR-100 LT ``a1 = 0.01`` (> 0: the fused
            Gromov OT of Eq. 14; 0: long-tailed Sinkhorn, the plain entropic OT plan).
        n_outer, n_inner: linearisation steps (Table 7: 3) and the most Sinkhorn
            iterations per step (each solved to the library tolerance).
        prior_strength: KL weight on the class marginal; ``inf`` (default) is the hard
            constraint of Eq. 14, a finite value trusts the prior only softly.
        structure: D1/D2 kind (see :func:`zero_shot_predict`).
        scaling: Gromov scaling (:mod:`otviz.ot.fgw`; ``"paper"``: Eq. 12 on the raw plan).
        tol: marginal-error tolerance of each Sinkhorn solve (:mod:`otviz.ot._result`).
    """
    n = image_emb.shape[0]
    cost = _cost(image_emb, class_emb)
    a = torch.ones(1, n, dtype=cost.dtype, device=cost.device)
    b = (n * label_prior / label_prior.sum()).to(cost.dtype)[None]
    d1 = structure_matrix(image_emb[None], structure)
    d2 = structure_matrix(class_emb[None], structure)
    res = fgw_sinkhorn(
        cost, a, b, eps, d1, d2, alpha0, n_outer, n_inner, tau_b=prior_strength, scaling=scaling,
        tol=tol,
    )
    return _prediction(res.plan[0], err=res.marginal_error[0])


def selective_predict(
    image_emb: Tensor,
    class_emb: Tensor,
    rate: float,
    method: Literal["confidence", "uot", "partial"] = "confidence",
    eps: float = 0.01,
    tau: float = 0.01,
    n_iters: int = 1000,
    tol: float | None = DEFAULT_TOL,
) -> Prediction:
    """Selective zero-shot classification (OT-CLIP Sec. 4.3, results in its Table 6):
    classify only the ``round(rate * n)`` images ranked most confident, reject the rest.

    * ``"confidence"``: the maximum softmax probability;
    * ``"uot"``: the row mass of the unbalanced plan of Eq. 15 (KL weight ``tau`` on the
      image marginal, free class marginal). Its closed form is ``P = r_i softmax_i`` with
      ``r_i = (sum_j exp(-C_ij / eps))^{eps/(eps+tau)}``: images far from every class keep
      less mass; ``tau -> inf`` gives back the softmax (all masses 1);
    * ``"partial"``: the row mass of the entropic partial plan of Eq. 16 moving exactly
      ``s = rate * n`` mass with ``P 1 <= 1`` (no class constraint), in at most ``n_iters``
      iterations to the marginal-error tolerance ``tol`` (:mod:`otviz.ot._result`).

    Labels are the argmax of each plan row (for ``"uot"`` the softmax's labels).
    """
    n = image_emb.shape[0]
    k = int(round(rate * n))
    if not 0 <= k <= n:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    cost = _cost(image_emb, class_emb)
    ones_n = torch.ones(1, n, dtype=cost.dtype, device=cost.device)
    err = None
    if method == "confidence":
        plan = torch.softmax(-cost[0] / eps, dim=1)
        conf = plan.max(1).values
    elif method == "uot":
        ones_k = torch.ones(1, cost.shape[2], dtype=cost.dtype, device=cost.device)
        # closed form after one update (column side free): exactly n_iters=1
        res = sinkhorn_unbalanced_log(cost, ones_n, ones_k, eps, tau, 0.0, n_iters=1, tol=None)
        plan, err = res.plan[0], res.marginal_error[0]
        conf = plan.sum(1)
    elif method == "partial":
        res = partial_ot_log(cost, ones_n, None, eps, float(max(k, 1e-6)), n_iters, tol=tol)
        plan, err = res.plan[0], res.marginal_error[0]
        conf = plan.sum(1)
    else:
        raise ValueError(f"unknown method {method!r}; use confidence, uot or partial")
    accepted = torch.zeros(n, dtype=torch.bool, device=cost.device)
    accepted[conf.topk(k).indices] = True
    return _prediction(plan, accepted, err, conf)
