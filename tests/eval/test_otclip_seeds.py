"""OT-CLIP's loss table over seeds (``otviz eval --otclip-losses --otclip-seeds``): each
seed's pre-training is the single-seed run at that seed, and the table is their mean and
Student-t interval."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from otviz.eval.config import OTCLIPTableConfig
from otviz.eval.otclip_table import CLAIM_METRICS, otclip_loss_table, otclip_loss_tables
from otviz.eval.seeds import seed_interval


def _tiny(runs: Path, kinds: str = "infonce") -> OTCLIPTableConfig:
    return OTCLIPTableConfig(
        otclip_kinds=kinds, otclip_steps=2, otclip_batch_size=8, otclip_n_train=16,
        otclip_n_test=6, otclip_width=16, otclip_layers=1, otclip_n_classify=8,
        otclip_threads=1, otclip_runs=str(runs))


def test_seeds_give_the_mean_and_interval_of_each_seeds_own_run(tmp_path: Path) -> None:
    base = _tiny(tmp_path / "otc")
    (table,), logs = otclip_loss_tables(replace(base, otclip_seeds="3,4"))
    singles = [otclip_loss_table(replace(base, otclip_seed=s,
                                         otclip_runs=str(tmp_path / f"one-{s}")))[0]
               for s in (3, 4)]
    row = table.rows[0]
    for key in ("final_loss", "zs_mean", "i2t_r1"):
        per_seed = [t.rows[0][key] for t in singles]
        assert row[f"{key}_seeds"] == pytest.approx(per_seed)
        iv = seed_interval(per_seed)
        assert row[key] == pytest.approx(np.mean(per_seed))
        assert row[f"{key}_ci"] == pytest.approx([iv.low, iv.high], nan_ok=True)
    losses = row["final_loss_seeds"]
    assert losses[0] != losses[1]  # the seed reaches the pre-training
    assert sorted(logs) == [3, 4] and all("infonce" in v for v in logs.values())
    assert (tmp_path / "otc" / "s3" / "infonce").is_dir()
    assert (tmp_path / "otc" / "s4" / "infonce").is_dir()
    assert "2 seeds" in table.title and "pre-training" in table.notes[-1]


def test_no_seeds_is_the_one_seed_run(tmp_path: Path) -> None:
    config = replace(_tiny(tmp_path / "otc"), otclip_seed=5)
    assert config.seed_list() == [5]
    (table,), logs = otclip_loss_tables(config)
    assert list(logs) == [5] and "final_loss_ci" not in table.rows[0]
    assert (tmp_path / "otc" / "infonce").is_dir()


def test_each_ot_loss_is_judged_against_infonce_paired_by_seed(tmp_path: Path) -> None:
    config = replace(_tiny(tmp_path / "otc", "infonce,entropic_ot"), otclip_seeds="3,4")
    (table, claims), _ = otclip_loss_tables(config)
    assert claims.key == "otclip_claims" and len(claims.rows) == len(CLAIM_METRICS)
    rows = {r["name"]: r for r in table.rows}
    for claim in claims.rows:
        assert (claim["a"], claim["b"]) == ("entropic_ot", "infonce")
        diff = (np.array(rows["entropic_ot"][f"{claim['metric']}_seeds"])
                - np.array(rows["infonce"][f"{claim['metric']}_seeds"]))
        half = stats.t.ppf(0.975, 1) * diff.std(ddof=1) / np.sqrt(2)
        assert claim["diff"] == pytest.approx(diff.mean())
        assert [claim["low"], claim["high"]] == pytest.approx([diff.mean() - half,
                                                               diff.mean() + half])
