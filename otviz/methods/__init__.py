"""Alignment methods, one module each, behind the contract of :mod:`otviz.methods.base`."""

from otviz.methods.base import (
    METHODS,
    Alignment,
    AlignmentMethod,
    DensePlan,
    MethodConfig,
    PairBatch,
    build_method,
    register,
)

__all__ = [
    "METHODS",
    "Alignment",
    "AlignmentMethod",
    "DensePlan",
    "MethodConfig",
    "PairBatch",
    "build_method",
    "register",
]
