"""The public solver namespace ``otviz.ot``: what it exports exists, its docstring example
runs, and the exported solvers refuse a bad problem with the library's error."""

from __future__ import annotations

import doctest

import pytest
import torch

import otviz.ot as ot


def test_every_exported_name_exists_and_the_example_runs() -> None:
    assert sorted(ot.__all__) == ot.__all__
    assert all(hasattr(ot, name) for name in ot.__all__)
    failures, tried = doctest.testmod(ot, verbose=False)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize("solver", [ot.sinkhorn_log, ot.sinkhorn_unbalanced_log])
def test_exported_solvers_refuse_a_non_positive_eps(solver) -> None:
    cost = torch.rand(1, 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    a = torch.full((1, 3), 1 / 3, dtype=torch.float64)
    b = torch.full((1, 2), 1 / 2, dtype=torch.float64)
    args = (cost, a, b, 0.0) if solver is ot.sinkhorn_log else (cost, a, b, 0.0, 1.0, 1.0)
    with pytest.raises(ot.SolverInputError, match="eps"):
        solver(*args)
