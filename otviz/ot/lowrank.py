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

* sub-kernels ``K_ZP`` and ``K_YP = K_PY^T`` formed in the log domain and exponentiated
  after subtracting each patch's / token's row maximum (:class:`AnchorKernel`); the shifts
  are carried exactly in the log domain, so the iterates are unchanged by them;
* ``K_PP + lambda I`` factorised once (batched Cholesky, ``cholesky_ex``) into its inverse;
  problems whose Cholesky fails use the pseudo-inverse (the least-squares solution), so
  every solve in the iterations, the score and the heatmap is robust;
* updates ``a <- (mu / (K~ b + 1e-8))^alpha_v`` (Alg. 1 lines 6-9; ``K~ b`` is clamped at 0
  first, because the inverse can make it negative, where Alg. 1's power is undefined) and
  likewise for ``b``. The ``1e-8`` is absolute: next to kernel entries of ``e^{-1/eps}``
  (``8e-7`` at eps = 0.07 for orthogonal vectors) it is not negligible;
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
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from otviz.ot.result import SolverResult
from otviz.ot.sinkhorn import NEG, effective_mask, masked_log
from otviz.ot.unbalanced import damping_exponent

VARIANTS = ("faithful", "positive")


@dataclass
class LowRankPlan:
    """The plan ``diag(a) K_ZP C K_PY diag(b)`` held in factors, never materialised unless
    :meth:`dense` is called: ``exp(log_scale) * left @ core @ right``.

    With ``K_ZP = diag(e^rho) K^_ZP`` (row maxima ``rho`` taken out, App. H) the plan is
    ``e^{log_scale} diag(u) K^_ZP C K^_YP^T diag(v)`` where ``u = e^{log a + rho - m_a}`` and
    ``v = e^{log b + gamma - m_b}`` are at most 1 and ``log_scale = m_a + m_b``.

    Attributes:
        kernel_zp: ``[B, N, r]`` row-max-shifted ``K^_ZP``.
        kernel_yp: ``[B, M, r]`` row-max-shifted ``K^_YP = K^_PY^T``.
        core: ``[r, r]`` or ``[B, r, r]``: ``K_PP,lambda^-1`` (faithful) or ``diag(w)``.
        u, v: ``[B, N]``, ``[B, M]`` the shifted scalings.
        log_scale: ``[B]``.
    """

    kernel_zp: Tensor
    kernel_yp: Tensor
    core: Tensor
    u: Tensor
    v: Tensor
    log_scale: Tensor

    def _scale(self, x: Tensor) -> Tensor:
        return x * torch.exp(self.log_scale).reshape(-1, *([1] * (x.dim() - 1)))

    @property
    def left(self) -> Tensor:
        """``[B, N, r]`` the shifted left factor ``diag(u) K^_ZP`` (formed on request)."""
        return self.u.unsqueeze(-1) * self.kernel_zp

    @property
    def right(self) -> Tensor:
        """``[B, r, M]`` the shifted right factor ``K^_PY diag(v)`` (formed on request)."""
        return (self.v.unsqueeze(-1) * self.kernel_yp).transpose(1, 2)

    def dense(self) -> Tensor:
        """Materialise ``[B, N, M]`` (on request only; the solver never does)."""
        return self._scale(self.left @ (self.core @ self.right))

    def apply(self, v: Tensor) -> Tensor:
        """``plan @ v`` for ``v [B, M, k]`` -> ``[B, N, k]`` in ``O((N + M) r k + r^2 k)``."""
        t = self.kernel_yp.transpose(1, 2) @ (self.v.unsqueeze(-1) * v)
        return self._scale(self.u.unsqueeze(-1) * (self.kernel_zp @ (self.core @ t)))

    def apply_t(self, w: Tensor) -> Tensor:
        """``plan^T @ w`` for ``w [B, N, k]`` -> ``[B, M, k]``."""
        t = self.kernel_zp.transpose(1, 2) @ (self.u.unsqueeze(-1) * w)
        t = self.core.transpose(-1, -2) @ t
        return self._scale(self.v.unsqueeze(-1) * (self.kernel_yp @ t))


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
    log_zp = AnchorKernel(z, anchors, eps, row_mask).log_k()
    log_yp = AnchorKernel(y, anchors, eps, col_mask).log_k()
    return log_zp, log_yp.transpose(1, 2)


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


class AnchorKernel:
    """A point-anchor Gibbs kernel ``K [B, n, r]``, ``K_ik = exp((s_i x_i . p_k - 1) / eps)``
    (``s_i`` the inverse norm of an unnormalised ``x_i``, else 1), held as
    ``exp(rho_i) * K^_ik`` with the row maximum ``rho_i`` subtracted before exponentiation
    (App. H): every row of ``K^`` has maximum 1 and ``rho`` is carried in the log domain.
    ``K^`` comes from the product ``x P^T`` in one fused pass and an in-place ``exp``.

    Products with the kernel come in two kinds: exact log-sum-exps (the positive variant;
    entries whose shifted sum underflows are recomputed by ``torch.logsumexp`` on the log
    kernel, formed only then) and linear products in a shared log scale (the faithful
    variant, whose anchor vectors may be negative after the inverse). The maxima are
    detached: results do not depend on them.
    """

    def __init__(
        self,
        x: Tensor,
        anchors: Tensor,
        eps: float,
        mask: Tensor | None = None,
        scale: Tensor | None = None,
        keep_cosine: bool = False,
    ) -> None:
        xp = x @ anchors.transpose(-1, -2)  # [B, n, r]
        s = torch.ones_like(xp[..., 0]) if scale is None else scale
        # the cosines x_i . p_k / |x_i|, kept for views on request (one extra pass)
        self.cosine = xp * s.unsqueeze(-1) if keep_cosine else None
        top = xp.detach().amax(2)
        w = s / eps
        self.shift = (top * s - 1.0) / eps  # rho: log K row maxima, [B, n]
        if torch.is_grad_enabled():
            kernel = torch.addcmul((-top * w).unsqueeze(-1), xp, w.unsqueeze(-1)).exp_()
        else:  # reuse the product's memory
            kernel = xp.sub_(top.unsqueeze(-1)).mul_(w.unsqueeze(-1)).exp_()
        if mask is not None:
            kernel = kernel.masked_fill(~mask[:, :, None], 0.0)
            self.shift = self.shift.masked_fill(~mask, NEG)
        self.kernel = kernel
        self.tiny = torch.finfo(xp.dtype).tiny * 1e6
        self._parts = (x, anchors, w, eps, mask)

    def log_k(self) -> Tensor:
        """``[B, n, r]`` the log kernel (:data:`NEG` on masked rows), formed on request."""
        x, anchors, w, eps, mask = self._parts
        xp = x @ anchors.transpose(-1, -2)
        log_k = torch.addcmul(torch.full_like(xp[:1, :1, :1], -1.0 / eps), xp, w.unsqueeze(-1))
        return log_k if mask is None else log_k.masked_fill(~mask[:, :, None], NEG)

    def _repair(self, out: Tensor, s: Tensor, exact: Callable[[], Tensor]) -> Tensor:
        low = s <= self.tiny
        return torch.where(low, exact(), out) if bool(low.any()) else out

    def to_anchors(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``sum_i K_ik e^{h_i} = e^{scale} vec_k``: ``(vec [B, r], scale [B, 1])``."""
        t = h + self.shift
        m = t.detach().amax(1, keepdim=True)
        return torch.bmm(torch.exp(t - m).unsqueeze(1), self.kernel).squeeze(1), m

    def from_anchors(self, u: Tensor) -> Tensor:
        """``[B, n]`` ``sum_k K^_ik u_k`` (multiply by ``e^{rho_i}`` for ``K u``)."""
        # u^T K^T is the fast orientation of a batched mat-vec on CPU
        return torch.bmm(u.unsqueeze(1), self.kernel.transpose(1, 2)).squeeze(1)

    def lse_to_anchors(self, h: Tensor) -> Tensor:
        """``[B, r]`` ``LSE_i(log K_ik + h_i)``."""
        vec, m = self.to_anchors(h)
        out = m + torch.log(vec.clamp_min(self.tiny))
        return self._repair(out, vec, lambda: torch.logsumexp(self.log_k() + h[:, :, None], 1))

    def lse_from_anchors(self, q: Tensor) -> Tensor:
        """``[B, n]`` ``LSE_k(log K_ik + q_k)``."""
        m = q.detach().amax(1, keepdim=True)
        s = self.from_anchors(torch.exp(q - m))
        out = self.shift + m + torch.log(s.clamp_min(self.tiny))
        return self._repair(out, s, lambda: torch.logsumexp(self.log_k() + q[:, None, :], 2))

    def scaling(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``diag(e^h) K = e^{scale} diag(u) K^``: ``(u [B, n] <= 1, scale [B])``."""
        t = h + self.shift
        m = t.detach().amax(1, keepdim=True)
        return torch.exp(t - m), m.squeeze(1)


class _FaithfulOps:
    """``log(K~ e^g + floor)`` and ``log(K~^T e^f + floor)`` through the inverse (Alg. 1)."""

    def __init__(self, zp: AnchorKernel, yp: AnchorKernel, inv: Tensor, floor: float) -> None:
        self.zp, self.yp, self.inv = zp, yp, inv
        self.log_floor = math.log(floor) if floor > 0 else None

    def _through(self, src: AnchorKernel, dst: AnchorKernel, h: Tensor) -> Tensor:
        q, scale = src.to_anchors(h)  # Alg. 1 l. 6 / 10
        u = (q.unsqueeze(1) @ self.inv).squeeze(1)  # l. 7 / 11 (inv symmetric)
        s = dst.from_anchors(u)  # l. 8 / 12
        out = dst.shift + scale + torch.log(s.clamp_min(dst.tiny))
        if self.log_floor is None:
            return out
        return torch.logaddexp(out, torch.full_like(out, self.log_floor))

    def row(self, g: Tensor) -> Tensor:
        return self._through(self.yp, self.zp, g)

    def col(self, f: Tensor) -> Tensor:
        return self._through(self.zp, self.yp, f)


class _PositiveOps:
    """Exact log-domain ``log(K+ e^g)`` and ``log(K+^T e^f)`` for ``K+ = K_ZP diag(w) K_PY``."""

    def __init__(self, zp: AnchorKernel, yp: AnchorKernel, log_w: Tensor) -> None:
        self.zp, self.yp = zp, yp
        self.log_w = log_w if log_w.dim() == 2 else log_w.unsqueeze(0)

    def row(self, g: Tensor) -> Tensor:
        return self.zp.lse_from_anchors(self.log_w + self.yp.lse_to_anchors(g))

    def col(self, f: Tensor) -> Tensor:
        return self.yp.lse_from_anchors(self.log_w + self.zp.lse_to_anchors(f))


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
    z_scale: Tensor | None = None,
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
        z_scale: optional ``[B, N]`` inverse norms when ``z`` comes unnormalised (the unit
            patch features are ``z * z_scale[..., None]``; see
            :meth:`otviz.methods.projected.ProjectedMethod.project_scaled`).

    Returns:
        :class:`LowRankResult` (``extras``: ``patch_anchor_cosine [B, N, r]``, and
        ``patch_anchor_affinity [B, N, r]``, ``token_anchor_affinity [B, M, r]``: ``K_ZP``,
        ``K_YP`` over their row maxima, ``exp((cos - max_k cos) / eps)``, each patch's /
        token's best anchor at 1):
        ``log_u``/``log_v`` the log-scalings ``log a``, ``log b`` for
        the unshifted sub-kernels (``-inf`` where masked), the factored plan, the raw Eq. 8
        score, the transported mass, ``cost = <C, P~>`` with ``C = 1 - z.y``, and
        ``marginal_error`` = the fixed-point residual ``max_i |log a_i - alpha_v (log mu_i -
        log (K~ b)_i)|`` (as in :func:`otviz.ot.unbalanced.sinkhorn_unbalanced_log`).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown low-rank variant {variant!r}; known: {VARIANTS}")
    alpha_a = damping_exponent(tau_a, eps)
    alpha_b = damping_exponent(tau_b, eps)
    row_mask, col_mask = effective_mask(row_mask), effective_mask(col_mask)
    zp = AnchorKernel(z, anchors, eps, row_mask, z_scale, keep_cosine=True)  # [B, N, r]
    yp = AnchorKernel(y, anchors, eps, col_mask)  # [B, M, r]
    k_reg = regularised_anchor_gram(anchors, eps, kpp_reg)
    ops: _FaithfulOps | _PositiveOps
    if variant == "faithful":
        core = robust_inverse(k_reg)
        ops = _FaithfulOps(zp, yp, core, floor)
        bound = clamp
    else:
        w = 1.0 / k_reg.sum(-1)
        core = torch.diag_embed(w)
        ops = _PositiveOps(zp, yp, torch.log(w))
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

    plan = _factor_plan(zp, yp, core, f, g)
    score, mass = implicit_score(plan, z, y, z_scale)
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
        extras={
            "patch_anchor_cosine": zp.cosine,
            "patch_anchor_affinity": zp.kernel,
            "token_anchor_affinity": yp.kernel,
        },
    )


def _factor_plan(
    zp: AnchorKernel, yp: AnchorKernel, core: Tensor, f: Tensor, g: Tensor
) -> LowRankPlan:
    u, scale_f = zp.scaling(f)
    v, scale_g = yp.scaling(g)
    return LowRankPlan(zp.kernel, yp.kernel, core, u, v, scale_f + scale_g)


def implicit_score(
    plan: LowRankPlan, z: Tensor, y: Tensor, z_scale: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Eq. 8 without materialising the plan: ``Tr(Z^T diag(a) K_ZP C K_PY diag(b) Y)`` over
    ``1^T diag(a) K_ZP C K_PY diag(b) 1`` as ``[r, d]`` anchor-space products (``C`` the
    core; ``z`` may come unnormalised with its inverse norms ``z_scale``). Returns the
    ``[B]`` score and the ``[B]`` transported mass."""
    v = plan.v.unsqueeze(1)  # [B, 1, M]
    right = plan.core @ ((plan.kernel_yp.transpose(1, 2) * v) @ y)  # [B, r, d]
    right_mass = (plan.core @ (v @ plan.kernel_yp).transpose(1, 2)).squeeze(-1)  # [B, r]
    wz = plan.u if z_scale is None else plan.u * z_scale
    left = (plan.kernel_zp * wz.unsqueeze(-1)).transpose(1, 2) @ z  # [B, r, d]
    num = (left * right).sum((1, 2))
    den = ((plan.u.unsqueeze(1) @ plan.kernel_zp).squeeze(1) * right_mass).sum(1)
    tiny = torch.finfo(den.dtype).tiny
    score = num / torch.where(den.abs() < tiny, torch.full_like(den, tiny), den)
    return score, den * torch.exp(plan.log_scale)


def stabilised_score(score: Tensor) -> Tensor:
    """App. H output clamping: ``tanh`` of the Eq. 8 score (faithful variant)."""
    return torch.tanh(score)
