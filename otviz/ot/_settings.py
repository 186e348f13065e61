"""The knobs of each solver family, one frozen object per family, held apart from the
problem the way ott's ``Sinkhorn(threshold, max_iterations, ...)`` holds its settings
apart from the ``LinearProblem`` it is called on: a solver's private core takes the
problem's tensors and one settings object instead of repeating the tail
``eps, n_iters, tol`` in every signature.

Each object checks its knobs when it is made (:mod:`otviz.ot._knobs`: type, range,
finiteness, choice), so a bad value is refused with its name before any solve, and a
method's settings, rebuilt in every forward pass from Python numbers, read no tensor."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from torch import Tensor

from otviz.knobs import LOWRANK_VARIANTS
from otviz.ot._knobs import (
    KnobError,
    check_choice,
    check_count,
    check_eps_value,
    check_number,
    check_optional_number,
    check_tau_value,
    knob_like,
)
from otviz.ot._result import DEFAULT_MAX_ITERS, DEFAULT_TOL


@dataclass(frozen=True, kw_only=True)
class SinkhornSettings:
    """Entropic scaling (:func:`otviz.ot.sinkhorn.sinkhorn_log`).

    Attributes:
        eps: entropic regularisation (finite, > 0): a number, or a tensor (a learned
            temperature; ``[B]``: one value per problem).
        n_iters: maximal iterations (an integer >= 1; each one row and one column update).
        tol: stop once every problem's relative marginal error is ``<= tol`` (finite,
            > 0); ``None``: exactly ``n_iters`` (:mod:`otviz.ot._result`).
    """

    eps: float | Tensor
    n_iters: int = DEFAULT_MAX_ITERS
    tol: float | None = DEFAULT_TOL

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_eps_value(self.eps, owner)
        check_count("n_iters", self.n_iters, owner)
        check_optional_number("tol", self.tol, owner, above=0.0)


@dataclass(frozen=True, kw_only=True)
class UnbalancedSettings(SinkhornSettings):
    """Generalized Sinkhorn (ConceptOT Eq. 3,
    :func:`otviz.ot.unbalanced.sinkhorn_unbalanced_log`): the KL weights (>= 0, not NaN;
    numbers, or tensors of shape ``[]`` or ``[B]``) of the row and column marginals,
    ``float('inf')`` for a hard one."""

    tau_a: float | Tensor
    tau_b: float | Tensor

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_tau_value("tau_a", self.tau_a, owner)
        check_tau_value("tau_b", self.tau_b, owner)


@dataclass(frozen=True, kw_only=True)
class LowRankSettings(UnbalancedSettings):
    """Low-rank generalized Sinkhorn through anchors (ConceptOT Alg. 1,
    :func:`otviz.ot.lowrank.lowrank_uot`).

    Attributes:
        kpp_reg: lambda added to ``K_PP`` (App. H: 1e-2; finite, >= 0).
        variant: ``"faithful"`` or ``"positive"`` (:mod:`otviz.ot.lowrank`).
        clamp: bound of the centred log-scalings (faithful; finite, > 0; ``None``
            disables).
        floor: the ``1e-8`` of Alg. 1 lines 9 and 13 (faithful; finite, >= 0; 0 disables).
    """

    kpp_reg: float = 1e-2
    variant: str = "faithful"
    clamp: float | None = 20.0
    floor: float = 1e-8

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_number("kpp_reg", self.kpp_reg, owner, at_least=0.0)
        check_choice("variant", self.variant, LOWRANK_VARIANTS, owner)
        check_optional_number("clamp", self.clamp, owner, above=0.0)
        check_number("floor", self.floor, owner, at_least=0.0)


Settings = TypeVar("Settings", bound=SinkhornSettings)


def settings_like(settings: Settings, like: object) -> Settings:
    """``settings`` with every tensor knob (``eps``, ``tau_a``, ``tau_b``) in the dtype and
    on the device of ``like``, the problem's first tensor
    (:func:`otviz.ot._knobs.knob_like`); as they are when ``like`` is not a floating
    tensor (the problem's own check refuses it)."""
    if not isinstance(like, Tensor) or not like.is_floating_point():
        return settings
    cast = {
        name: knob_like(value, like)
        for name, value in vars(settings).items()
        if isinstance(value, Tensor)
    }
    cast = {name: value for name, value in cast.items() if value is not getattr(settings, name)}
    return replace(settings, **cast) if cast else settings


def settings_of(
    solver: str, kind: type[Settings], like: object = None, **knobs: object
) -> Settings:
    """``kind(**knobs)``, a refusal naming ``solver`` (the function the knobs were given to)
    instead of the settings class; its tensor knobs cast to the problem's dtype and device
    when ``like`` (the problem's first tensor) is given (:func:`settings_like`)."""
    try:
        return settings_like(kind(**knobs), like)
    except KnobError as e:
        raise KnobError(str(e).replace(kind.__name__, solver, 1)) from None
