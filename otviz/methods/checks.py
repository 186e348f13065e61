"""The one input check of an alignment method, at its boundary (:meth:`AlignmentMethod.forward`).

A method checks its :class:`otviz.methods.base.PairBatch`'s tensors here once, then calls the
solvers' unchecked cores (``solve_dense``, ``solve_lowrank``, ``solve_came``), as
a model calls the underscore solver (docs/solver-contract.md). The check reads only shapes,
dtypes and devices, never a tensor's values, so it costs no host synchronisation on an
accelerator; the solvers' value checks (NaN costs, negative masses) stay with their public
functions, where a caller hands in tensors of its own.

Half precision (float16, bfloat16) is refused here, in the features and in the method's
own parameters (:func:`check_precision`): the methods compute in the solvers' dtypes
(:data:`otviz.ot._checks.DTYPES`), whose log-domain masking constant ``-1e9`` and
Cholesky factorisations half precision cannot hold (docs/methods.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from otviz.errors import InputError
from otviz.ot._checks import DTYPES, SolverInputError, check_batched, check_mask
from otviz.ot._knobs import check_eps_floor
from otviz.ot.costs import COSINE_COST_SCALE


def check_pair_batch(
    patches: Tensor, tokens: Tensor, patch_mask: Tensor, token_mask: Tensor, method: str
) -> None:
    """A batch's ``patches [B, N, Dv]`` and ``tokens [B, M, Dt]``: floating, one batch, one
    device; ``patch_mask [B, N]`` and ``token_mask [B, M]``: bool, on that device. Raises
    :class:`otviz.ot.SolverInputError` naming ``method`` and what is wrong."""
    check_batched("patches", patches, 3, "[B, N, Dv]", method)
    check_batched("tokens", tokens, 3, "[B, M, Dt]", method)
    if not (patches.is_floating_point() and tokens.is_floating_point()):
        raise SolverInputError(
            f"{method}: features must be floating, got patches {patches.dtype} and tokens "
            f"{tokens.dtype}"
        )
    if patches.shape[0] != tokens.shape[0] or patches.device != tokens.device:
        raise SolverInputError(
            f"{method}: patches {tuple(patches.shape)} on {patches.device} and tokens "
            f"{tuple(tokens.shape)} on {tokens.device} need one batch and one device"
        )
    check_mask("patch_mask", patch_mask, tuple(patches.shape[:2]), patches.device, method)
    check_mask("token_mask", token_mask, tuple(tokens.shape[:2]), tokens.device, method)


class PrecisionError(SolverInputError, InputError):
    """A method was given features or parameters in a dtype it does not compute in."""


def check_precision(
    features: dict[str, Tensor], parameters: Iterable[Tensor], method: str
) -> None:
    """The batch's ``features`` (by name) and the method's floating ``parameters`` are float32 or
    float64 (:data:`otviz.ot._checks.DTYPES`): half precision is refused with the reason
    and the fix, instead of a bare ``NotImplementedError`` (no half Cholesky on the CPU) or
    plans silently some percent off (a ``-1e9`` mask and ``exp`` of potentials in half)."""
    why = ("the methods compute in float32 or float64: half precision cannot hold the "
           "solvers' log-domain masking constant (-1e9) nor their factorisations")
    for name, x in features.items():
        if x.dtype not in DTYPES:
            raise PrecisionError(
                f"{method}: {name} are {x.dtype}; {why}; pass the batch's features as "
                ".float() (and the method as .float())"
            )
    for p in parameters:
        if p.is_floating_point() and p.dtype not in DTYPES:
            raise PrecisionError(
                f"{method}: the method's parameters are {p.dtype}; {why}; call "
                "method.float() (and pass the features as .float())"
            )


def check_method_eps(eps: float, dtype: torch.dtype, method: str) -> None:
    """The config's ``eps`` is not below the smallest eps ``dtype`` can solve for the
    methods' cosine costs ``1 - z . y`` of unit vectors (at most
    :data:`otviz.ot.costs.COSINE_COST_SCALE`; :func:`otviz.ot._knobs.eps_floor`): Python
    numbers only, no tensor read."""
    check_eps_floor(eps, dtype, COSINE_COST_SCALE, method)
