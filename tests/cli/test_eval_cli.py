"""Smoke tests of ``otviz train | eval | ablate | report`` in a temporary folder, on a random
tiny CLIP made here: the commands run end to end, write what they promise, and agree with
the library calls behind them."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from otviz.backbone import Backbone
from otviz.checkpoints.heads import head_meta
from otviz.checkpoints.manifest import publish_head, read_manifest, update_manifest
from otviz.cli import main
from otviz.eval.runner import read_tables
from otviz.suite import ALIGN_METHODS, MethodSuite
from tests.helpers import random_tiny_clip

SMALL = ["--n-train", "16", "--batch-size", "8", "--max-steps", "2", "--concept-dim", "16",
         "--threads", "1", "--device", "cpu", "--quiet"]


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every comparison method trained for 2 steps and published, as one command."""
    root = tmp_path_factory.mktemp("cli")
    paths = {"root": root, "bb": random_tiny_clip(root / "bb", 0), "cache": root / "cache",
             "heads": root / "ckpt" / "heads", "manifest": root / "ckpt" / "manifest.json",
             "eval": root / "eval"}
    argv = ["train", "--method", "all", *SMALL, "--backbone", str(paths["bb"]), "--cache-dir",
            str(paths["cache"]), "--out", str(root / "runs"), "--publish", str(paths["heads"])]
    assert main(argv) == 0
    return paths


def test_train_all_publishes_every_head_with_a_manifest_entry(trained: dict[str, Path]) -> None:
    manifest = read_manifest(trained["manifest"])["checkpoints"]
    assert sorted(manifest) == sorted(f"heads/{m}" for m in ALIGN_METHODS)
    for name in ALIGN_METHODS:
        entry = manifest[f"heads/{name}"]
        assert entry["command"].startswith("otviz train --method all --n-train 16")
        assert entry["wall_time_s"] >= 0 and entry["train_metrics"]["steps"] == 2
        meta = head_meta(trained["heads"] / name)
        assert meta["method"] == name and entry["backbone"]["weights"] == meta["backbone"][
            "weights"]
        assert meta["metrics"]["curve"]["step"] == [1, 2]  # the convergence curve ships
        assert sorted(p.name for p in (trained["heads"] / name).iterdir()) == [
            "config.json", "model.safetensors"]  # no optimiser state shipped
    suite = MethodSuite.from_heads(Backbone.from_checkpoint(trained["bb"]), trained["heads"])
    assert list(suite.methods) == ["global_only", *ALIGN_METHODS]
    assert suite.methods["powerclip"].lambda_local == 0.2  # PowerCLIP's own lambda
    assert suite.methods["conceptot"].lambda_local == 0.5


@pytest.fixture(scope="module")
def evaluated(trained: dict[str, Path]) -> str:
    """The trained heads evaluated into ``trained["eval"]`` (the tables the report draws), as
    one command; its printed output."""
    argv = ["eval", "--backbone", str(trained["bb"]), "--heads", str(trained["heads"]),
            "--n-test", "5", "--n-compositional", "3", "--n-classify", "8", "--lt-n-max", "3",
            "--threads", "1", "--cache-dir", str(trained["cache"]), "--out",
            str(trained["eval"]), "--manifest", str(trained["manifest"]), "--quiet"]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(argv) == 0
    return out.getvalue()


def test_eval_writes_tables_and_records_them(trained: dict[str, Path], evaluated: str) -> None:
    out = evaluated
    assert "**Retrieval on 5 world test pairs" in out and "| ConceptOT |" in out
    tables = read_tables(trained["eval"] / "tables.json")
    assert list(tables) == ["retrieval", "probe", "grounding", "anchors", "cost", "zero_shot",
                            "long_tailed", "selective"]
    assert (trained["eval"] / "tables.md").read_text() == "\n".join(
        t.markdown() for t in tables.values())
    cost = {r["name"]: r["params"] for r in tables["cost"].rows}
    suite = MethodSuite.from_heads(Backbone.from_checkpoint(trained["bb"]), trained["heads"])
    assert cost == {n: sum(p.numel() for p in e.method.parameters())
                    for n, e in suite.methods.items()}
    entry = read_manifest(trained["manifest"])["checkpoints"]["heads/conceptot"]
    retrieval = next(r for r in tables["retrieval"].rows if r["name"] == "conceptot")
    assert entry["eval"]["avg_r1"] == retrieval["avg_r1"] and entry["eval"]["n_test"] == 5
    assert entry["train_metrics"]["steps"] == 2  # the training record is kept


def test_eval_training_free_subset(tmp_path: Path, trained: dict[str, Path]) -> None:
    argv = ["eval", "--backbone", str(trained["bb"]), "--heads", "training-free", "--methods",
            "filip,conceptot", "--tables", "probe,anchors", "--n-test", "3",
            "--n-compositional", "0", "--threads", "1", "--cache-dir", str(trained["cache"]),
            "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    tables = read_tables(tmp_path / "tables.json")
    assert [r["name"] for r in tables["probe"].rows] == ["global_only", "filip", "conceptot"]
    assert "compositional" not in tables["probe"].rows[0]
    with pytest.raises(SystemExit) as refused:  # a usage error, before anything runs
        main(["eval", "--tables", "nope", "--out", ""])
    assert refused.value.code == 2


def test_ablate_trains_each_variant(trained: dict[str, Path]) -> None:
    argv = ["ablate", "--variants", "default,lambda_l=0.25", *SMALL, "--backbone",
            str(trained["bb"]), "--cache-dir", str(trained["cache"]), "--out",
            str(trained["root"] / "abl"), "--n-test", "4", "--tables-out", str(trained["eval"])]
    assert main(argv) == 0
    rows = read_tables(trained["eval"] / "ablation.json")["ablation"].rows
    assert [(r["variant"], r["lambda_local"], r["steps"]) for r in rows] == [
        ("default", 0.5, 2), ("λ_l=0.25", 0.25, 2)]
    meta = head_meta(trained["root"] / "abl" / "lambda_l-0.25" / "head")
    assert meta["train_config"]["lambda_local"] == 0.25


def test_otclip_losses_and_report(trained: dict[str, Path], evaluated: str) -> None:
    argv = ["eval", "--otclip-losses", "--otclip-kinds", "infonce,dbot", "--otclip-steps", "2",
            "--otclip-batch-size", "8", "--otclip-n-train", "16", "--otclip-n-test", "6",
            "--otclip-width", "16", "--otclip-layers", "1", "--otclip-n-classify", "8",
            "--otclip-threads", "1", "--otclip-runs", str(trained["root"] / "otc"), "--out",
            str(trained["eval"]), "--quiet"]
    assert main(argv) == 0
    record = json.loads((trained["eval"] / "otclip_losses.json").read_text())
    rows = record["tables"]["otclip_losses"]["rows"]
    assert [r["name"] for r in rows] == ["infonce", "dbot"]
    assert [e["step"] for e in record["logs"]["dbot"]] == [1, 2]
    pretrained = Backbone.from_checkpoint(trained["root"] / "otc" / "dbot")
    assert pretrained.info["recipe"]["loss"] == "dbot" and pretrained.info["recipe"]["steps"] == 2
    out = trained["root"] / "report"
    argv = ["report", "--eval-dir", str(trained["eval"]), "--heads", str(trained["heads"]),
            "--backbone", str(trained["bb"]), "--cache-dir", str(trained["cache"]), "--out",
            str(out), "--n-examples", "2"]
    assert main(argv) == 0
    made = sorted(p.stem for p in out.glob("*.png"))
    assert {"retrieval", "probe", "grounding", "zero_shot", "selective", "long_tailed",
            "training_curves", "anchor_cosine", "anchor_word_affinity", "grounding_examples",
            "otclip_losses", "otclip_curves"} <= set(made)
    assert all((out / f"{m}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for m in made)


def test_manifest_merges_and_publishing_replaces(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    update_manifest(manifest, "tiny-clip", {"command": "otviz pretrain"})
    update_manifest(manifest, "heads/x", {"a": 1})
    update_manifest(manifest, "heads/x", {"b": 2})
    data = read_manifest(manifest)["checkpoints"]
    assert data == {"heads/x": {"a": 1, "b": 2}, "tiny-clip": {"command": "otviz pretrain"}}
    src = tmp_path / "run" / "head"
    src.mkdir(parents=True)
    (src / "f.txt").write_text("new")
    old = tmp_path / "heads" / "x"
    old.mkdir(parents=True)
    (old / "stale.txt").write_text("old")
    publish_head(src, old, manifest, {"c": 3})
    assert sorted(p.name for p in old.iterdir()) == ["f.txt"]
    entry = read_manifest(manifest)["checkpoints"]["heads/x"]
    assert entry["a"] == 1 and entry["c"] == 3 and "created" in entry
    assert not [p for p in (tmp_path / "heads").iterdir() if p.name.startswith(".")]


def test_eval_over_seeds_reports_intervals_and_claims(tmp_path: Path,
                                                      trained: dict[str, Path]) -> None:
    argv = ["eval", "--backbone", str(trained["bb"]), "--heads", "training-free", "--methods",
            "filip,powerclip", "--tables", "retrieval,grounding", "--n-test", "6",
            "--candidates", "2", "--also-candidates", "4", "--seeds", "0,1,2",
            "--claims", "retrieval:avg_r1:filip>powerclip", "--threads", "1",
            "--cache-dir", str(trained["cache"]), "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    record = json.loads((tmp_path / "tables.json").read_text())
    assert sorted(record["per_seed"]) == ["0", "1", "2"]
    tables = read_tables(tmp_path / "tables.json")
    assert list(tables) == ["retrieval", "grounding", "claims"]
    for key, metric in (("retrieval", "avg_r1"), ("retrieval", "avg_r1_top4"),
                        ("grounding", "pointing")):
        for row in tables[key].rows:
            seeds = [next(r for r in record["per_seed"][s][key]["rows"]
                          if r["name"] == row["name"])[metric] for s in ("0", "1", "2")]
            assert row[f"{metric}_seeds"] == seeds
            low, high = row[f"{metric}_ci"]
            assert low <= min(seeds) and max(seeds) <= high
    claims = tables["claims"].rows
    assert claims[-1]["claim"] == "filip beats powerclip on retrieval avg_r1"
    assert {r["verdict"] for r in claims} <= {"holds", "does not hold", "inconclusive"}


def test_ablate_over_seeds(trained: dict[str, Path]) -> None:
    out = trained["root"] / "abl-seeds"
    argv = ["ablate", "--variants", "default,lambda_l=0.25", *SMALL, "--backbone",
            str(trained["bb"]), "--cache-dir", str(trained["cache"]), "--out", str(out),
            "--n-test", "4", "--seeds", "0,1,2", "--tables-out", str(out / "tables")]
    assert main(argv) == 0
    tables = read_tables(out / "tables" / "ablation.json")
    assert [r["variant"] for r in tables["ablation"].rows] == ["default", "λ_l=0.25"]
    row = tables["ablation"].rows[0]
    assert len(row["avg_r1_seeds"]) == 3 and row["avg_r1_ci"][0] <= min(row["avg_r1_seeds"])
    assert len(tables["claims"].rows) == 3
    assert (out / "seed-2" / "lambda_l-0.25" / "head").is_dir()
