"""The grounding-set readers (Flickr30k Entities, RefCOCO, Visual Genome) on a world draw
exported in each published layout: what they read back is the world's own phrases and
boxes; hostile files are refused or skipped and counted, never run."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from otviz.data.datasets import EmptyDatasetError, MalformedDatasetError, MissingFilesError
from otviz.data.grounding_sets import load_grounding_set, parse_dataset_spec
from otviz.data.grounding_sets.export import (
    export_flickr30k,
    export_refcoco,
    export_visual_genome,
    world_draw,
)
from otviz.data.grounding_sets.flickr30k import parse_sentence
from otviz.data.grounding_sets.restricted_pickle import load_plain_pickle
from otviz.errors import InputError

N = 4


@pytest.fixture(scope="module")
def samples() -> list:
    return world_draw(N, "test", 0)


def _world_phrases(samples: list) -> list[tuple[str, tuple]]:
    return [(p.text, tuple(map(float, p.box))) for s in samples for p in s.phrases]


def _read_phrases(data) -> list[tuple[str, tuple]]:
    return [(p.text, p.boxes[0]) for it in data.items for p in it.phrases]


def test_parse_sentence_strips_the_markup_and_keeps_each_phrase_span() -> None:
    line = "[/EN#18/people A child] in [/EN#19/clothing/colour a pink dress] is climbing ."
    caption, phrases = parse_sentence(line)
    assert caption == "A child in a pink dress is climbing ."
    assert [(e, t, caption[a:b]) for e, t, a, b in phrases] == [
        (18, "A child", "A child"), (19, "a pink dress", "a pink dress")]


@pytest.mark.parametrize("lossless", [False, True])
def test_flickr30k_export_reads_back_the_world_phrases(tmp_path: Path, samples: list,
                                                       lossless: bool) -> None:
    export_flickr30k(samples, tmp_path, "test", lossless=lossless)
    data = load_grounding_set("flickr30k", tmp_path, "test")
    assert [it.caption for it in data.items] == [s.caption for s in samples]
    assert [[(p.start, p.end) for p in it.phrases] for it in data.items] == [
        [(p.start, p.end) for p in s.phrases] for s in samples]
    assert _read_phrases(data) == _world_phrases(samples)
    assert all(it.size == (80, 80) for it in data.items)
    assert not data.skipped.counts


def test_refcoco_pickle_and_json_read_the_same_refs(tmp_path: Path, samples: list) -> None:
    export_refcoco(samples, tmp_path, "testA")
    from_pickle = load_grounding_set("refcoco", tmp_path, "testA")
    assert _read_phrases(from_pickle) == _world_phrases(samples)
    assert all(it.caption == it.phrases[0].text for it in from_pickle.items)
    refs = load_plain_pickle((tmp_path / "refs(unc).p").read_bytes(), "refs(unc).p")
    (tmp_path / "refs(unc).p").unlink()
    (tmp_path / "refs(unc).json").write_text(json.dumps(refs))
    from_json = load_grounding_set("refcoco", tmp_path, "testA")
    assert from_json.items == from_pickle.items
    with pytest.raises(EmptyDatasetError, match="no ref in split 'testB'"):
        load_grounding_set("refcoco", tmp_path, "testB")


def test_visual_genome_regions_and_the_image_limit(tmp_path: Path, samples: list) -> None:
    export_visual_genome(samples, tmp_path)
    data = load_grounding_set("vg", tmp_path, "all")
    assert _read_phrases(data) == _world_phrases(samples)
    (tmp_path / "VG_100K_2").mkdir()
    (tmp_path / "VG_100K" / "3.jpg").rename(tmp_path / "VG_100K_2" / "3.jpg")
    both = load_grounding_set("vg", tmp_path, "all")  # images in both published folders
    assert _read_phrases(both) == _world_phrases(samples)
    assert {it.image.parent.name for it in both.items if it.key.startswith("3#")} == {
        "VG_100K_2"}
    two = load_grounding_set("vg", tmp_path, "all", limit=2)
    assert two.source["images"] == 2
    assert _read_phrases(two) == _world_phrases(samples[:2])


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_a_refs_pickle_naming_a_function_is_refused_and_nothing_runs(
        tmp_path: Path, samples: list) -> None:
    export_refcoco(samples, tmp_path, "testA")
    marker = tmp_path / "ran"
    (tmp_path / "refs(unc).p").write_bytes(pickle.dumps([_System(f"touch {marker}")]))
    with pytest.raises(MalformedDatasetError, match=r"refs\(unc\)\.p: refused.*system"):
        load_grounding_set("refcoco", tmp_path, "testA")
    assert not marker.exists()
    from collections import OrderedDict
    with pytest.raises(MalformedDatasetError, match="OrderedDict"):
        load_plain_pickle(pickle.dumps([OrderedDict(a=1)]), "refs(unc).p")
    with pytest.raises(MalformedDatasetError, match="not a readable pickle"):
        load_plain_pickle(b"\x80\x02]q\x00", "refs(unc).p")


def _flickr(tmp_path: Path, samples: list) -> Path:
    return export_flickr30k(samples, tmp_path, "test", lossless=True)


def test_malformed_xml_and_a_doctype_are_skipped_and_counted(tmp_path: Path,
                                                             samples: list) -> None:
    root = _flickr(tmp_path, samples)
    (root / "Annotations" / "1000.xml").write_text("<annotation><object>")
    (root / "Annotations" / "1001.xml").write_text(
        '<!DOCTYPE a [<!ENTITY x "xxxxxxxx">]><annotation>&x;</annotation>')
    data = load_grounding_set("flickr30k", root, "test")
    assert data.skipped.counts["malformed annotations"] == 2
    assert any("Annotations/1000.xml: not well-formed XML" in m for m in data.skipped.messages)
    assert any("Annotations/1001.xml: a document type declaration" in m
               for m in data.skipped.messages)
    assert [it.key for it in data.items] == ["1002#0", "1003#0"]


def test_a_missing_image_is_skipped_and_counted(tmp_path: Path, samples: list) -> None:
    root = _flickr(tmp_path, samples)
    (root / "flickr30k-images" / "1002.png").unlink()
    data = load_grounding_set("flickr30k", root, "test")
    assert data.skipped.counts == {"missing image": 1}
    assert "image 1002: image 1002.jpg not found or not allowed" in data.skipped.messages[0]
    assert len(data) == N - 1


def test_a_nobndbox_entity_and_a_box_outside_the_image(tmp_path: Path, samples: list) -> None:
    root = _flickr(tmp_path, samples)
    s = samples[0]
    nobox = len(s.objects) + 1  # the exporter's nobndbox entity
    sentence = root / "Sentences" / "1000.txt"
    sentence.write_text(sentence.read_text().rstrip("\n") + f" [/EN#{nobox}/scene the floor]\n")
    xml = root / "Annotations" / "1001.xml"
    first = samples[1].objects[0].box
    xml.write_text(xml.read_text().replace(
        f"<xmin>{first[0] + 1}</xmin><ymin>{first[1] + 1}</ymin><xmax>{first[2]}</xmax>",
        "<xmin>500</xmin><ymin>1</ymin><xmax>600</xmax>", 1))
    data = load_grounding_set("flickr30k", root, "test")
    assert data.skipped.counts["phrase without a box"] == 2  # the floor; the moved object
    assert data.skipped.counts["box outside the image"] == 1
    assert [p.text for p in data.items[0].phrases] == [p.text for p in s.phrases]
    assert data.items[0].caption.endswith("the floor")
    assert any(p.object_index == 0 for p in samples[1].phrases)
    assert [p.text for p in data.items[1].phrases] == [
        p.text for p in samples[1].phrases if p.object_index != 0]


def test_an_empty_split_and_bad_ids_have_clear_messages(tmp_path: Path, samples: list) -> None:
    root = _flickr(tmp_path, samples)
    (root / "val.txt").write_text("\n")
    with pytest.raises(EmptyDatasetError, match="val.txt: the split 'val' lists no image"):
        load_grounding_set("flickr30k", root, "val")
    (root / "val.txt").write_text("../../etc/passwd\n")
    with pytest.raises(MalformedDatasetError, match="val.txt, line 1: not an image id"):
        load_grounding_set("flickr30k", root, "val")
    with pytest.raises(MissingFilesError, match="train.txt"):
        load_grounding_set("flickr30k", root, "train")
    with pytest.raises(InputError, match="KIND:PATH"):
        parse_dataset_spec("coco:/data")


def test_image_names_and_symlinks_outside_the_root_are_refused(tmp_path: Path,
                                                               samples: list) -> None:
    root = export_refcoco(samples, tmp_path / "refcoco", "testA", lossless=True)
    instances = json.loads((root / "instances.json").read_text())
    instances["images"][0]["file_name"] = "../../outside.png"
    (root / "instances.json").write_text(json.dumps(instances))
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes((root / "images" / instances["images"][1]["file_name"]).read_bytes())
    link = root / "images" / instances["images"][1]["file_name"]
    link.unlink()
    link.symlink_to(outside)
    data = load_grounding_set("refcoco", root, "testA")
    assert data.skipped.counts == {"missing image": 2}  # counted once per image
    assert {it.image.name for it in data.items} == {
        im["file_name"] for im in instances["images"][2:]}
    assert all("not found or not allowed" in m for m in data.skipped.messages)
    assert not any(str(tmp_path) in m for m in data.skipped.messages)


def test_the_world_command_writes_each_layout_and_detect_layout_names_it(tmp_path: Path
                                                                         ) -> None:
    from otviz.cli import world as world_cli
    from otviz.data.grounding_sets import detect_layout

    expected = {"flickr30k": ("flickr30k", "test"), "refcoco": ("refcoco", "testA"),
                "vg": ("vg", "all")}
    for kind, layout in expected.items():
        out = tmp_path / kind
        assert world_cli.main(["--n", "3", "--as", kind, "--out", str(out)]) == 0
        assert detect_layout(out) == layout
        data = load_grounding_set(layout[0], out, layout[1])
        assert _read_phrases(data) == _world_phrases(world_draw(3, "test", 0))
    assert detect_layout(tmp_path) is None
