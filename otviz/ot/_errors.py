"""The refusals of the solvers: :class:`SolverInputError` for a problem a solver cannot
solve, :class:`KnobError` for a setting (``eps``, ``tau``, an iteration count, a choice)
that holds a value it cannot use (docs/solver-contract.md)."""

from __future__ import annotations

from otviz.errors import InputError, OtvizError


class SolverInputError(OtvizError, ValueError):
    """A solver was given a problem it cannot solve (the message says why)."""


class KnobError(SolverInputError, InputError):
    """A solver or method setting holds a value it cannot use (the message names it)."""
