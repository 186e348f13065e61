"""Results over seeds: the Student-t interval against its closed form, intervals that cover
the seeds' spread, claim verdicts on synthetic cases, tables over seeds, and the paper
recipe preset."""

from __future__ import annotations

import math

import pytest
import torch

from otviz.cli.train import build_parser
from otviz.eval.seeds import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    aggregate,
    beats,
    best_vs_runner_up,
    claims_table,
    seed_interval,
)
from otviz.eval.table import Column, Table
from otviz.train.config import TrainConfig, paper_recipe


def test_interval_closed_form() -> None:
    iv = seed_interval([1.0, 2.0, 3.0])  # mean 2, s = 1, t_{0.975, 2} = 4.302653
    assert (iv.mean, iv.n) == (2.0, 3)
    assert iv.high - 2.0 == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert seed_interval([0.4]).low == -math.inf  # one seed: nothing can be claimed


def test_intervals_cover_the_seeds_spread() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        values = (0.5 + 0.1 * torch.randn(3, generator=gen, dtype=torch.float64)).tolist()
        iv = seed_interval(values)
        assert iv.low <= min(values) and max(values) <= iv.high


def test_claim_verdicts_on_synthetic_cases() -> None:
    gen = torch.Generator().manual_seed(1)
    base = (0.5 + 0.05 * torch.randn(5, generator=gen, dtype=torch.float64)).tolist()
    noise = (0.002 * torch.randn(5, generator=gen, dtype=torch.float64)).tolist()
    better = [b + 0.03 + n for b, n in zip(base, noise, strict=True)]
    worse = [b - 0.03 + n for b, n in zip(base, noise, strict=True)]
    tied = [b + 0.02 * s for b, s in zip(base, [1, -1, 1, -1, 0], strict=True)]
    assert beats(better, base)[0] == HOLDS  # paired: the common seed effect cancels
    assert beats(worse, base)[0] == DOES_NOT_HOLD
    assert beats(tied, base)[0] == INCONCLUSIVE
    assert beats(better[:1], base[:1])[0] == INCONCLUSIVE
    with pytest.raises(ValueError, match="same seeds"):
        beats(better, base[:3])


def _seed_tables(values: dict[str, list[float]]) -> list[Table]:
    cols = [Column("method", "Method", "text"), Column("r1", "R@1"), Column("n", "N", "int")]
    n_seeds = len(next(iter(values.values())))
    return [Table("retrieval", "Retrieval", cols,
                  [{"method": m.upper(), "name": m, "r1": v[s], "n": 10}
                   for m, v in values.items()]) for s in range(n_seeds)]


def test_tables_over_seeds_and_best_claims() -> None:
    values = {"a": [0.50, 0.52, 0.51], "b": [0.40, 0.43, 0.41], "c": [0.38, 0.45, 0.40]}
    runs = _seed_tables(values)
    table = aggregate(runs)
    row = table.rows[0]
    assert row["r1"] == pytest.approx(0.51) and row["r1_seeds"] == values["a"]
    assert row["r1_ci"][0] <= 0.50 and row["r1_ci"][1] >= 0.52
    assert "n_ci" not in row  # counts are not measurements
    assert "| A | 51.0 [" in table.markdown()
    claims = best_vs_runner_up({"retrieval": runs}, [("retrieval", "r1")])
    assert claims == [("retrieval", "r1", "a", "b")]
    verdicts = claims_table({"retrieval": runs}, claims + [("retrieval", "r1", "b", "c")])
    assert [r["verdict"] for r in verdicts.rows] == [HOLDS, INCONCLUSIVE]


def test_settings_are_not_averaged_over_seeds() -> None:
    cols = [Column("name", "Variant", "text"), Column("lam", "λ", "num", setting=True),
            Column("r1", "R@1")]
    runs = [Table("ablation", "Ablation", cols, [{"name": "x", "lam": 0.5, "r1": r}])
            for r in (0.4, 0.5, 0.6)]
    row = aggregate(runs).rows[0]
    assert row["lam"] == 0.5 and "lam_ci" not in row
    assert row["r1"] == pytest.approx(0.5) and "r1_ci" in row
    assert "| x | 0.500 | 50.0 [" in aggregate(runs).markdown()
    for seed, table in enumerate(runs):
        table.notes = ["recipe: lr 0.002", f"heads: heads-s{seed}"]
    assert aggregate(runs).notes[:2] == [
        "recipe: lr 0.002", "heads: heads-s0 / heads-s1 / heads-s2"]


def test_notes_that_differ_between_seeds_are_merged_word_by_word() -> None:
    cols = [Column("name", "Variant", "text"), Column("r1", "R@1")]
    notes = [["the 303 phrases of one colour; seed 0", "refused: a"],
             ["the 311 phrases of one colour; seed 1", "refused: a; b"],
             ["the 300 phrases of one colour; seed 2", "refused: a; b; c"]]
    runs = [Table("t", "T", cols, [{"name": "x", "r1": 0.5}], notes=n) for n in notes]
    assert aggregate(runs).notes[:2] == [
        "the 303 / 311 / 300 phrases of one colour; seed 0 / 1 / 2",
        "per seed: refused: a; refused: a; b; refused: a; b; c"]  # not word-aligned


def test_paper_recipe_preset() -> None:
    fast = TrainConfig(method="conceptot", lr=2e-3, batch_size=32)
    paper = paper_recipe(fast)
    assert (paper.lr, paper.batch_size, paper.epochs, paper.max_steps) == (1e-4, 64, 3, 4686)
    assert paper_recipe(TrainConfig(method="filip")).max_steps == 8 * 1562
    assert build_parser().parse_args(["--paper-recipe"]).paper_recipe


def test_report_bars_carry_the_seed_intervals() -> None:
    """A table over seeds is drawn with each bar's interval as an error bar spanning
    exactly [low, high] (in %)."""
    from matplotlib.collections import LineCollection

    from otviz.report.render import table_figures

    values = {"a": [0.50, 0.52, 0.51], "b": [0.40, 0.43, 0.41]}
    table = aggregate(_seed_tables(values))
    for row in table.rows:
        row["avg_r1"] = row["i2t_r1"] = row["t2i_r1"] = row["r1"]
        row["avg_r1_ci"] = row["i2t_r1_ci"] = row["t2i_r1_ci"] = row["r1_ci"]
    ax = table_figures({"retrieval": table})["retrieval"].axes[0]
    spans = [seg for c in ax.collections if isinstance(c, LineCollection)
             for seg in c.get_segments()]
    expected = sorted(100 * v for row in table.rows for v in row["r1_ci"]) * 3  # 3 series
    got = [float(y) for seg in spans for _, y in seg]
    assert sorted(got) == pytest.approx(sorted(expected))


def test_group_bootstrap_against_the_normal_interval_and_whole_groups() -> None:
    """One item per group: the percentile interval of the mean is close to the normal one,
    mean +- 1.96 sd / sqrt(n); constant values give a point; groups move whole (two groups
    of opposite constants: every resample mean is a mix of whole groups)."""
    import numpy as np

    from otviz.eval.seeds import group_bootstrap

    rng = np.random.default_rng(0)
    x = rng.normal(0.3, 1.0, 400)
    lo, hi = group_bootstrap(x, np.arange(400), draws=4000)
    half = 1.96 * x.std(ddof=1) / np.sqrt(400)
    assert lo == pytest.approx(x.mean() - half, abs=0.02)
    assert hi == pytest.approx(x.mean() + half, abs=0.02)
    assert group_bootstrap(np.full(10, 0.7), np.arange(10)) == pytest.approx((0.7, 0.7))
    values = np.array([1.0] * 5 + [0.0] * 5)
    lo, hi = group_bootstrap(values, np.array([0] * 5 + [1] * 5), draws=200)
    assert lo == 0.0 and hi == 1.0  # two groups: resamples are 0, 0.5 or 1
