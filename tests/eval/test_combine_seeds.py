"""``benchmarks/combine_seeds.py``: one-seed ``otviz eval`` runs combined over seeds give the
tables ``otviz eval --seeds`` gives, row for row (the trust verdicts from the mean too)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from otviz.eval.config import EvalConfig
from otviz.eval.runner import run_eval

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from combine_seeds import combine_seeds  # noqa: E402


def test_one_seed_runs_combine_as_seeds_does(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = EvalConfig(heads="training-free", methods="filip,dense_uot", tables="grounding",
                        n_test=2, n_compositional=0, threads=1,
                        cache_dir=str(tmp_path / "cache"))
    run_eval(replace(config, seeds="0,1", out=str(tmp_path / "together")))
    for seed in (0, 1):
        run_eval(replace(config, seed=seed, out=str(tmp_path / "apart" / f"seed-{seed}")))
    assert combine_seeds(tmp_path / "apart")
    assert not combine_seeds(tmp_path / "apart")  # a tables.json there is kept
    together, apart = (json.loads((tmp_path / d / "tables.json").read_text())
                       for d in ("together", "apart"))
    assert set(apart["tables"]) == set(together["tables"]) == {"grounding", "claims"}
    for key, table in together["tables"].items():
        assert apart["tables"][key]["rows"] == table["rows"], key
        assert apart["tables"][key]["title"] == table["title"], key
    assert apart["per_seed"] == together["per_seed"]
    assert apart["config"]["seeds"] == "0,1"
    assert not combine_seeds(tmp_path / "together")  # no seed-S runs there
