"""``torchrun --nproc-per-node 2 -m otviz eval --dataset ...`` on the CPU (gloo): the two
processes share the shards (shard ``k`` to rank ``k % 2``) and rank 0 gathers the rows from
the shard files. On Flickr30k Entities (grounding) the table and every phrase's hit, on
VOC (``--tables segmentation``) every class's summed intersection and union, equal those of
one process.

Both commands run in one ``torchrun`` job (each start-up of a job, its launcher and two
interpreters importing torch and open_clip, costs about 14 s of CPU on the 2-core
machine): run as a script, this file is one of its processes, which runs ``python -m
otviz eval`` on the grounding set (the command's own process group), then again on the
segmentation set in a second group of the job (:func:`tests.helpers.fresh_process_group`).
"""

from __future__ import annotations

import csv
import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from otviz.cli import evaluate
from otviz.data.grounding_sets.export import export_flickr30k, world_draw
from otviz.eval.runner import load_backbone
from otviz.eval.world_set import world_config_of
from tests.eval.test_dataset_segmentation import _masks, write_voc
from tests.helpers import fresh_process_group, torchrun

N = 4  # world test images, one caption each: 4 shards of 1, 2 per process


def _flags(root: Path, out: str) -> list[str]:
    """``otviz eval`` on both sets (``root / "flickr"``, ``root / "VOC2012"``), writing
    under ``root / out``."""
    common = ["--methods", "dense_uot,filip", "--shard", "1", "--threads", "1", "--device",
              "cpu", "--quiet"]
    return {
        "grounding": ["--dataset", f"flickr30k:{root / 'flickr'}", *common,
                      "--cache-dir", str(root / f"cache-{out}"), "--out", str(root / out)],
        "segmentation": ["--dataset", f"voc:{root / 'VOC2012'}", "--tables", "segmentation",
                         *common, "--cache-dir", str(root / f"cache-seg-{out}"),
                         "--out", str(root / f"seg-{out}")],
    }


def _phrases(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((out / "grounding.csv").open()))


def _rows(path: Path, table: str) -> tuple[dict, dict[str, dict]]:
    """A written table file and its rows by name."""
    written = json.loads(path.read_text())
    return written, {r["name"]: r for r in written["tables"][table]["rows"]}


def test_two_processes_give_the_one_process_tables(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    samples = world_draw(N, "test", 0, world_config_of(load_backbone()))
    export_flickr30k(samples, tmp_path / "flickr", lossless=True)
    rng = np.random.default_rng(3)
    write_voc(tmp_path / "VOC2012", _masks(rng), rng)

    # a few seconds per process alone; the limit only guards against a hung process group
    stdout = torchrun([__file__, str(tmp_path)], timeout=600)
    assert stdout.count("Weak grounding of") == 1  # rank 0 alone prints the table
    assert stdout.count("Open-vocabulary segmentation of") == 1
    one_flags = _flags(tmp_path, "one")
    assert evaluate.main(one_flags["grounding"]) == 0
    assert evaluate.main(one_flags["segmentation"]) == 0

    two, one = _phrases(tmp_path / "two"), _phrases(tmp_path / "one")
    assert len(one) == 5 * sum(len(s.phrases) for s in samples)  # 2 methods, 3 baselines
    assert two == one  # phrase by phrase: item, phrase, text, row, hit, hit with tolerance
    # FILIP hits some phrases and misses others (and ties on some: expected hits between):
    # the equality says something
    assert {"0.0", "1.0"} <= {r["hit"] for r in one if r["method"] == "filip"}
    (two_table, two_rows), (one_table, one_rows) = (
        _rows(tmp_path / d / "grounding.json", "grounding") for d in ("two", "one"))
    assert two_rows.keys() == one_rows.keys()
    for name, row in one_rows.items():
        for key in ("pointing", "pointing_tol", "mean_iou", "hit@0.5", "n"):
            if key in row:
                assert two_rows[name][key] == pytest.approx(row[key]), (name, key)
    assert two_table["stamp"]["processes"] == 2 and one_table["stamp"]["processes"] == 1
    assert len(list((tmp_path / "two" / "shards").glob("*.json"))) == N

    (two_table, two_rows), (one_table, one_rows) = (
        _rows(tmp_path / d / "segmentation.json", "segmentation")
        for d in ("seg-two", "seg-one"))
    assert two_rows.keys() == one_rows.keys()
    for name, row in one_rows.items():
        for key in ("intersect", "union", "pixels", "miou"):
            assert two_rows[name][key] == row[key], (name, key)
    assert two_table["stamp"]["processes"] == 2 and one_table["stamp"]["processes"] == 1
    assert len(list((tmp_path / "seg-two" / "shards").glob("segmentation-*.json"))) == 3


def otviz_command(argv: list[str]) -> None:
    """``python -m otviz *argv`` in this process (``otviz/__main__.py`` run as the main
    module), failing on a non-zero exit status."""
    sys.argv = ["otviz", *argv]
    try:
        runpy.run_module("otviz", run_name="__main__")
    except SystemExit as stop:
        if stop.code:
            raise


def worker(root: str) -> None:
    """One torchrun process: the grounding command (its group ends with it), then the
    segmentation command in a second group."""
    import torch.distributed as dist

    flags = _flags(Path(root), "two")
    otviz_command(["eval", *flags["grounding"]])
    fresh_process_group("segmentation")
    otviz_command(["eval", *flags["segmentation"]])
    dist.destroy_process_group()


if __name__ == "__main__":
    worker(sys.argv[1])
