"""ConceptOT's low-rank Nystrom unbalanced OT through concept anchors (Eq. 4-8, Algorithm 1).

The Gibbs kernel ``K_ij = exp(-(1 - z_i . y_j) / eps)`` is replaced by the Nystrom
factorisation ``K~ = K_ZP K_PP,lambda^-1 K_PY`` (Eq. 4-7) through ``r`` anchors ``P``; the
generalized Sinkhorn updates of Eq. 3 then cost ``O((N + M) r + r^2)`` per iteration and
the plan ``diag(a) K~ diag(b)`` is never materialised: :class:`LowRankPlan` multiplies by
it and the score of Eq. 8 is evaluated through an ``[r, d]`` anchor-space product.

Everything is batched over B pairs (no per-pair loop): anchors are shared ``[r, d]`` (one
``K_PP`` factorisation for the whole batch) or per pair ``[B, r, d]``. Per pair, the
width-``d`` products dominate: ``(N + M) d r`` multiply-adds for the anchor kernels and as
many for Eq. 8's numerator (``K_ZP^T diag(a) Z`` and its product with ``Y^T``), against
``N d M`` for a dense cost matrix; the iterations are batched mat-vecs, ``O((N + M) r)``,
and the marginals, mass and plan scalings come from their last products.

Two variants, chosen by name:

``"faithful"`` -- Algorithm 1 with the stabilisation of Sec. 2.5 / App. H:

* sub-kernels ``K_ZP`` and ``K_YP = K_PY^T`` formed in the log domain and exponentiated
  after subtracting each patch's / token's row maximum (:class:`_AnchorKernel`); the shifts
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

import copy
import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from otviz.knobs import LOWRANK_VARIANTS
from otviz.ot._checks import (
    SolverInputError,
    check_batched,
    check_eps,
    check_tau,
    check_tensors,
    clean_clouds,
    clean_masses,
    clean_where_valid,
)
from otviz.ot._knobs import per_problem
from otviz.ot._result import (
    SolverResult,
    judge_convergence,
    relative_error,
)
from otviz.ot._settings import LowRankSettings, settings_like
from otviz.ot._sync import known_false, on_host
from otviz.ot.costs import COSINE_COST_SCALE
from otviz.ot.sinkhorn import NEG, _effective_mask, _masked_log
from otviz.ot.unbalanced import _damping_exponent

VARIANTS = LOWRANK_VARIANTS


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

    @property
    def row_marginal(self) -> Tensor:
        """``[B, N]`` ``P~ 1``: the solver's sums from its last products, else through the
        factors (never the ``N x M`` plan)."""
        if self.marginals is not None:
            return self.marginals[0]
        return self.factors.apply(self.factors.v.new_ones(*self.factors.v.shape, 1))[..., 0]

    @property
    def col_marginal(self) -> Tensor:
        """``[B, M]`` ``P~^T 1`` (as :attr:`row_marginal`)."""
        if self.marginals is not None:
            return self.marginals[1]
        return self.factors.apply_t(self.factors.u.new_ones(*self.factors.u.shape, 1))[..., 0]

    def apply(self, x: Tensor) -> Tensor:
        """``P~ x`` for ``x [B, M, k]`` -> ``[B, N, k]`` through the factors."""
        return self.factors.apply(x)

    def dense(self) -> Tensor:
        """``[B, N, M]`` the materialised plan (on request only)."""
        return self.factors.dense()


def _anchor_log_kernels(
    z: Tensor,
    y: Tensor,
    anchors: Tensor,
    eps: float | Tensor,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Log Gibbs sub-kernels ``log K_ZP [B, N, r]`` and ``log K_PY [B, r, M]`` (Eq. 5, 7:
    ``-(1 - cos) / eps``), :data:`NEG` on masked patches / tokens. ``anchors`` is ``[r, d]``
    or ``[B, r, d]``."""
    log_zp = _AnchorKernel(z, anchors, eps, row_mask).log_k()
    log_yp = _AnchorKernel(y, anchors, eps, col_mask).log_k()
    return log_zp, log_yp.transpose(1, 2)


def _regularised_anchor_gram(anchors: Tensor, eps: float | Tensor, kpp_reg: float) -> Tensor:
    """``K_PP + lambda I`` (Eq. 6 with App. H's diagonal regularisation); ``[B, r, r]`` when
    the anchors or ``eps`` are per pair."""
    k_pp = torch.exp((anchors @ anchors.transpose(-1, -2) - 1.0) / per_problem(eps, 3))
    eye = torch.eye(anchors.shape[-2], dtype=anchors.dtype, device=anchors.device)
    return k_pp + kpp_reg * eye


def _robust_inverse(k_reg: Tensor) -> Tensor:
    """Inverse of the symmetric ``K_PP,lambda`` (``[r, r]`` or ``[B, r, r]``) from one batched
    Cholesky factorisation; problems whose factorisation fails get the pseudo-inverse (the
    minimum-norm least-squares solution), computed only when needed.

    On an accelerator, where ``cholesky_inverse`` and the eigendecomposition behind
    ``pinv`` read their LAPACK error codes back to the host, the inverse is
    ``L^-T L^-1`` from two triangular solves and the pseudo-inverse comes from
    :func:`_newton_schulz_pinv`, both computed and chosen per problem."""
    chol, info = torch.linalg.cholesky_ex(k_reg)
    bad = info != 0
    if known_false(bad):
        return torch.cholesky_inverse(chol)
    eye = torch.eye(k_reg.shape[-1], dtype=k_reg.dtype, device=k_reg.device)
    bad_m = bad[..., None, None]
    chol, _ = torch.linalg.cholesky_ex(torch.where(bad_m, eye, k_reg))
    if on_host(bad):
        pinv = torch.linalg.pinv(k_reg, hermitian=True)
        return torch.where(bad_m, pinv, torch.cholesky_inverse(chol))
    l_inv = torch.linalg.solve_triangular(chol, eye.expand_as(chol), upper=False)
    return torch.where(bad_m, _newton_schulz_pinv(k_reg), l_inv.mT @ l_inv)


def _newton_schulz_pinv(a: Tensor, steps: int = 64) -> Tensor:
    """Pseudo-inverse of a symmetric positive semi-definite ``a`` (``[..., r, r]``) by the
    Newton-Schulz iteration ``X <- X (2 I - a X)`` from ``X_0 = a / |a|_1^2`` (Ben-Israel &
    Cohen 1966): the iterates stay in ``a``'s range and each eigenvalue's error
    ``1 - lambda x`` is squared per step, so ``steps = 64`` reaches rounding for nonzero
    eigenvalues spanning up to about ``2^58``. Matrix products only: no host read."""
    norm = a.abs().sum(-1).amax(-1, keepdim=True).unsqueeze(-1)  # |a|_1 = |a|_inf
    x = a / norm.square().clamp_min(torch.finfo(a.dtype).tiny)
    two = 2 * torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    for _ in range(steps):
        x = x @ (two - a @ x)
    return x


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


@dataclass
class _KernelProduct:
    """A low-rank kernel product ``K~ e^h`` (or ``K~^T e^h``), ``[B, n]``, held as
    ``s * e^offset`` (``s`` may be negative for the faithful kernel), with the scaling of the
    source side that produced it: ``weights = e^{h + rho - scale}`` (at most 1, ``rho`` the
    source kernel's row maxima) and ``scale [B, 1]``. The weights are the shifted plan
    scalings ``u`` / ``v`` of :class:`LowRankPlan`, so the last products of the iterations
    give the plan, its marginals and its mass with no further pass over the kernels."""

    s: Tensor
    offset: Tensor
    weights: Tensor
    scale: Tensor
    tiny: float

    def log(self, floor: float) -> Tensor:
        """``log(max(K~ e^h, 0) + floor)`` (Alg. 1 lines 9 / 13). With a floor the sum is
        formed in the linear domain when ``e^offset`` is safely finite (``offset <= scale``,
        as the destination's row maxima are at most 1; with masses at most 1 the floor bounds
        the scale by ``-log floor``); a term that underflows there is far below the floor.
        Otherwise (and on an accelerator, where the test would cost a device sync), and
        without a floor, it is formed in the log domain."""
        big = self.scale > 0.5 * math.log(torch.finfo(self.s.dtype).max)
        if floor > 0 and known_false(big | big.isnan()):
            return torch.log(self.s.clamp_min(0.0) * torch.exp(self.offset) + floor)
        out = self.offset + torch.log(self.s.clamp_min(self.tiny))
        return out if floor <= 0 else torch.logaddexp(out, torch.full_like(out, math.log(floor)))

    def marginal(self, h: Tensor, log_scale: Tensor) -> Tensor:
        """``e^h * (K~ e^{h'}) / e^{log_scale}``: a marginal of the plan
        ``diag(e^h) K~ diag(e^{h'})`` over the plan's scale (``[B]``)."""
        return self.s * torch.exp(h + self.offset - log_scale.unsqueeze(1))


def _anchor_products(x: Tensor, anchors: Tensor) -> Tensor:
    """``[B, n, r]`` ``x P^T`` for shared ``[r, d]`` or per-pair ``[B, r, d]`` anchors, as one
    batched product (on CPU faster than the single tall ``[B n, d] x [d, r]`` product)."""
    return torch.bmm(x, anchors.expand(x.shape[0], -1, -1).transpose(1, 2))


class _AnchorKernel:
    """A point-anchor Gibbs kernel ``K [B, n, r]``, ``K_ik = exp((s_i x_i . p_k - 1) / eps)``
    (``s_i`` the inverse norm of an unnormalised ``x_i``, else 1), held as
    ``exp(rho_i) * K^_ik`` with the row maximum ``rho_i`` subtracted before exponentiation
    (App. H): every row of ``K^`` has maximum 1 and ``rho`` is carried in the log domain.
    ``K^`` comes from the product ``x P^T`` in one fused pass and an in-place ``exp``.

    Products with the kernel are batched mat-vecs on scalings shifted by their maximum
    (:meth:`weights`); the maxima are detached: results do not depend on them. The log
    kernel is formed only when an exact log-sum-exp must repair an underflowed sum.
    """

    def __init__(
        self,
        x: Tensor,
        anchors: Tensor,
        eps: float | Tensor,
        mask: Tensor | None = None,
        scale: Tensor | None = None,
        keep_cosine: bool = False,
    ) -> None:
        xp = _anchor_products(x, anchors)  # [B, n, r]
        s = torch.ones_like(xp[..., 0]) if scale is None else scale
        # the cosines x_i . p_k / |x_i|, kept for views on request (one extra pass)
        self.cosine = xp * s.unsqueeze(-1) if keep_cosine else None
        top = xp.detach().amax(2)
        eps_rows = per_problem(eps, 2)
        w = s / eps_rows
        self.shift = (top * s - 1.0) / eps_rows  # rho: log K row maxima, [B, n]
        # K^ = exp((xp - top) * w) in one fused pass; without autograd in the product's memory
        out = None if torch.is_grad_enabled() else xp
        kernel = torch.addcmul((-top * w).unsqueeze(-1), xp, w.unsqueeze(-1), out=out).exp_()
        if mask is not None:
            kernel = kernel.masked_fill(~mask[:, :, None], 0.0)
            self.shift = self.shift.masked_fill(~mask, NEG)
        self.kernel = kernel
        self.tiny = torch.finfo(xp.dtype).tiny * 1e6
        self._parts = (x, anchors, w, eps, mask)
        self._index: Tensor | None = None

    def take(self, index: Tensor | None) -> _AnchorKernel:
        """The kernel of rows ``index`` (``[B]`` long into this kernel's batch; ``None``:
        this kernel): a kernel formed once per distinct image / caption, gathered per pair."""
        if index is None:
            return self
        out = copy.copy(self)
        out.kernel, out.shift = self.kernel[index], self.shift[index]
        out.cosine = None if self.cosine is None else self.cosine[index]
        out._index = index if self._index is None else self._index[index]
        return out

    def log_k(self) -> Tensor:
        """``[B, n, r]`` the log kernel (:data:`NEG` on masked rows), formed on request."""
        x, anchors, w, eps, mask = self._parts
        xp = _anchor_products(x, anchors)
        bias = -1.0 / per_problem(eps, 3)
        if not isinstance(bias, Tensor):
            bias = torch.full_like(xp[:1, :1, :1], bias)
        log_k = torch.addcmul(bias, xp, w.unsqueeze(-1))
        log_k = log_k if mask is None else log_k.masked_fill(~mask[:, :, None], NEG)
        return log_k if self._index is None else log_k[self._index]

    def weights(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``diag(e^h) K = e^{scale} diag(u) K^``: ``(u [B, n] <= 1, scale [B, 1])``."""
        t = h + self.shift
        m = t.detach().amax(1, keepdim=True)
        return torch.exp(t - m), m

    def to_anchors(self, u: Tensor) -> Tensor:
        """``[B, r]`` ``sum_i K^_ik u_i``."""
        return torch.bmm(u.unsqueeze(1), self.kernel).squeeze(1)

    def from_anchors(self, w: Tensor) -> Tensor:
        """``[B, n]`` ``sum_k K^_ik w_k`` (multiply by ``e^{rho_i}`` for ``K w``)."""
        # w^T K^T is the fast orientation of a batched mat-vec on CPU
        return torch.bmm(w.unsqueeze(1), self.kernel.transpose(1, 2)).squeeze(1)

    def lse_to_anchors(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``LSE_i(log K_ik + h_i)`` ``[B, r]``, with the weights and scale of
        :meth:`weights`; sums that underflow are recomputed by ``torch.logsumexp``."""
        u, m = self.weights(h)
        vec = self.to_anchors(u)
        out = m + torch.log(vec.clamp_min(self.tiny))
        low = vec <= self.tiny
        if not known_false(low):
            out = torch.where(low, torch.logsumexp(self.log_k() + h[:, :, None], 1), out)
        return out, u, m


class _FaithfulOps:
    """``K~ e^g`` and ``K~^T e^f`` through the inverse core (Alg. 1 lines 6-8 / 10-12)."""

    def __init__(
        self, zp: _AnchorKernel, yp: _AnchorKernel, inv: Tensor, bound: float | None,
        floor: float,
    ) -> None:
        self.zp, self.yp, self.inv = zp, yp, inv
        self.core = inv
        self.bound, self.floor = bound, floor  # the centred clamp and Alg. 1's 1e-8

    def _through(self, src: _AnchorKernel, dst: _AnchorKernel, h: Tensor) -> _KernelProduct:
        u, scale = src.weights(h)
        q = src.to_anchors(u)  # Alg. 1 l. 6 / 10
        w = (q.unsqueeze(1) @ self.inv).squeeze(1)  # l. 7 / 11 (inv symmetric)
        s = dst.from_anchors(w)  # l. 8 / 12
        return _KernelProduct(s, dst.shift + scale, u, scale, dst.tiny)

    def row(self, g: Tensor) -> _KernelProduct:
        return self._through(self.yp, self.zp, g)

    def col(self, f: Tensor) -> _KernelProduct:
        return self._through(self.zp, self.yp, f)


class _PositiveOps:
    """Exact log-domain products with ``K+ = K_ZP diag(w) K_PY``: log-sum-exps into the
    anchors, then shifted mat-vecs out of them; sums that underflow are recomputed by
    ``torch.logsumexp``."""

    bound = None  # exact log-domain products: no clamp
    floor = 0.0  # and no floor

    def __init__(self, zp: _AnchorKernel, yp: _AnchorKernel, w: Tensor) -> None:
        self.zp, self.yp = zp, yp
        self.core = torch.diag_embed(w)
        log_w = torch.log(w)
        self.log_w = log_w if log_w.dim() == 2 else log_w.unsqueeze(0)

    def _through(self, src: _AnchorKernel, dst: _AnchorKernel, h: Tensor) -> _KernelProduct:
        log_q, u, scale = src.lse_to_anchors(h)
        q = self.log_w + log_q
        m = q.detach().amax(1, keepdim=True)
        s = dst.from_anchors(torch.exp(q - m))
        offset = dst.shift + m
        low = s <= dst.tiny
        if not known_false(low):
            exact = torch.logsumexp(dst.log_k() + q[:, None, :], 2)
            s, offset = torch.where(low, torch.ones_like(s), s), torch.where(low, exact, offset)
        return _KernelProduct(s, offset, u, scale, dst.tiny)

    def row(self, g: Tensor) -> _KernelProduct:
        return self._through(self.yp, self.zp, g)

    def col(self, f: Tensor) -> _KernelProduct:
        return self._through(self.zp, self.yp, f)


@dataclass
class LowRankProblem:
    """A factored unbalanced problem (no cost matrix): the features, anchors and masses of
    :func:`lowrank_uot`, whose Args say what each field holds."""

    z: Tensor
    y: Tensor
    anchors: Tensor
    mu: Tensor
    nu: Tensor
    row_mask: Tensor | None = None
    col_mask: Tensor | None = None
    z_scale: Tensor | None = None
    image_index: Tensor | None = None
    text_index: Tensor | None = None


def _clean_inputs(problem: LowRankProblem, settings: LowRankSettings) -> LowRankProblem:
    """The checks of :mod:`otviz.ot._checks` for the factored problem (no cost matrix):
    batched non-empty features of one width, one dtype and device, masks of their side's
    shape, indices into the distinct sides, finite features on valid rows and finite
    anchors, masses, the variant, ``eps`` and the taus; returns the problem with non-finite
    masked entries set to 0."""
    solver = "lowrank_uot"
    p = problem
    check_tensors(solver, z=p.z, y=p.y, anchors=p.anchors, mu=p.mu, nu=p.nu, z_scale=p.z_scale)
    z, y = clean_clouds(solver, ("z", "y"), p.z, p.y, p.row_mask, p.col_mask,
                        same_batch=False, mask_names=("row_mask", "col_mask"))
    anchors = p.anchors
    if anchors.dim() not in (2, 3) or anchors.shape[-2] == 0:
        raise SolverInputError(f"{solver}: anchors must be [r, d] or [B, r, d], r >= 1")
    if anchors.shape[-1] != z.shape[-1]:
        raise SolverInputError(
            f"{solver}: anchors have width {anchors.shape[-1]}, the features {z.shape[-1]}"
        )
    check_batched("mu", p.mu, 2, "[B, N]", solver)
    check_batched("nu", p.nu, 2, "[B, M]", solver)
    pairs = p.mu.shape[0]
    _check_index("image_index", p.image_index, pairs, z.shape[0], z.device)
    _check_index("text_index", p.text_index, pairs, y.shape[0], y.device)
    if anchors.dim() == 3 and anchors.shape[0] != pairs:
        raise SolverInputError(
            f"{solver}: per-pair anchors have batch {anchors.shape[0]}, the masses {pairs}"
        )
    if (p.image_index is not None or p.text_index is not None) and anchors.dim() != 2:
        raise SolverInputError(
            f"{solver}: per-pair anchors [B, r, d] need per-pair z and y (no index)"
        )
    if not bool(torch.isfinite(anchors.detach()).all()):
        raise SolverInputError(f"{solver}: anchors hold NaN or infinite entries")
    z_scale = p.z_scale
    if z_scale is not None:
        if tuple(z_scale.shape) != tuple(z.shape[:2]):
            raise SolverInputError(
                f"{solver}: z_scale has shape {tuple(z_scale.shape)}, z needs {tuple(z.shape[:2])}"
            )
        z_scale = clean_where_valid("z_scale", z_scale, p.row_mask, solver)
    mu = clean_masses("mu", p.mu, pairs, z.shape[1], solver, _take(p.row_mask, p.image_index))
    nu = clean_masses("nu", p.nu, pairs, y.shape[1], solver, _take(p.col_mask, p.text_index))
    check_eps(settings.eps, solver, pairs, z.dtype, COSINE_COST_SCALE)
    check_tau("tau_a", settings.tau_a, solver, pairs)
    check_tau("tau_b", settings.tau_b, solver, pairs)
    p = replace(p, z=z, y=y, mu=mu, nu=nu, z_scale=z_scale)
    return _per_pair_sides(p) if isinstance(settings.eps, Tensor) and settings.eps.dim() else p


def _per_pair_sides(p: LowRankProblem) -> LowRankProblem:
    """The problem with its distinct sides gathered per pair (no index): a per-pair ``eps``
    gives every pair its own anchor kernels. Equal to the call on the gathered tensors, as
    the index promises."""
    if p.image_index is None and p.text_index is None:
        return p
    return replace(
        p, z=_take(p.z, p.image_index), y=_take(p.y, p.text_index),
        row_mask=_take(p.row_mask, p.image_index), col_mask=_take(p.col_mask, p.text_index),
        z_scale=_take(p.z_scale, p.image_index), image_index=None, text_index=None,
    )


def _check_index(
    name: str, index: Tensor | None, pairs: int, distinct: int, device: torch.device
) -> None:
    """``index`` (``None``: one side per pair, so ``distinct == pairs``) is a ``[pairs]``
    integer tensor with entries in ``[0, distinct)``, on ``device``."""
    side = "z" if name == "image_index" else "y"
    if index is None:
        if distinct != pairs:
            raise SolverInputError(
                f"lowrank_uot: {side} holds {distinct} problems, the masses {pairs}; pass "
                f"{name} to pair distinct sides"
            )
        return
    if index.dtype != torch.long or tuple(index.shape) != (pairs,) or index.device != device:
        raise SolverInputError(
            f"lowrank_uot: {name} must be a [{pairs}] long tensor on {device}, got "
            f"{index.dtype} {tuple(index.shape)} on {index.device}"
        )
    if bool(((index < 0) | (index >= distinct)).any()):
        raise SolverInputError(f"lowrank_uot: {name} must index [0, {distinct}) of {side}")


def _take(x: Tensor | None, index: Tensor | None) -> Tensor | None:
    """``x[index]`` (``x`` itself when either is ``None``)."""
    return x if x is None or index is None else x[index]


def lowrank_uot(
    z: Tensor,
    y: Tensor,
    anchors: Tensor,
    mu: Tensor,
    nu: Tensor,
    settings: LowRankSettings,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
    z_scale: Tensor | None = None,
    image_index: Tensor | None = None,
    text_index: Tensor | None = None,
) -> LowRankResult:
    """Low-rank generalized Sinkhorn with concept anchors (ConceptOT Algorithm 1, Eq. 3-8).

    Args:
        z: ``[B, N, d]`` L2-normalised patch features.
        y: ``[B, M, d]`` L2-normalised token features.
        anchors: ``[r, d]`` shared or ``[B, r, d]`` per-pair L2-normalised anchors.
        mu, nu: ``[B, N]``, ``[B, M]`` positive reference masses.
        settings: :class:`otviz.ot.LowRankSettings`: ``eps``, ``tau_a``, ``tau_b`` of
            Eq. 3; ``n_iters`` (ConceptOT's model runs a fixed ``L = 5``, ``tol=None``);
            ``tol`` (stop once every problem's relative error, ``marginal_error`` over the
            plan's mass, is ``<= tol``, warn when some is not after ``n_iters``; ``None``:
            exactly ``n_iters``, :mod:`otviz.ot._result`); ``kpp_reg``, ``variant``
            (module docstring), ``clamp`` and ``floor``.
        row_mask, col_mask: optional validity masks of patches and tokens, shaped like
            ``z`` / ``y``'s first two dimensions (masked features may hold anything).
        z_scale: optional ``[B, N]`` inverse norms when ``z`` comes unnormalised (the unit
            patch features are ``z * z_scale[..., None]``; see
            :meth:`otviz.methods.projected.ProjectedMethod.project_scaled`).
        image_index, text_index: optional ``[B]`` long: pair ``p`` is patch set
            ``image_index[p]`` of ``z`` (and ``z_scale``, ``row_mask``) and token set
            ``text_index[p]`` of ``y`` (and ``col_mask``), so ``z`` / ``y`` hold each distinct
            image / caption once and the anchor kernels (Eq. 5, 7: ``(N + M) d r``
            multiply-adds a pair) are formed once for each, then gathered; ``mu``, ``nu`` stay
            per pair. Needs shared ``[r, d]`` anchors. The result equals the call on the
            gathered tensors.

    Returns:
        :class:`LowRankResult` (``extras``: ``patch_anchor_cosine [B, N, r]``, and
        ``patch_anchor_affinity [B, N, r]``, ``token_anchor_affinity [B, M, r]``: ``K_ZP``,
        ``K_YP`` over their row maxima, ``exp((cos - max_k cos) / eps)``, each patch's /
        token's best anchor at 1); ``row_marginal [B, N]`` ``P~ 1`` and ``col_marginal
        [B, M]`` ``P~^T 1``, from the iterations' last products;
        ``log_u``/``log_v`` the log-scalings ``log a``, ``log b`` for
        the unshifted sub-kernels (``-inf`` where masked), the factored plan, the raw Eq. 8
        score, the transported mass, ``cost = <C, P~>`` with ``C = 1 - z.y``, and
        ``marginal_error`` = ``sum_i |e^{f_i} - e^{f'_i}| (max(K~ b, 0)_i + floor) +
        e^{f_i} max(-K~ b, 0)_i`` with ``f' = alpha_v (log mu - log(max(K~ b, 0) + floor))``
        the next row update: the L1 distance of the row marginal the update sees to its
        own fixed point, the floor included (as :func:`otviz.ot.unbalanced.sinkhorn_unbalanced_log`
        measures its update's), so a plan that has stopped changing reports converged,
        plus the mass a faithful plan's iterations did not see where ``K~ b`` went
        negative.

    Raises:
        SolverInputError: non-batched or empty inputs, features of different widths,
            non-finite features on valid rows, bad masses, masks or indices, mixed dtypes
            or devices, ``eps`` below the dtype's floor for cosine costs
            (:func:`otviz.ot._knobs.eps_floor`), ``eps`` or ``tau`` of the wrong batch;
            the settings themselves are checked when made (:class:`LowRankSettings`).
    """
    problem = LowRankProblem(
        z, y, anchors, mu, nu, row_mask, col_mask, z_scale, image_index, text_index
    )
    problem = _clean_inputs(problem, settings)
    return solve_lowrank(problem, settings_like(settings, problem.z))


def solve_lowrank(problem: LowRankProblem, settings: LowRankSettings) -> LowRankResult:
    """:func:`lowrank_uot` on a problem its caller has already checked (a method checks
    its inputs once at its boundary): anchor kernels, Algorithm 1's iterations, then the
    factored plan and its Eq. 8 score; no validation."""
    p = problem
    row_mask, col_mask = _effective_mask(p.row_mask), _effective_mask(p.col_mask)
    zp = _AnchorKernel(p.z, p.anchors, settings.eps, row_mask, p.z_scale, keep_cosine=True)
    zp = zp.take(p.image_index)
    yp = _AnchorKernel(p.y, p.anchors, settings.eps, col_mask).take(p.text_index)  # [B, M, r]
    row_mask, col_mask = _take(row_mask, p.image_index), _take(col_mask, p.text_index)
    ops = _kernel_ops(zp, yp, p.anchors, settings)
    state = _iterate(ops, p.mu, p.nu, settings, row_mask, col_mask)
    return judge_convergence(
        _result(ops, state, p, zp, yp, row_mask, col_mask), settings.tol, "lowrank_uot",
        settings.n_iters,
    )


def _kernel_ops(
    zp: _AnchorKernel, yp: _AnchorKernel, anchors: Tensor, settings: LowRankSettings
) -> _FaithfulOps | _PositiveOps:
    """The kernel products of the variant: through ``K_PP,lambda^-1`` (faithful, Eq. 6-7)
    or through the diagonal ``w = 1 / ((K_PP + lambda I) 1)`` (positive)."""
    k_reg = _regularised_anchor_gram(anchors, settings.eps, settings.kpp_reg)
    if settings.variant == "faithful":
        return _FaithfulOps(zp, yp, _robust_inverse(k_reg), settings.clamp, settings.floor)
    w = 1.0 / k_reg.sum(-1)
    return _PositiveOps(zp, yp, w)


@dataclass
class _IterationState:
    """After Algorithm 1's loop: the log-scalings ``f [B, N]``, ``g [B, M]``, the last
    products ``K~ b`` (``row``) and ``K~^T a`` (``col``) at them, the floored ``log K~ b``
    and the iterations run."""

    f: Tensor
    g: Tensor
    row: _KernelProduct
    col: _KernelProduct
    log_kb: Tensor
    log_mu: Tensor
    alpha_a: float | Tensor
    n_iters: int


def _iterate(
    ops: _FaithfulOps | _PositiveOps,
    mu: Tensor,
    nu: Tensor,
    settings: LowRankSettings,
    row_mask: Tensor | None,
    col_mask: Tensor | None,
) -> _IterationState:
    """Algorithm 1 lines 5-14: alternate ``a <- (mu / (K~ b + floor))^alpha_a`` and
    ``b <- (nu / (K~^T a + floor))^alpha_b`` in the log domain (centred and clamped for the
    faithful variant), stopping early at ``settings.tol``."""
    alpha_a = _damping_exponent(settings.tau_a, settings.eps)
    alpha_b = _damping_exponent(settings.tau_b, settings.eps)
    bound, floor, tol = ops.bound, ops.floor, settings.tol
    log_mu = _masked_log(mu, row_mask)
    log_nu = _masked_log(nu, col_mask)
    f = _hold(torch.zeros_like(log_mu), row_mask)
    g = _hold(torch.zeros_like(log_nu), col_mask)
    col = None
    done = 0
    for _ in range(settings.n_iters):
        row = ops.row(g)
        log_kb = row.log(floor)
        f_next = _hold(_centre_clamp(alpha_a * (log_mu - log_kb), row_mask, bound), row_mask)
        if tol is not None and done > 0:
            gap, mass = _row_gap(row, f, alpha_a * (log_mu - log_kb), log_kb, row_mask)
            if bool((relative_error(gap.detach(), mass.detach()) <= tol).all()):
                break
        f = f_next
        col = ops.col(f)
        g = _hold(_centre_clamp(alpha_b * (log_nu - col.log(floor)), col_mask, bound), col_mask)
        done += 1
    col = ops.col(f) if col is None else col  # K~^T a at the final a
    row = ops.row(g)  # K~ b at the final b
    return _IterationState(f, g, row, col, row.log(floor), log_mu, alpha_a, done)


def _result(
    ops: _FaithfulOps | _PositiveOps,
    state: _IterationState,
    problem: LowRankProblem,
    zp: _AnchorKernel,
    yp: _AnchorKernel,
    row_mask: Tensor | None,
    col_mask: Tensor | None,
) -> LowRankResult:
    """The factored plan, its marginals and mass from the last products, the Eq. 8 score
    and the fixed-point residual."""
    f, g, row, col = state.f, state.g, state.row, state.col
    residual, _ = _row_gap(
        row, f, state.alpha_a * (state.log_mu - state.log_kb), state.log_kb, row_mask
    )
    plan = LowRankPlan(
        zp.kernel, yp.kernel, ops.core, col.weights, row.weights,
        (col.scale + row.scale).squeeze(1),
    )
    # marginals and Eq. 8 from sums over e^{log_scale} (the score is a ratio of two such
    # sums, so no overflow of the scale reaches it)
    rows, cols = row.marginal(f, plan.log_scale), col.marginal(g, plan.log_scale)
    shifted_mass = rows.sum(1)  # 1^T P~ 1 = sum_i a_i (K~ b)_i
    tiny = torch.finfo(shifted_mass.dtype).tiny
    p = problem
    numerator = _shifted_similarity(
        plan, p.z, p.y, _take(p.z_scale, p.image_index), p.image_index, p.text_index
    )
    score = numerator / torch.where(
        shifted_mass.abs() < tiny, torch.full_like(shifted_mass, tiny), shifted_mass
    )
    scale = torch.exp(plan.log_scale)
    mass = shifted_mass * scale
    log_u = f if row_mask is None else f.masked_fill(~row_mask, -float("inf"))
    log_v = g if col_mask is None else g.masked_fill(~col_mask, -float("inf"))
    return LowRankResult(
        plan=None,
        log_u=log_u,
        log_v=log_v,
        marginal_error=residual,
        n_iters=state.n_iters,
        cost=mass * (1.0 - score),
        factors=plan,
        score=score,
        mass=mass,
        plan_mass=mass,
        marginals=(rows * scale.unsqueeze(1), cols * scale.unsqueeze(1)),
        extras={
            "patch_anchor_cosine": zp.cosine,
            "patch_anchor_affinity": zp.kernel,
            "token_anchor_affinity": yp.kernel,
        },
    )


def _row_gap(
    row: _KernelProduct, f: Tensor, f_next: Tensor, log_kb_floored: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``[B]`` the distance of the row scaling to the fixed point of its own update (Alg. 1
    line 9, ``e^{f'} = (mu / (max(K~ b, 0) + floor))^alpha``, before the clamp):
    ``sum_i |e^{f_i} - e^{f'_i}| (max(K~ b, 0)_i + floor) + e^{f_i} max(-K~ b, 0)_i``,
    the L1 move of the row marginal the update sees (floor included) plus the mass the
    iterations do not see where the faithful ``K~ b`` went negative. It is 0 exactly when
    the update leaves the plan unchanged and ``K~ b >= 0``, the floor or not. Returned
    with the plan's mass ``1^T P~ 1`` ``[B]`` (``e^f K~ b`` summed), the scale of its
    relative error."""
    rows = row.s * torch.exp(f + row.offset)
    seen = torch.exp(f + log_kb_floored)
    gap = (seen - torch.exp(f_next + log_kb_floored)).abs()
    gap = gap + row.s.clamp_max(0.0).abs() * torch.exp(f + row.offset)
    if mask is not None:
        gap, rows = gap.masked_fill(~mask, 0.0), rows.masked_fill(~mask, 0.0)
    return gap.sum(1), rows.sum(1)


def _shifted_similarity(
    plan: LowRankPlan,
    z: Tensor,
    y: Tensor,
    z_scale: Tensor | None = None,
    image_index: Tensor | None = None,
    text_index: Tensor | None = None,
) -> Tensor:
    """``[B]`` the numerator of Eq. 8 over ``e^{log_scale}``, without materialising the
    plan: ``sum_ij P~_ij z_i . y_j = Tr(Z^T diag(a) K_ZP C K_PY diag(b) Y)``, contracted as
    ``<C K_PY diag(b), (K_ZP^T diag(a) Z) Y^T>`` over ``[r, M]`` (``C`` the core; ``z`` may
    come unnormalised with its per-pair inverse norms ``z_scale``; with ``image_index`` /
    ``text_index``, ``z`` / ``y`` hold distinct images / captions, as in
    :func:`lowrank_uot`). Divided by the mass ``1^T P~ 1`` (over the same scale) it is the
    score."""
    wz = plan.u if z_scale is None else plan.u * z_scale
    kernel = (plan.kernel_zp * wz.unsqueeze(-1)).transpose(1, 2)  # [B, r, N]
    right = plan.core @ (plan.kernel_yp * plan.v.unsqueeze(-1)).transpose(1, 2)  # [B, r, M]
    left = kernel @ z if image_index is None else _pair_products(kernel, z, image_index)
    y = y if text_index is None else y[text_index]  # [B, M, d]: the small side
    return (right * (left @ y.transpose(1, 2))).sum((1, 2))  # left: [B, r, d]


def _pair_products(a: Tensor, x: Tensor, index: Tensor, chunk_bytes: int = 2**23) -> Tensor:
    """``[B, p, d]`` the products ``a[b] @ x[index[b]]`` (``a [B, p, n]``, ``x [I, n, d]``)
    without a ``[B, n, d]`` copy of ``x`` (more memory traffic, and page faults, than the
    products). When the groups of pairs sharing an ``x`` are even enough that padding them
    to the largest adds at most half the work, the ``a`` of each group are stacked and
    multiply their ``x`` in one product per distinct ``x``; otherwise ``x`` is gathered for
    about ``chunk_bytes`` of pairs at a time."""
    pairs, p, n = a.shape
    groups = x.shape[0]
    counts = torch.bincount(index, minlength=groups)
    width = int(counts.max()) if pairs else 0
    if 2 * groups * width <= 3 * pairs:
        order = torch.argsort(index, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.empty_like(index)
        slot[order] = torch.arange(pairs, device=index.device) - starts[index[order]]
        stacked = a.new_zeros(groups, width, p, n)
        stacked[index, slot] = a
        out = stacked.view(groups, width * p, n) @ x  # [I, width p, d]
        return out.view(groups, width, p, x.shape[-1])[index, slot]
    step = max(1, chunk_bytes // (x[0].numel() * x.element_size()))
    return torch.cat([a[s : s + step] @ x[index[s : s + step]] for s in range(0, pairs, step)])


def stabilised_score(score: Tensor) -> Tensor:
    """App. H output clamping: ``tanh`` of the Eq. 8 score (faithful variant)."""
    return torch.tanh(score)
