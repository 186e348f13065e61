"""ConceptOT's low-rank Nystrom unbalanced OT through concept anchors (Eq. 4-8, Algorithm 1).

The Gibbs kernel ``K_ij = exp(-(1 - z_i . y_j) / eps)`` is replaced by the Nystrom
factorisation ``K~ = K_ZP K_PP,lambda^-1 K_PY`` (Eq. 4-7) through ``r`` anchors ``P``; the
generalized Sinkhorn updates of Eq. 3 then cost ``O((N + M) r + r^2)`` per iteration and
the plan ``diag(a) K~ diag(b)`` is never materialised: :class:`LowRankPlan` multiplies by
it and the score of Eq. 8 is evaluated through ``[r, d]`` anchor-space products.

Everything is batched over B pairs (no per-pair loop): anchors are shared ``[r, d]`` (one
``K_PP`` factorisation for the whole batch) or per pair ``[B, r, d]``.

Two variants, chosen by name:

``"faithful"`` -- Algorithm 1 with the stabilisation of Sec. 2.5 / App. H:

* sub-kernels formed in the log domain and exponentiated after subtracting their maximum
  (per problem, see :class:`otviz.ot.sinkhorn.ShiftedKernel`), the shift carried exactly in
  the log-scalings;
* ``K_PP + lambda I`` factorised once (batched Cholesky, ``cholesky_ex``) into its inverse;
  problems whose Cholesky fails use the pseudo-inverse (the least-squares solution), so
  every solve in the iterations, the score and the heatmap is robust;
* updates ``a <- (mu / (K~ b + 1e-8))^alpha_v`` (Alg. 1 lines 6-9; ``K~ b`` is clamped at 0
  first, because the inverse can make it negative, where Alg. 1's power is undefined) and
  likewise for ``b``;
* log-scalings centred and clamped to ``[-20, 20]`` at each iteration. Unlike App. H we add
  the subtracted mean back after clamping: the paper's centring rescales the plan by a
  scalar per iteration, which leaves the ratio score of Eq. 8 unchanged but falsifies the
  plan's mass (the unmatched mass the views show). With the mean kept, the iterates are
  exactly Algorithm 1's whenever the clamp is inactive;
* the score is ``tanh`` of Eq. 8 (:func:`stabilised_score`, applied by the method).

``"positive"`` -- a nonnegative factorisation that needs no inverse:
``K+ = K_ZP diag(w) K_PY`` with ``w = 1 / ((K_PP + lambda I) 1)``. It differs from the
faithful kernel only in replacing ``K_PP,lambda^-1`` by that diagonal: it is exact when the
anchor Gram kernel is (up to lambda) block-diagonal with constant blocks -- near-orthogonal
anchors (``K_PP ~ I``) or clusters of identical anchors, where ``K_PP^+`` splits an anchor's
weight among its copies exactly as ``w`` does -- and an approximation otherwise. Being
nonnegative, its Sinkhorn products are exact log-sum-exps (no ``1e-8`` floor, no clamping,
no linear solves), and the score is a weighted mean of cosines, already in ``[-1, 1]``, so
it needs no ``tanh``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from otviz.ot.result import SolverResult
from otviz.ot.sinkhorn import NEG, ShiftedKernel, masked_log
from otviz.ot.unbalanced import damping_exponent

VARIANTS = ("faithful", "positive")


@dataclass
class LowRankPlan:
    """The plan ``exp(log_scale) * left @ core @ right`` held in factors.

    Attributes:
        left: ``[B, N, r]`` shifted ``diag(a) K_ZP``.
        core: ``[r, r]`` or ``[B, r, r]``: ``K_PP,lambda^-1`` (faithful) or ``diag(w)``.
        right: ``[B, r, M]`` shifted ``K_PY diag(b)``.
        log_scale: ``[B]`` log of the factor the shifts removed.
    """

    left: Tensor
    core: Tensor
    right: Tensor
    log_scale: Tensor

    def _scale(self, x: Tensor) -> Tensor:
        return x * torch.exp(self.log_scale).reshape(-1, *([1] * (x.dim() - 1)))

    def dense(self) -> Tensor:
        """Materialise ``[B, N, M]`` (on request only; the solver never does)."""
        return self._scale(self.left @ (self.core @ self.right))

    def apply(self, v: Tensor) -> Tensor:
        """``plan @ v`` for ``v [B, M, k]`` -> ``[B, N, k]`` in ``O((N + M) r k + r^2 k)``."""
        return self._scale(self.left @ (self.core @ (self.right @ v)))

    def apply_t(self, w: Tensor) -> Tensor:
        """``plan^T @ w`` for ``w [B, N, k]`` -> ``[B, M, k]``."""
        core_t = self.core.transpose(-1, -2)
        return self._scale(self.right.transpose(1, 2) @ (core_t @ (self.left.transpose(1, 2) @ w)))


@dataclass
class LowRankResult(SolverResult):
    """:class:`SolverResult` of the low-rank solver (``plan`` is ``None``), plus:

    Attributes:
        factors: the factored plan.
        score: ``[B]`` the Eq. 8 ratio ``sum P~_ij z_i.y_j / sum P~_ij`` (before any tanh).
        mass: ``[B]`` total transported mass ``1^T P~ 1``.
    """

    factors: LowRankPlan | None = None
    score: Tensor | None = None
    mass: Tensor | None = None


def anchor_log_kernels(
    z: Tensor,
    y: Tensor,
    anchors: Tensor,
    eps: float,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Log Gibbs sub-kernels ``log K_ZP [B, N, r]`` and ``log K_PY [B, r, M]`` (Eq. 5, 7:
    ``-(1 - cos) / eps``), :data:`NEG` on masked patches / tokens. ``anchors`` is ``[r, d]``
    or ``[B, r, d]``."""
    log_zp = (z @ anchors.transpose(-1, -2) - 1.0) / eps
    log_py = (anchors @ y.transpose(1, 2) - 1.0) / eps
    if row_mask is not None:
        log_zp = log_zp.masked_fill(~row_mask[:, :, None], NEG)
    if col_mask is not None:
        log_py = log_py.masked_fill(~col_mask[:, None, :], NEG)
    return log_zp, log_py


def regularised_anchor_gram(anchors: Tensor, eps: float, kpp_reg: float) -> Tensor:
    """``K_PP + lambda I`` (Eq. 6 with App. H's diagonal regularisation)."""
    k_pp = torch.exp((anchors @ anchors.transpose(-1, -2) - 1.0) / eps)
    eye = torch.eye(anchors.shape[-2], dtype=anchors.dtype, device=anchors.device)
    return k_pp + kpp_reg * eye


def robust_inverse(k_reg: Tensor) -> Tensor:
    """Inverse of the symmetric ``K_PP,lambda`` (``[r, r]`` or ``[B, r, r]``) from one batched
    Cholesky factorisation; problems whose factorisation fails get the pseudo-inverse (the
    minimum-norm least-squares solution), computed only when needed."""
    chol, info = torch.linalg.cholesky_ex(k_reg)
    bad = info != 0
    if not bool(bad.any()):
        return torch.cholesky_inverse(chol)
    eye = torch.eye(k_reg.shape[-1], dtype=k_reg.dtype, device=k_reg.device)
    bad_m = bad[..., None, None]
    chol, _ = torch.linalg.cholesky_ex(torch.where(bad_m, eye, k_reg))
    pinv = torch.linalg.pinv(k_reg, hermitian=True)
    return torch.where(bad_m, pinv, torch.cholesky_inverse(chol))


def _centre_clamp(x: Tensor, mask: Tensor | None, bound: float | None) -> Tensor:
    """Clamp the centred log-scaling to ``[-bound, bound]`` and restore its mean (App. H)."""
    if bound is None:
        return x
    if mask is None:
        mean = x.mean(1, keepdim=True)
    else:
        w = mask.to(x.dtype)
        mean = (x * w).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1.0)
    return (x - mean).clamp(-bound, bound) + mean


def _hold(x: Tensor, mask: Tensor | None) -> Tensor:
    return x if mask is None else x.masked_fill(~mask, NEG)


class _FaithfulOps:
    """``log(K~ e^g + floor)`` and ``log(K~^T e^f + floor)`` through the inverse (Alg. 1)."""

    def __init__(self, zp: ShiftedKernel, py: ShiftedKernel, inv: Tensor, floor: float) -> None:
        self.zp, self.py, self.inv = zp, py, inv
        self.log_floor = math.log(floor) if floor > 0 else None
        self.tiny = zp.tiny

    def _log(self, q: Tensor, shift: Tensor) -> Tensor:
        out = shift + torch.log(q.clamp_min(self.tiny))
        if self.log_floor is None:
            return out
        return torch.logaddexp(out, torch.full_like(out, self.log_floor))

    def _mid(self, q: Tensor) -> Tensor:
        # inv is symmetric: (inv q)^T = q^T inv, a single mm for shared anchors
        return (q.unsqueeze(1) @ self.inv).squeeze(1)

    def row(self, g: Tensor) -> Tensor:
        m = g.detach().amax(1, keepdim=True)
        q = torch.bmm(self.py.kernel, torch.exp(g - m).unsqueeze(-1)).squeeze(-1)  # l. 6
        q = torch.bmm(self.zp.kernel, self._mid(q).unsqueeze(-1)).squeeze(-1)  # l. 7-8
        return self._log(q, m + self.zp.shift + self.py.shift)

    def col(self, f: Tensor) -> Tensor:
        m = f.detach().amax(1, keepdim=True)
        q = torch.bmm(torch.exp(f - m).unsqueeze(1), self.zp.kernel).squeeze(1)  # l. 10
        q = torch.bmm(self._mid(q).unsqueeze(1), self.py.kernel).squeeze(1)  # l. 11-12
        return self._log(q, m + self.zp.shift + self.py.shift)


class _PositiveOps:
    """Exact log-domain ``log(K+ e^g)`` and ``log(K+^T e^f)`` for ``K+ = K_ZP diag(w) K_PY``."""

    def __init__(self, zp: ShiftedKernel, py: ShiftedKernel, log_w: Tensor) -> None:
        self.zp, self.py = zp, py
        self.log_w = log_w if log_w.dim() == 2 else log_w.unsqueeze(0)

    def row(self, g: Tensor) -> Tensor:
        return self.zp.row_lse(self.log_w + self.py.row_lse(g))

    def col(self, f: Tensor) -> Tensor:
        return self.py.col_lse(self.log_w + self.zp.col_lse(f))


def lowrank_uot(
    z: Tensor,
    y: Tensor,
    anchors: Tensor,
    mu: Tensor,
    nu: Tensor,
    eps: float,
    tau_a: float,
    tau_b: float,
    n_iters: int = 5,
    kpp_reg: float = 1e-2,
    variant: str = "faithful",
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
    clamp: float | None = 20.0,
    floor: float = 1e-8,
) -> LowRankResult:
    """Low-rank generalized Sinkhorn with concept anchors (ConceptOT Algorithm 1, Eq. 3-8).

    Args:
        z: ``[B, N, d]`` L2-normalised patch features.
        y: ``[B, M, d]`` L2-normalised token features.
        anchors: ``[r, d]`` shared or ``[B, r, d]`` per-pair L2-normalised anchors.
        mu, nu: ``[B, N]``, ``[B, M]`` positive reference masses.
        eps, tau_a, tau_b: entropic regularisation and KL weights of Eq. 3.
        n_iters: iterations L.
        kpp_reg: lambda added to ``K_PP`` (App. H: 1e-2).
        variant: ``"faithful"`` or ``"positive"`` (module docstring).
        row_mask, col_mask: optional validity masks of patches and tokens.
        clamp: bound of the centred log-scalings (faithful; ``None`` disables).
        floor: the ``1e-8`` of Alg. 1 lines 9 and 13 (faithful; 0 disables).

    Returns:
        :class:`LowRankResult`: ``log_u``/``log_v`` the log-scalings ``log a``, ``log b`` for
        the unshifted sub-kernels (``-inf`` where masked), the factored plan, the raw Eq. 8
        score, the transported mass, ``cost = <C, P~>`` with ``C = 1 - z.y``, and
        ``marginal_error`` = the fixed-point residual ``max_i |log a_i - alpha_v (log mu_i -
        log (K~ b)_i)|`` (as in :func:`otviz.ot.unbalanced.sinkhorn_unbalanced_log`).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown low-rank variant {variant!r}; known: {VARIANTS}")
    alpha_a = damping_exponent(tau_a, eps)
    alpha_b = damping_exponent(tau_b, eps)
    log_zp, log_py = anchor_log_kernels(z, y, anchors, eps, row_mask, col_mask)
    zp, py = ShiftedKernel(log_zp), ShiftedKernel(log_py)
    k_reg = regularised_anchor_gram(anchors, eps, kpp_reg)
    ops: _FaithfulOps | _PositiveOps
    if variant == "faithful":
        core = robust_inverse(k_reg)
        ops = _FaithfulOps(zp, py, core, floor)
        bound = clamp
    else:
        w = 1.0 / k_reg.sum(-1)
        core = torch.diag_embed(w)
        ops = _PositiveOps(zp, py, torch.log(w))
        bound = None

    log_mu = masked_log(mu, row_mask)
    log_nu = masked_log(nu, col_mask)
    f = _hold(torch.zeros_like(log_mu), row_mask)
    g = _hold(torch.zeros_like(log_nu), col_mask)
    for _ in range(n_iters):
        f = _hold(_centre_clamp(alpha_a * (log_mu - ops.row(g)), row_mask, bound), row_mask)
        g = _hold(_centre_clamp(alpha_b * (log_nu - ops.col(f)), col_mask, bound), col_mask)
    residual = (f - alpha_a * (log_mu - ops.row(g))).abs()
    if row_mask is not None:
        residual = residual.masked_fill(~row_mask, 0.0)

    plan = _factor_plan(zp, py, core, f, g)
    score, mass = implicit_score(plan, z, y)
    log_u = f if row_mask is None else f.masked_fill(~row_mask, -float("inf"))
    log_v = g if col_mask is None else g.masked_fill(~col_mask, -float("inf"))
    return LowRankResult(
        plan=None,
        log_u=log_u,
        log_v=log_v,
        marginal_error=residual.amax(1),
        n_iters=n_iters,
        cost=mass * (1.0 - score),
        factors=plan,
        score=score,
        mass=mass,
    )


def _factor_plan(
    zp: ShiftedKernel, py: ShiftedKernel, core: Tensor, f: Tensor, g: Tensor
) -> LowRankPlan:
    mf = f.detach().amax(1, keepdim=True)
    mg = g.detach().amax(1, keepdim=True)
    left = torch.exp(f - mf).unsqueeze(-1) * zp.kernel
    right = py.kernel * torch.exp(g - mg).unsqueeze(1)
    log_scale = (mf + mg + zp.shift + py.shift).squeeze(1)
    return LowRankPlan(left, core, right, log_scale)


def implicit_score(plan: LowRankPlan, z: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. 8 without materialising the plan: ``Tr(Z^T diag(a) K_ZP C K_PY diag(b) Y)`` over
    ``1^T diag(a) K_ZP C K_PY diag(b) 1`` as ``[r, d]`` anchor-space products (``C`` the
    core). Returns the ``[B]`` score and the ``[B]`` transported mass."""
    right = plan.core @ (plan.right @ y)  # [B, r, d]: C K_PY diag(b) Y
    right_mass = (plan.core @ plan.right.sum(2, keepdim=True)).squeeze(-1)  # [B, r]
    left = plan.left.transpose(1, 2) @ z  # [B, r, d]: K_ZP^T diag(a) Z
    num = (left * right).sum((1, 2))
    den = (plan.left.sum(1) * right_mass).sum(1)
    tiny = torch.finfo(den.dtype).tiny
    score = num / torch.where(den.abs() < tiny, torch.full_like(den, tiny), den)
    return score, den * torch.exp(plan.log_scale)


def stabilised_score(score: Tensor) -> Tensor:
    """App. H output clamping: ``tanh`` of the Eq. 8 score (faithful variant)."""
    return torch.tanh(score)
