"""Input validation shared by the solvers of :mod:`otviz.ot`: every public solver checks
its problem here first and refuses bad input with a :class:`SolverInputError` that says
what is wrong, instead of returning NaN plans or silently wrong ones.

Shapes: costs are batched ``[B, N, M]`` and masses ``[B, N]`` / ``[B, M]``; a single pair
(2-D cost, 1-D masses) is refused with a message naming the batched call (``x[None]``), so
a result's shapes never depend on how the input was given.
"""

from __future__ import annotations

import torch
from torch import Tensor


class SolverInputError(ValueError):
    """A solver was given a problem it cannot solve (the message says why)."""


def check_eps(eps: float | Tensor, solver: str) -> None:
    """``eps`` must be a finite positive number (a tensor ``eps``: all entries)."""
    value = eps.detach() if isinstance(eps, Tensor) else torch.tensor(float(eps))
    if not bool(torch.isfinite(value).all()) or not bool((value > 0).all()):
        raise SolverInputError(f"{solver}: eps must be finite and > 0, got {_show(eps)}")


def check_tau(name: str, tau: float | Tensor, solver: str) -> None:
    """A KL weight must be ``>= 0`` (``float('inf')``: a hard constraint; a tensor ``tau``,
    e.g. a learned one: all entries, read without its gradient)."""
    value = tau.detach() if isinstance(tau, Tensor) else torch.tensor(float(tau))
    if bool(torch.isnan(value).any()) or bool((value < 0).any()):
        raise SolverInputError(f"{solver}: {name} must be >= 0 (inf: hard), got {_show(tau)}")


def check_cost(
    cost: Tensor, solver: str, row_mask: Tensor | None = None, col_mask: Tensor | None = None
) -> None:
    """``cost`` must be ``[B, N, M]`` with ``N, M >= 1`` and finite on valid pairs (masked
    pairs may hold anything)."""
    if cost.dim() == 2:
        raise SolverInputError(
            f"{solver}: cost is 2-D {tuple(cost.shape)}; the solvers are batched [B, N, M]: "
            "for one pair pass cost[None] and the masses a[None], b[None]"
        )
    if cost.dim() != 3:
        raise SolverInputError(f"{solver}: cost must be [B, N, M], got {tuple(cost.shape)}")
    if 0 in cost.shape[1:]:
        raise SolverInputError(f"{solver}: empty problem, cost has shape {tuple(cost.shape)}")
    bad = ~torch.isfinite(cost.detach())
    if row_mask is not None:
        bad &= row_mask[:, :, None]
    if col_mask is not None:
        bad &= col_mask[:, None, :]
    if bool(bad.any()):
        raise SolverInputError(
            f"{solver}: the cost holds {int(bad.sum())} NaN or infinite entries on valid "
            "pairs; mask those rows/columns out instead"
        )


def check_masses(
    name: str, x: Tensor | None, batch: int, size: int, solver: str, mask: Tensor | None = None
) -> None:
    """Masses ``[batch, size]``: finite and ``>= 0`` on valid entries, with some mass in
    every problem (``None``: not given, nothing to check)."""
    if x is None:
        return
    if x.dim() == 1:
        raise SolverInputError(
            f"{solver}: {name} is 1-D {tuple(x.shape)}; pass [B, {size}] ({name}[None] for "
            "one pair)"
        )
    if tuple(x.shape) != (batch, size):
        raise SolverInputError(
            f"{solver}: {name} has shape {tuple(x.shape)}, the cost needs ({batch}, {size})"
        )
    valid = torch.ones_like(x, dtype=torch.bool) if mask is None else mask
    x = x.detach()
    if bool((valid & ~(torch.isfinite(x) & (x >= 0))).any()):
        raise SolverInputError(f"{solver}: {name} must be finite and >= 0 on valid entries")
    if bool(((x * valid.to(x.dtype)).sum(-1) <= 0).any()):
        raise SolverInputError(f"{solver}: {name} has no mass in some problem (empty problem)")


def check_equal_mass(
    a: Tensor, b: Tensor, solver: str, row_mask: Tensor | None, col_mask: Tensor | None,
    rtol: float = 1e-4,
) -> None:
    """Balanced OT needs ``sum a == sum b`` per problem (relative tolerance ``rtol``)."""
    sa, sb = _total(a, row_mask), _total(b, col_mask)
    if bool(((sa - sb).abs() > rtol * torch.maximum(sa, sb)).any()):
        worst = int((sa - sb).abs().argmax())
        raise SolverInputError(
            f"{solver}: balanced OT needs equal total masses, problem {worst} has "
            f"sum a = {float(sa[worst]):.6g} and sum b = {float(sb[worst]):.6g} (use the "
            "unbalanced solver for unequal masses)"
        )


def check_transported_mass(
    mass: float | Tensor, available: Tensor, solver: str
) -> Tensor:
    """A partial mass ``s`` (float or ``[B]``) in ``[0, available]`` per problem; returns it as
    a ``[B]`` tensor."""
    s = torch.as_tensor(mass, dtype=available.dtype, device=available.device)
    s = s.expand(available.shape[0])
    if not bool(torch.isfinite(s).all()) or bool((s <= 0).any()):
        raise SolverInputError(f"{solver}: the transported mass must be > 0, got {_show(mass)}")
    over = s > available * (1 + 1e-6)
    if bool(over.any()):
        k = int(over.nonzero()[0])
        raise SolverInputError(
            f"{solver}: problem {k} asks for mass {float(s[k]):.6g} but only "
            f"{float(available[k]):.6g} is available (min of sum a and sum b)"
        )
    return s


def check_problem(
    cost: Tensor,
    a: Tensor | None,
    b: Tensor | None,
    eps: float | Tensor,
    solver: str,
    row_mask: Tensor | None = None,
    col_mask: Tensor | None = None,
) -> None:
    """The common checks of a ``(cost, a, b, eps)`` problem: :func:`check_cost`,
    :func:`check_masses` for ``a`` and ``b`` (when given) and :func:`check_eps`."""
    check_cost(cost, solver, row_mask, col_mask)
    bsz, n, m = cost.shape
    check_masses("a", a, bsz, n, solver, row_mask)
    check_masses("b", b, bsz, m, solver, col_mask)
    check_eps(eps, solver)


def _total(x: Tensor, mask: Tensor | None) -> Tensor:
    x = x.detach()
    return (x if mask is None else x * mask.to(x.dtype)).sum(-1)


def _show(x: float | Tensor) -> str:
    return str(x.detach().flatten()[:4].tolist()) if isinstance(x, Tensor) else repr(x)
