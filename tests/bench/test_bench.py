"""A tiny benchmark run returns well-formed rows for every registered method."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from otviz.bench import runners
from otviz.bench.config import BenchConfig
from otviz.bench.report import linear_fit, product_mac_ratio, summarise, to_markdown
from otviz.bench.runners import run_benchmark, shared_layouts, shared_rows, tree_nodes
from otviz.bench.timing import _time_rounds
from otviz.cli.bench import main
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
        shared=False,
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


def test_rounds_interleave_and_keep_failures() -> None:
    calls: list[str] = []

    def failing() -> None:
        calls.append("b")
        raise RuntimeError("boom")

    out = _time_rounds([lambda: calls.append("a"), failing, lambda: calls.append("c")], 2)
    # one warm-up round, then two rounds of every function in turn; the failure is not rerun
    assert calls == ["a", "b", "c", "a", "c", "a", "c"]
    assert isinstance(out[1], RuntimeError)
    for timing in (out[0], out[2]):
        wall, cpu = timing
        assert len(wall) == len(cpu) == 2 and min(wall) >= 0 and min(cpu) >= 0


def test_product_mac_ratio_by_hand() -> None:
    # ConceptOT: (N + M) d r for the kernels + (N + M) d r for Eq. 8; Dense UOT: N d M
    assert product_mac_ratio(196, 48, 32) == pytest.approx(2 * 244 * 32 / (196 * 48))
    assert product_mac_ratio(4096, 77, 32) < 1 < product_mac_ratio(4096, 48, 32)


def test_focused_cli_run_writes_the_selected_rows(tmp_path: Path) -> None:
    argv = ["--ns", "16", "--ms", "4", "--ranks", "32", "--pairs", "4", "--repeats", "1"]
    argv += ["--methods", "conceptot", "dense_uot", "--threads", "1", "--no-pot"]
    argv += ["--no-backward", "--no-train-step", "--no-shared", "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    rows = [r for r in result["rows"] if r["kind"] == "method"]
    assert {(r["method"], r["mode"], r["r"]) for r in rows} == {
        ("conceptot", "forward", 32),
        ("dense_uot", "forward", None),
    }
    assert all(r["status"] == "ok" and r["pairs"] == 4 for r in rows)
    assert not any(r["kind"] == "train_step" for r in result["rows"])
    ratio = result["summary"]["conceptot_over_dense_uot_time"]["N=16,M=4"]
    assert ratio["wall"] > 0 and ratio["product_macs"] == pytest.approx(2 * 20 * 32 / 64)
    assert (tmp_path / "results.md").read_text().startswith("# otviz benchmark")


def test_run_restores_the_callers_thread_count() -> None:
    before = torch.get_num_threads()
    cfg = BenchConfig(ns=(8,), ms=(3,), ranks=(2,), pairs=2, repeats=1, threads=before + 1)
    cfg.methods, cfg.pot, cfg.backward, cfg.train_step = ("dense_uot",), False, False, False
    cfg.shared = False
    result = run_benchmark(cfg)
    assert result["meta"]["threads"] == before + 1 and torch.get_num_threads() == before


def test_summary_fits_both_methods_time_against_n() -> None:
    # synthetic rows on exact lines: ConceptOT 0.7 us/patch, Dense UOT 0.6 us/patch
    rows = []
    for n in (196, 576, 4096):
        for method, r, slope in (("conceptot", 32, 0.7e-3), ("dense_uot", None, 0.6e-3)):
            t = 0.05 + slope * n
            rows.append(
                {
                    "kind": "method",
                    "method": method,
                    "N": n,
                    "M": 48,
                    "r": r,
                    "mode": "forward",
                    "status": "ok",
                    "ms_per_pair": t,
                    "cpu_ms_per_pair": t,
                }
            )
    summary = summarise(rows, BenchConfig(ns=(196, 576, 4096), ms=(48,)))
    conceptot = summary["conceptot_time_vs_N"]["M=48"][""]
    dense = summary["dense_uot_time_vs_N"]["M=48"]["cpu_"]
    assert conceptot["us_per_patch"] == pytest.approx(0.7) and dense[
        "us_per_patch"
    ] == pytest.approx(0.6)
    assert conceptot["intercept_ms"] == pytest.approx(0.05) and conceptot["r2"] == pytest.approx(
        1.0
    )
    ratio = summary["conceptot_over_dense_uot_time"]["N=576,M=48"]
    assert ratio["wall"] == pytest.approx((0.05 + 0.7e-3 * 576) / (0.05 + 0.6e-3 * 576))


def test_shared_layouts_repeat_images_or_captions() -> None:
    layouts = shared_layouts(0)
    image_idx, text_idx = layouts["train_negatives"]
    assert image_idx.numel() == text_idx.numel() == 64 * 9
    assert image_idx.unique().numel() == text_idx.unique().numel() == 64
    assert not (image_idx[64:] == text_idx[64:]).any()  # negatives are other items
    image_idx, text_idx = layouts["rerank_i2t"]
    assert image_idx.unique().numel() == 4 and text_idx.unique().numel() == 512


def test_shared_rows_time_each_layout_with_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = {"TRAIN_ITEMS": 8, "HARD_NEGATIVES": 2, "RERANK_QUERIES": 2, "RERANK_K": 8}
    sizes |= {"TRAIN_N": 16, "TRAIN_M": 5}
    for name, value in sizes.items():
        monkeypatch.setattr(runners, name, value)
    cfg = BenchConfig(dim=8, repeats=1, threads=1)
    rows = shared_rows(cfg, ["dense_uot", "conceptot"])
    assert {(r["method"], r["layout"]) for r in rows} == {
        (m, layout) for m in ("dense_uot", "conceptot") for layout in shared_layouts(0)
    }
    assert all(r["status"] == "ok" and r["pairs"] in (8 * 5, 2 * 8) for r in rows)
    summary = summarise(rows, cfg)["conceptot_over_dense_uot_shared"]
    assert set(summary) == set(shared_layouts(0)) and all(v["wall"] > 0 for v in summary.values())
