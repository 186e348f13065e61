"""Alignment methods, one module each, behind the contract of :mod:`otviz.methods.base`.

Importing this package imports every module in it, so each ``@register``-ed method is in
:data:`METHODS` (a new method is one new module; no list to edit here).
"""

import importlib
import pkgutil

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

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
