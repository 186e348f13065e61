"""Every table ``otviz eval`` writes names its reading (the model, its patch features and
input side) in its title: on the world (over seeds too) and on a real grounding set."""

from __future__ import annotations

from pathlib import Path

import torch

from otviz.data.grounding_sets.export import export_flickr30k, world_draw
from otviz.eval import dataset_eval
from otviz.eval.config import EvalConfig
from otviz.eval.runner import load_backbone, read_tables, run_eval
from otviz.eval.segmentation import reading
from otviz.eval.world_set import world_config_of


def test_world_tables_name_the_features_and_size_they_were_read_at(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = EvalConfig(heads="training-free", methods="filip", tables="grounding,anchors",
                        n_test=2, n_compositional=0, seeds="0,1", threads=1,
                        features="layer:1", cache_dir=str(tmp_path / "cache"),
                        out=str(tmp_path / "out"))
    expected = reading(load_backbone().with_features("layer:1"))
    assert "features layer:1" in expected and "80 px input" in expected
    run_eval(config)
    written = read_tables(tmp_path / "out" / "tables.json")
    measured = {k: t for k, t in written.items() if k != "claims"}
    assert set(measured) == {"grounding", "anchors"}
    for key, table in measured.items():
        assert table.title.count(expected) == 1, (key, table.title)
    text = (tmp_path / "out" / "tables.md").read_text()
    assert text.count(expected) == 2


def test_a_grounding_set_table_names_its_reading(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    backbone = load_backbone()
    root = export_flickr30k(world_draw(2, "test", 0, world_config_of(backbone)),
                            tmp_path / "flickr", lossless=True)
    config = EvalConfig(heads="training-free", methods="filip", threads=1, shard=4,
                        dataset=f"flickr30k:{root}", cache_dir=str(tmp_path / "cache"),
                        out=str(tmp_path / "out"))
    tables, _ = dataset_eval.run_dataset_eval(config)
    assert tables[0].title.endswith(f"({reading(backbone)})")
    assert reading(backbone) in (tmp_path / "out" / "grounding.md").read_text()
