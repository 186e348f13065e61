"""CAME: the parameter-free Context-Aware Marginal Estimator of QC-Align (Sec. 3, design 2).

For one pair with region features ``v_n`` and token features ``t_m``:

(a) cross-modal context: ``alpha_mn = softmax_n(phi(cos(t_m, v_n)))`` with ``phi`` a
    leaky-ReLU that shrinks negative similarities, ``t~_m = sum_n alpha_mn v_n``; and
    symmetrically ``beta_nm = softmax_m(phi(cos(v_n, t_m)))``, ``v~_n = sum_m beta_nm t_m``;
(b) discriminative scores ``r_m = cos(t_m, t~_m)``, ``r_n = cos(v_n, v~_n)``, normalised by a
    (log-sum-exp stable) softmax into importance weights ``w^m``, ``w^n``;
(c) marginals projected back through the attention: ``mu[n] = sum_m alpha_mn w^m`` and
    ``nu[m] = sum_n beta_nm w^n``.

Both marginals are non-negative and sum to one because every attention row and every weight
vector does. The paper fixes no softmax temperature and no leaky slope; the defaults here are
temperature 1 (the plain softmax the paper writes) and PyTorch's default slope 0.01.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from otviz.ot._checks import SolverInputError, check_tensors, clean_clouds
from otviz.ot._knobs import check_number


@dataclass
class CameResult:
    """CAME outputs for a batch of pairs.

    Attributes:
        mu: ``[B, N]`` visual marginal (zero on masked patches), sums to one.
        nu: ``[B, M]`` textual marginal (zero on masked tokens), sums to one.
        attn_t2v: ``[B, M, N]`` ``alpha`` (each valid row sums to one over patches).
        attn_v2t: ``[B, N, M]`` ``beta`` (each valid row sums to one over tokens).
        weight_t: ``[B, M]`` token importance weights ``w^m``.
        weight_v: ``[B, N]`` patch importance weights ``w^n``.
    """

    mu: Tensor
    nu: Tensor
    attn_t2v: Tensor
    attn_v2t: Tensor
    weight_t: Tensor
    weight_v: Tensor


def _masked_softmax(logits: Tensor, mask: Tensor | None) -> Tensor:
    """Softmax over the last dim restricted to ``mask`` (masked entries get exactly 0)."""
    if mask is None:
        return torch.softmax(logits, dim=-1)
    out = torch.softmax(logits.masked_fill(~mask, torch.finfo(logits.dtype).min), dim=-1)
    return out * mask.to(out.dtype)


def _side(
    query: Tensor,
    keys: Tensor,
    sim: Tensor,
    query_mask: Tensor | None,
    key_mask: Tensor | None,
    negative_slope: float,
    temperature: float,
) -> tuple[Tensor, Tensor]:
    """Attention of ``query`` units over ``keys`` (step a) and the queries' weights (step b)."""
    logits = F.leaky_relu(sim, negative_slope) / temperature
    attn = _masked_softmax(logits, None if key_mask is None else key_mask[:, None, :])
    context = attn @ keys
    score = F.cosine_similarity(query, context, dim=-1)
    return attn, _masked_softmax(score, query_mask)


def came_marginals(
    v: Tensor,
    t: Tensor,
    v_mask: Tensor | None = None,
    t_mask: Tensor | None = None,
    negative_slope: float = 0.01,
    temperature: float = 1.0,
) -> CameResult:
    """Context-aware marginals ``mu`` (visual) and ``nu`` (textual) of QC-Align's CAME.

    Args:
        v: ``[B, N, d]`` region/patch features.
        t: ``[B, M, d]`` token features.
        v_mask, t_mask: optional ``[B, N]`` / ``[B, M]`` bool validity masks.
        negative_slope: slope of the leaky-ReLU ``phi`` on negative cosines (finite,
            >= 0).
        temperature: softmax temperature (finite, > 0) of the attention (1 = the paper's
            plain softmax); lower values sharpen the attention and make the quotas less
            uniform.

    Returns:
        :class:`CameResult`.

    Raises:
        SolverInputError: unbatched or empty features, features of different widths or
            batches, mixed dtypes or devices, bad masks, a mask with no valid entry in a
            problem, NaN on valid features (masked features may hold anything);
            :class:`otviz.ot._errors.KnobError` for a NaN, infinite or out-of-range
            ``negative_slope`` or ``temperature``.
    """
    solver = "came_marginals"
    check_number("negative_slope", negative_slope, solver, at_least=0.0)
    check_number("temperature", temperature, solver, above=0.0)
    check_tensors(solver, v=v, t=t)
    v, t = clean_clouds(solver, ("v", "t"), v, t, v_mask, t_mask)
    for name, mask in (("v_mask", v_mask), ("t_mask", t_mask)):
        if mask is not None and not bool(mask.any(1).all()):
            k = int((~mask.any(1)).nonzero()[0])
            raise SolverInputError(
                f"{solver}: {name} masks out every entry of problem {k}; its quotas would "
                "be all zero: give each problem at least one valid entry"
            )
    return solve_came(v, t, v_mask, t_mask, negative_slope, temperature)


def solve_came(
    v: Tensor,
    t: Tensor,
    v_mask: Tensor | None,
    t_mask: Tensor | None,
    negative_slope: float,
    temperature: float,
) -> CameResult:
    """:func:`came_marginals` on features its caller has already checked (a method checks
    its inputs once at its boundary): no validation, no host sync."""
    sim_tv = F.normalize(t, dim=-1) @ F.normalize(v, dim=-1).transpose(1, 2)  # [B, M, N]
    alpha, w_t = _side(t, v, sim_tv, t_mask, v_mask, negative_slope, temperature)
    beta, w_v = _side(v, t, sim_tv.transpose(1, 2), v_mask, t_mask, negative_slope, temperature)
    mu = (w_t[:, None, :] @ alpha).squeeze(1)  # mu[n] = sum_m w_t[m] alpha[m, n]
    nu = (w_v[:, None, :] @ beta).squeeze(1)  # nu[m] = sum_n w_v[n] beta[n, m]
    return CameResult(mu, nu, alpha, beta, w_t, w_v)

