"""``torchrun --nproc-per-node 2 -m otviz eval --dataset voc:DIR --tables segmentation`` on
the CPU (gloo): the processes share the shards, every class's summed intersection and union
equal those of one process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from otviz.cli import evaluate
from tests.eval.test_dataset_segmentation import _masks, write_voc
from tests.helpers import torchrun


def _flags(root: Path, out: Path, cache: Path) -> list[str]:
    return ["--dataset", f"voc:{root}", "--tables", "segmentation", "--methods",
            "dense_uot,filip", "--shard", "1", "--threads", "1", "--device", "cpu", "--quiet",
            "--cache-dir", str(cache), "--out", str(out)]


def test_two_processes_sum_the_one_process_counts(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    root = tmp_path / "VOC2012"
    write_voc(root, _masks(rng), rng)
    stdout = torchrun(["-m", "otviz", "eval", *_flags(root, tmp_path / "two",
                                                      tmp_path / "cache-two")], timeout=600)
    assert stdout.count("Open-vocabulary segmentation of") == 1  # rank 0 alone prints
    assert evaluate.main(_flags(root, tmp_path / "one", tmp_path / "cache-one")) == 0
    two, one = (json.loads((tmp_path / d / "segmentation.json").read_text())
                for d in ("two", "one"))
    rows = [{r["name"]: r for r in t["tables"]["segmentation"]["rows"]} for t in (two, one)]
    assert rows[0].keys() == rows[1].keys()
    for name, row in rows[1].items():
        for key in ("intersect", "union", "pixels", "miou"):
            assert rows[0][name][key] == row[key], (name, key)
    assert two["stamp"]["processes"] == 2 and one["stamp"]["processes"] == 1
    assert len(list((tmp_path / "two" / "shards").glob("segmentation-*.json"))) == 3
