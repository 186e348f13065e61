"""A tiny benchmark run returns well-formed rows for every registered method."""

from __future__ import annotations

import math

from otviz.bench import BenchConfig, linear_fit, run_benchmark, to_markdown, tree_nodes
from otviz.methods import METHODS


def test_tiny_run_covers_every_method() -> None:
    cfg = BenchConfig(
        ns=(16,),
        ms=(4,),
        ranks=(3,),
        pairs=4,
        backward_pairs=2,
        repeats=1,
        pot_pairs=2,
        train_step=False,
    )
    result = run_benchmark(cfg)
    rows = result["rows"]
    method_rows = [r for r in rows if r["kind"] == "method"]
    assert {r["method"] for r in method_rows} == set(METHODS)
    for name in METHODS:
        modes = {r["mode"] for r in method_rows if r["method"] == name}
        assert modes == {"forward", "forward+backward"}
    for row in rows:
        assert row["status"] == "ok" or row["status"].startswith(("error:", "off:"))
        if row["status"] == "ok":
            assert row["ms_per_pair"] > 0 and math.isfinite(row["ms_per_pair"])
            assert row["peak_mem_mb"] >= 0 and row["pairs"] >= 1
    # methods that can run must run; only parameter-free backward may be reported as error
    for row in method_rows:
        if row["status"] != "ok":
            assert row["mode"] == "forward+backward" and "no trainable parameters" in row["status"]
    solvers = {r["method"] for r in rows if r["kind"] == "solver" and r["status"] == "ok"}
    assert {
        "ours_sinkhorn_unbalanced",
        "pot_sinkhorn_unbalanced",
        "pot_batch_log_sinkhorn",
    } <= solvers
    assert "| kind | method |" in to_markdown(result)


def test_linear_fit_recovers_a_line() -> None:
    fit = linear_fit([(100, 0.3), (200, 0.5), (400, 0.9)])
    assert math.isclose(fit["us_per_patch"], 2.0) and math.isclose(fit["r2"], 1.0)


def test_tree_nodes_are_nested_spans() -> None:
    nodes = tree_nodes(5)
    assert nodes[0].all() and nodes.sum(1).min() == 1 and nodes.shape == (9, 5)
