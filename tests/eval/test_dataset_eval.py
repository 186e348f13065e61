"""``otviz eval --dataset`` against the world: a world test draw exported as Flickr30k
Entities gives, phrase by phrase, the pointing the world's own grounding table gives; the
RefCOCO and Visual Genome exports of the same phrases agree with each other; a run stopped
after a shard resumes from the shards written."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from otviz.cli import evaluate
from otviz.data.grounding_sets.export import (
    export_flickr30k,
    export_refcoco,
    export_visual_genome,
    world_draw,
)
from otviz.eval import dataset_eval
from otviz.eval.alignment_tables import grounding_table
from otviz.eval.config import EvalConfig
from otviz.eval.dataset_trust import DATASET_TRUST_METRICS
from otviz.eval.runner import build_suite, load_backbone
from otviz.eval.trust.table import trust_tables
from otviz.eval.world_set import EvalSet, world_config_of

N = 6
METHODS = "filip,dense_uot,conceptot,powerclip"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    torch.set_num_threads(1)  # the runs set their own (config.threads)
    root = tmp_path_factory.mktemp("dataset-eval")
    backbone = load_backbone()
    samples = world_draw(N, "test", 0, world_config_of(backbone))
    config = EvalConfig(methods=METHODS, cache_dir=str(root / "cache"), threads=1, shard=4)
    suite = build_suite(backbone, config.heads, config.method_names())
    hits: dict[str, dict] = {}
    grounding_table(suite, EvalSet.build(backbone, N, "test", 0, str(root / "cache")),
                    phrase_hits=hits)
    return {"root": root, "samples": samples, "config": config, "hits": hits, "suite": suite}


def _csv_hits(out: Path) -> dict[str, list[float]]:
    by_method: dict[str, list[float]] = {}
    for row in csv.DictReader((out / "grounding.csv").open()):
        by_method.setdefault(row["method"], []).append(float(row["hit"]))
    return by_method


def _run(world: dict, spec: str, out: Path, **kw) -> tuple:
    tables, stamp = dataset_eval.run_dataset_eval(replace(world["config"], dataset=spec,
                                                          out=str(out), **kw))
    return tables[0], stamp


def test_flickr30k_export_points_like_the_world_phrase_by_phrase(world: dict) -> None:
    root = export_flickr30k(world["samples"], world["root"] / "flickr", lossless=True)
    table, stamp = _run(world, f"flickr30k:{root}", world["root"] / "out-flickr")
    got = _csv_hits(world["root"] / "out-flickr")
    for name in ("filip", "dense_uot", "conceptot", "powerclip", "centre_prior", "uniform"):
        assert got[name] == world["hits"][name]["hit"], name
    rows = {r["name"]: r for r in table.rows}
    for name, h in world["hits"].items():
        if name in rows:
            assert rows[name]["pointing"] == pytest.approx(sum(h["hit"]) / len(h["hit"]))
    assert "colour_oracle" not in rows and "random" in rows
    assert stamp["dataset"]["digest"] and stamp["versions"]["open_clip"]
    assert stamp["model"] == "otviz-tiny" and stamp["shards"] == 2
    record = json.loads((world["root"] / "out-flickr" / "grounding.json").read_text())
    assert record["stamp"]["seed"] == 0
    text = (world["root"] / "out-flickr" / "grounding.md").read_text()
    assert "15 px tolerance" in text
    assert text.count("whose gold region holds no token") == 1  # all shards counted once


def test_refcoco_and_visual_genome_exports_agree(world: dict) -> None:
    ref = export_refcoco(world["samples"], world["root"] / "refcoco", "testA", lossless=True)
    vg = export_visual_genome(world["samples"], world["root"] / "vg", lossless=True)
    _run(world, f"refcoco:{ref}", world["root"] / "out-ref")
    _run(world, f"vg:{vg}", world["root"] / "out-vg")
    a, b = _csv_hits(world["root"] / "out-ref"), _csv_hits(world["root"] / "out-vg")
    assert a == b
    n_phrases = sum(len(s.phrases) for s in world["samples"])
    assert all(len(v) == n_phrases for v in a.values())


def test_a_stopped_run_resumes_from_its_shards(world: dict, monkeypatch) -> None:
    root = export_flickr30k(world["samples"], world["root"] / "flickr-resume", lossless=True)
    out = world["root"] / "out-resume"
    real = dataset_eval.grounding_table
    calls = []

    def stops_at_the_second_shard(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(dataset_eval, "grounding_table", stops_at_the_second_shard)
    with pytest.raises(KeyboardInterrupt):
        _run(world, f"flickr30k:{root}", out)
    assert len(list((out / "shards").glob("*.json"))) == 1
    calls.clear()
    monkeypatch.setattr(dataset_eval, "grounding_table", lambda *a, **k: (calls.append(1),
                                                                          real(*a, **k))[1])
    table, _ = _run(world, f"flickr30k:{root}", out)
    assert len(calls) == 1  # only the second shard was computed again
    assert _csv_hits(out)["dense_uot"] == world["hits"]["dense_uot"]["hit"]


def test_the_command_line_reads_a_dataset(world: dict, tmp_path: Path, capsys) -> None:
    root = export_flickr30k(world["samples"], tmp_path / "flickr", lossless=True)
    code = evaluate.main(["--dataset", f"flickr30k:{root}", "--limit", "2", "--methods",
                          "dense_uot", "--cache-dir", world["config"].cache_dir, "--out",
                          str(tmp_path / "out"), "--quiet", "--threads", "1"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "flickr30k_entities test captions, 2 images" in printed
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {
        "grounding.json", "grounding.md", "grounding.csv"}


def test_an_image_that_does_not_decode_is_skipped_and_counted(world: dict) -> None:
    """A JPEG whose header reads but whose pixels are cut off: its captions are left out and
    counted, every other phrase is scored as before."""
    root = export_flickr30k(world["samples"], world["root"] / "flickr-cut")
    image = root / "flickr30k-images" / "1001.jpg"
    image.write_bytes(image.read_bytes()[:1000])  # the header reads, the pixels do not
    table, stamp = _run(world, f"flickr30k:{root}", world["root"] / "out-cut")
    assert any("1 caption on an undecodable image" in note for note in table.notes)
    assert stamp["undecodable"][0].startswith("1001#0: 1001.jpg is not an image")
    n = sum(len(s.phrases) for k, s in enumerate(world["samples"]) if k != 1)
    assert {len(v) for v in _csv_hits(world["root"] / "out-cut").values()} == {n}


def test_trust_localisation_on_the_export_equals_the_world_trust_table(
        world: dict, monkeypatch) -> None:
    """``--tables grounding,trust``: pointing, relevance mass, rank and AUC of every row on
    the Flickr30k Entities export, its 2 shards pooled, equal the world trust table's on the
    same phrases (the image already at the model's input, the boxes pass through); added to
    a finished grounding run, only the trust values are computed."""
    root = export_flickr30k(world["samples"], world["root"] / "flickr-trust", lossless=True)
    out = world["root"] / "out-trust"
    _run(world, f"flickr30k:{root}", out)

    def not_again(*args, **kw):
        raise AssertionError("the grounding rows were computed again")

    monkeypatch.setattr(dataset_eval, "grounding_table", not_again)
    tables, _ = dataset_eval.run_dataset_eval(replace(
        world["config"], dataset=f"flickr30k:{root}", out=str(out), tables="grounding,trust"))
    trust = {r["name"]: r for r in tables[1].rows}
    reference, _ = trust_tables(world["suite"], N, seed=0, metrics=DATASET_TRUST_METRICS)
    want = {r["name"]: r for r in reference.rows if r["name"] != "colour_oracle"}
    assert trust.keys() == want.keys() >= {"dense_uot", "filip", "centre_prior", "uniform"}
    for name, row in want.items():
        for key in DATASET_TRUST_METRICS:
            # float32 maps of a batch of 4 or 6 images: equal to rounding
            assert trust[name][key] == pytest.approx(row[key], rel=1e-6), (name, key)
    assert 0 < trust["filip"]["pointing"] < 1  # hits and misses: the equality says something
    assert "randomisation" not in trust["filip"] and "deletion" not in trust["filip"]
    record = json.loads((out / "trust.json").read_text())
    assert set(record["tables"]) == {"trust"} and record["stamp"]["seed"] == 0
    assert len(list((out / "shards").glob("*.trust.json"))) == 2


def test_under_torchrun_a_rank_computes_its_own_shards(world: dict, monkeypatch) -> None:
    """Rank 1 of 2 computes the shards ``k`` with ``k % 2 == 1`` (of 3: shard 1) and no
    other, then waits at the barrier for the rest (the 2-process run itself:
    test_dataset_eval_ddp.py)."""
    from otviz.process_group import DistInfo

    root = export_flickr30k(world["samples"], world["root"] / "flickr-rank", lossless=True)
    out = world["root"] / "out-rank"
    computed = []
    real = dataset_eval.grounding_table

    def counted(suite, evalset, **kw):
        computed.append([s.caption for s in evalset.dataset.samples])
        return real(suite, evalset, **kw)

    class AtTheBarrier(Exception):
        pass

    def barrier(info: DistInfo) -> None:
        raise AtTheBarrier

    monkeypatch.setattr(dataset_eval, "grounding_table", counted)
    monkeypatch.setattr(dataset_eval, "setup", lambda device: DistInfo(1, 2))
    monkeypatch.setattr(dataset_eval, "barrier", barrier)
    monkeypatch.setattr(dataset_eval, "gathered", lambda value, info: [value, value])
    with pytest.raises(AtTheBarrier):
        _run(world, f"flickr30k:{root}", out, shard=2)
    captions = [s.caption for s in world["samples"]]
    assert computed == [captions[2:4]]  # 3 shards of 2 captions: rank 1 has shard 1 only
    assert len(list((out / "shards").glob("*.json"))) == 1


def test_processes_that_load_different_models_are_refused(world: dict, monkeypatch) -> None:
    """Two processes whose models differ (random weights drawn in each) would each score
    their shards with their own: refused before any shard, with the reason."""
    root = export_flickr30k(world["samples"][:1], world["root"] / "flickr-differ")
    monkeypatch.setattr(dataset_eval, "gathered",
                        lambda value, info: [value, {**value, "backbone": "another"}])
    with pytest.raises(ValueError, match="do not load the same model"):
        _run(world, f"flickr30k:{root}", world["root"] / "out-differ")
    assert not (world["root"] / "out-differ" / "shards").exists()
