"""Checks of the solvers' scalar knobs (``eps``, ``tau``, iteration counts, tolerances,
choices by name), made once where the knob is given: a settings object's construction, a
public solver's call, :class:`otviz.methods.base.MethodConfig`'s construction. A refusal is
a :class:`KnobError` naming the knob, its value and the rule (docs/solver-contract.md).

Python numbers are checked without touching a tensor, so a method's settings, rebuilt in
every forward pass, cost no host synchronisation; a tensor ``eps`` or ``tau`` (a learned
temperature, one value per problem) is read once, where it is given.

``eps`` and ``tau`` may be per problem (shape ``[B]``); :func:`per_problem` views such a
knob against a batched tensor (``[B, 1]`` for ``[B, N]``, ``[B, 1, 1]`` for ``[B, N, M]``).
A tensor knob of another floating dtype (or device) than its problem is cast to the
problem's (:func:`knob_like`), so a float64 ``eps`` never meets a float32 cost in a bare
torch error and a float32 ``tau`` never rounds a float64 problem's update exponent.

The smallest ``eps`` a dtype can solve (:func:`eps_floor`): the log-domain solvers hold
potentials of magnitude up to ``S / eps`` (``S``: the largest ``|C|`` on valid pairs), each
rounded to the dtype's machine epsilon ``u``, and hold masked entries at
:data:`otviz.ot.sinkhorn.NEG` ``= -1e9``. Two limits follow: the potentials' rounding
``u S / eps`` stays below 1/4 (a plan entry keeps its first digit: ``eps >= 4 u S``), and
every valid log-kernel entry stays ten times above the masking constant
(``eps >= 10 S / 1e9``). Measured on a seeded 6 x 5 problem: float32 plans lose their
mass from ``eps = 1e-7 S``, float64 masked plans depart from the unmasked ones from
``1e-10 S``; the floors are ``4.8e-7 S`` (float32) and ``1e-8 S`` (float64).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import torch
from torch import Tensor

from otviz.ot._errors import KnobError

#: How far below every valid log-kernel entry the masking constant ``-1e9`` must stay.
MASK_MARGIN = 10.0
#: The masking constant's magnitude (:data:`otviz.ot.sinkhorn.NEG`).
MASK_SCALE = 1e9
#: Largest rounding of a potential, in units of log-mass, that still leaves a plan entry
#: its first digit.
ROUNDING_BUDGET = 0.25


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_count(name: str, value: object, owner: str, low: int = 1) -> None:
    """``value`` is an integer (not a bool, not a float such as 2.5) ``>= low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise KnobError(
            f"{owner}: {name} must be an integer >= {low}, got {value!r} "
            f"({type(value).__name__})"
        )
    if value < low:
        raise KnobError(f"{owner}: {name} must be an integer >= {low}, got {value}")


def check_number(
    name: str,
    value: object,
    owner: str,
    *,
    above: float | None = None,
    at_least: float | None = None,
    inf_ok: bool = False,
) -> None:
    """``value`` is a real number (not a bool), not NaN, finite (``+inf`` too when
    ``inf_ok``), ``> above`` and ``>= at_least`` when given."""
    if not _is_real(value):
        raise KnobError(
            f"{owner}: {name} must be a number, got {value!r} ({type(value).__name__})"
        )
    _check_range(name, float(value), owner, above, at_least, inf_ok)


def _rule(above: float | None, at_least: float | None, inf_ok: bool) -> str:
    parts = [f"> {above:g}" if above is not None else "", f">= {at_least:g}"
             if at_least is not None else ""]
    bound = " and ".join(p for p in parts if p) or "a number"
    return f"{bound} ({'inf allowed' if inf_ok else 'finite'})"


def _check_range(
    name: str, x: float, owner: str, above: float | None, at_least: float | None, inf_ok: bool
) -> None:
    bad = math.isnan(x) or (math.isinf(x) and not (inf_ok and x > 0))
    bad = bad or (above is not None and not x > above)
    bad = bad or (at_least is not None and not x >= at_least)
    if bad:
        raise KnobError(f"{owner}: {name} must be {_rule(above, at_least, inf_ok)}, got {x!r}")


def check_optional_number(name: str, value: object, owner: str, **rule: float | bool) -> None:
    """``None`` or a number passing :func:`check_number` with ``rule``."""
    if value is not None:
        check_number(name, value, owner, **rule)


def check_choice(name: str, value: object, choices: Iterable[str], owner: str) -> None:
    """``value`` is one of the names ``choices``."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise KnobError(f"{owner}: unknown {name} {value!r}; use one of {choices}")


def check_flag(name: str, value: object, owner: str) -> None:
    """``value`` is a bool."""
    if not isinstance(value, bool):
        raise KnobError(f"{owner}: {name} must be True or False, got {value!r}")


def check_scale_knob(
    name: str, value: object, owner: str, *, above: float | None = None,
    at_least: float | None = None, inf_ok: bool = False,
) -> None:
    """A knob that may be a number or a tensor (``eps``, ``tau``): a number as
    :func:`check_number`; a floating tensor of shape ``[]`` or ``[B]`` whose every entry
    passes the same rule (read once, without its gradient; ``[0]`` for an empty batch)."""
    if not isinstance(value, Tensor):
        check_number(name, value, owner, above=above, at_least=at_least, inf_ok=inf_ok)
        return
    if not value.is_floating_point() or value.dim() > 1:
        raise KnobError(
            f"{owner}: {name} must be a number, a 0-D or a [B] floating tensor (one value per "
            f"problem), got {value.dtype} {tuple(value.shape)}"
        )
    x = value.detach()
    bad = torch.isnan(x) | (torch.isinf(x) & ~((x > 0) & inf_ok))
    if above is not None:
        bad |= ~(x > above)
    if at_least is not None:
        bad |= ~(x >= at_least)
    if bool(bad.any()):
        first = int(bad.flatten().nonzero()[0])
        raise KnobError(
            f"{owner}: {name} must be {_rule(above, at_least, inf_ok)}, got "
            f"{float(x.flatten()[first])!r} (entry {first})"
        )


def check_eps_value(eps: object, owner: str) -> None:
    """``eps`` is finite and ``> 0``: a number, a 0-D or a ``[B]`` tensor."""
    check_scale_knob("eps", eps, owner, above=0.0)


def check_tau_value(name: str, tau: object, owner: str) -> None:
    """A KL weight is ``>= 0`` (``inf``: a hard marginal): a number, a 0-D or a ``[B]``
    tensor."""
    check_scale_knob(name, tau, owner, at_least=0.0, inf_ok=True)


def check_batch_knob(name: str, value: float | Tensor, batch: int, owner: str) -> None:
    """A ``[B]`` knob has one value per problem of a batch of ``batch``."""
    if isinstance(value, Tensor) and value.dim() == 1 and value.shape[0] != batch:
        raise KnobError(
            f"{owner}: {name} has {value.shape[0]} values but the batch holds {batch} "
            f"problems; pass one per problem ([{batch}]) or one number"
        )


def knob_like(value: float | Tensor, like: Tensor) -> float | Tensor:
    """A knob in its problem's dtype and on its device: a tensor cast (differentiably) to
    ``like``'s dtype and device, a number as it is (docs/solver-contract.md, "Tensor knobs")."""
    if isinstance(value, Tensor) and (value.dtype, value.device) != (like.dtype, like.device):
        return value.to(dtype=like.dtype, device=like.device)
    return value


def per_problem(value: float | Tensor, dims: int) -> float | Tensor:
    """A knob viewed against a tensor of ``dims`` dimensions whose first is the batch: a
    ``[B]`` tensor as ``[B, 1, ...]``; a number or a 0-D tensor as it is."""
    if isinstance(value, Tensor) and value.dim() == 1:
        return value.reshape(-1, *([1] * (dims - 1)))
    return value


def eps_floor(dtype: torch.dtype, cost_scale: float | Tensor) -> float | Tensor:
    """The smallest ``eps`` the log-domain solvers solve in ``dtype`` for costs of
    magnitude up to ``cost_scale`` (module docstring): ``S max(4 u, 10 / 1e9)``."""
    u = torch.finfo(dtype).eps
    return cost_scale * max(u / ROUNDING_BUDGET, MASK_MARGIN / MASK_SCALE)


def check_eps_floor(
    eps: float | Tensor, dtype: torch.dtype, cost_scale: float | Tensor, owner: str
) -> None:
    """Refuse an ``eps`` (number, 0-D or ``[B]``) below :func:`eps_floor` for ``dtype`` and
    the cost magnitude ``cost_scale`` (a number or ``[B]``), naming the floor, the cost
    scale it comes from and what would help."""
    floor = eps_floor(dtype, cost_scale)
    if not isinstance(eps, Tensor) and not isinstance(floor, Tensor) and eps >= floor:
        return  # Python numbers: no tensor made (a method's forward pass)
    e = eps.detach() if isinstance(eps, Tensor) else eps
    below = torch.as_tensor(e < floor)
    if not bool(below.any()):
        return
    k = int(below.flatten().nonzero()[0]) if below.dim() else 0

    def pick(x: float | Tensor) -> float:
        return float(x.flatten()[k]) if isinstance(x, Tensor) and x.dim() else float(x)

    scale, lo = pick(cost_scale), pick(floor)
    where = f" (problem {k})" if below.dim() else ""
    wider = "" if dtype == torch.float64 else (
        f", or pass float64 tensors (floor {float(eps_floor(torch.float64, scale)):.3g})"
    )
    raise KnobError(
        f"{owner}: eps {pick(e):.3g}{where} is below the smallest eps {dtype} can solve for "
        f"costs up to {scale:.3g}: {lo:.3g} = max|C| x max(4 x machine epsilon, 10 / 1e9 "
        f"masking margin); raise eps{wider}, or scale the cost down"
    )
