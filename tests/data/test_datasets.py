"""Image-caption folders (COCO captions, Karpathy split, CSV) built in tmp_path, their typed
errors, and the world behind the same protocol."""

import json
import os
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from otviz.boundary.problems import SHOWN_PROBLEMS
from otviz.data.datasets import (
    CaptionFolder,
    DatasetError,
    EmptyDatasetError,
    ImageCaptionDataset,
    MalformedDatasetError,
    MissingFilesError,
    WorldDataset,
    load_caption_csv,
    load_coco_captions,
    load_image_captions,
    load_karpathy,
)
from otviz.world import World, WorldConfig


def write_png(path: Path, value: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 8, 3), value, np.uint8)).save(path)
    return path


def coco_folder(root: Path) -> Path:
    for k, name in enumerate(("a.png", "b.png", "c.png")):
        write_png(root / "val2017" / name, 10 * (k + 1))
    ann = {
        "images": [
            {"id": 7, "file_name": "a.png"},
            {"id": 3, "file_name": "b.png"},
            {"id": 9, "file_name": "c.png"},  # no caption: dropped
        ],
        "annotations": [
            {"image_id": 3, "id": 1, "caption": "b one"},
            {"image_id": 7, "id": 2, "caption": " a one "},
            {"image_id": 3, "id": 3, "caption": "b two"},
        ],
    }
    path = root / "annotations" / "captions_val2017.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(ann))
    return path


def test_coco_captions_grouped_by_image(tmp_path):
    ds = load_coco_captions(coco_folder(tmp_path))
    assert isinstance(ds, ImageCaptionDataset)
    assert ds.n_images == 2 and len(ds) == 3
    # images in file order (a, b); pairs image by image, annotation order kept within one
    assert ds.captions == ["a one", "b one", "b two"]
    assert ds.groups() == [[0], [1, 2]]
    assert [ds.image_of(i) for i in range(3)] == [0, 1, 1]
    assert ds.item(2) == (tmp_path / "val2017" / "b.png", "b two")
    image = ds.load_image(1)
    assert image.mode == "RGB" and image.size == (8, 6) and image.getpixel((0, 0)) == (20,) * 3


def test_karpathy_splits(tmp_path):
    write_png(tmp_path / "val2014" / "x.jpg.png", 1)
    write_png(tmp_path / "val2014" / "y.png", 2)
    write_png(tmp_path / "train2014" / "z.png", 3)
    data = {
        "images": [
            {"split": "test", "filepath": "val2014", "filename": "x.jpg.png",
             "sentences": [{"raw": "x one"}, {"raw": "x two"}]},
            {"split": "restval", "filepath": "val2014", "filename": "y.png",
             "sentences": [{"raw": "y one"}]},
            {"split": "train", "filepath": "train2014", "filename": "z.png",
             "sentences": [{"raw": "z one"}]},
        ]
    }
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(data))
    test = load_karpathy(path, tmp_path, "test")
    assert test.captions == ["x one", "x two"] and test.groups() == [[0, 1]]
    assert test.image_paths == [tmp_path / "val2014" / "x.jpg.png"]
    train = load_karpathy(path, tmp_path, ("train", "restval"))
    assert train.captions == ["y one", "z one"] and train.n_images == 2
    with pytest.raises(EmptyDatasetError, match=r"no captioned image in split\(s\) \['val'\]"):
        load_karpathy(path, tmp_path, "val")


def test_csv_with_and_without_header(tmp_path):
    sub = tmp_path / "sub"
    write_png(sub / "img" / "p.png", 5)
    write_png(sub / "img" / "q.png", 6)
    body = 'img/p.png,"a red, round thing"\nimg/q.png,second\n\nimg/p.png,again p\n'
    (sub / "with.csv").write_text("path,caption\n" + body)
    (sub / "without.csv").write_text(body)
    for name in ("with.csv", "without.csv"):
        ds = load_caption_csv(sub / name)
        assert ds.captions == ["a red, round thing", "again p", "second"]
        assert ds.groups() == [[0, 1], [2]]
        assert ds.image_paths == [(sub / "img" / n).resolve() for n in ("p.png", "q.png")]


def test_missing_files_listed(tmp_path):
    """Every missing file named in one message, up to the cap, the others counted."""
    n = SHOWN_PROBLEMS + 5
    rows = "".join(f"missing_{k}.png,caption {k}\n" for k in range(n))
    (tmp_path / "d.csv").write_text(rows)
    with pytest.raises(MissingFilesError) as err:
        load_caption_csv(tmp_path / "d.csv")
    assert len(err.value.missing) == n and isinstance(err.value, FileNotFoundError)
    message = str(err.value)
    assert f"{n} file(s) missing" in message and "missing_0.png" in message
    assert f"missing_{SHOWN_PROBLEMS - 1}.png" in message
    assert f"missing_{SHOWN_PROBLEMS}.png" not in message and message.endswith("(and 5 more)")
    # skipping the check loads the table anyway
    assert len(load_caption_csv(tmp_path / "d.csv", check_files=False)) == n
    with pytest.raises(MissingFilesError, match="annotation file"):
        load_coco_captions(tmp_path / "annotations" / "captions_val2017.json")


def test_malformed_files(tmp_path):
    ann = coco_folder(tmp_path)
    good = json.loads(ann.read_text())
    cases = [
        ("{not json", "not valid JSON"),
        (json.dumps({"images": good["images"]}), "no list 'annotations'"),
        (json.dumps({**good, "annotations": [{"image_id": 3}]}), r"annotations\[0\] lacks"),
        (json.dumps({**good, "annotations": [{"image_id": 99, "caption": "x"}]}),
         "image_id is not the id of any entry"),
        (json.dumps({**good, "annotations": [{"image_id": 3, "caption": "  "}]}), "empty"),
    ]
    for text, match in cases:
        ann.write_text(text)
        with pytest.raises(MalformedDatasetError, match=match):
            load_coco_captions(ann)
    bad = tmp_path / "bad.csv"
    bad.write_text("a.png,ok\nb.png,two,three\n")
    with pytest.raises(MalformedDatasetError, match="line 2: expected 2 fields"):
        load_caption_csv(bad, check_files=False)


@pytest.mark.parametrize(("saved", "named"), [("NFD", "NFC"), ("NFC", "NFD")])
def test_a_name_in_another_unicode_normal_form_finds_its_file(tmp_path, saved, named):
    """A CSV naming ``café.png`` composed finds the file saved decomposed (as macOS writes
    names) and the other way round; the path stays confined to the upload."""
    name = "caf\u00e9.png"
    write_png(tmp_path / unicodedata.normalize(saved, name), 1)
    (tmp_path / "c.csv").write_text(f"{unicodedata.normalize(named, name)},a red circle\n",
                                    encoding="utf-8")
    ds = load_caption_csv(tmp_path / "c.csv", root=tmp_path)
    assert ds.image_paths == [tmp_path / unicodedata.normalize(saved, name)]
    assert ds.image_paths[0].is_file()


def test_entry_problems_reported_together(tmp_path):
    """Every bad row of a CSV and every bad entry of a COCO or Karpathy file, and the missing
    images, come in one message, every one named (the loaders used to stop at the first,
    then named three)."""
    write_png(tmp_path / "ok.png", 1)
    bad = tmp_path / "captions.csv"
    bad.write_text('ok.png,fine\na.png,"  "\nb.png,two,three\n,no path\nc.png,!!!\n'
                   'gone.png,present caption\n')
    assert refusal(lambda: load_caption_csv(bad, root=tmp_path)) == (
        "captions.csv: 4 problems: line 2: the caption is empty: type what the image shows; "
        "line 3: expected 2 fields (path,caption), got 3; line 4: empty image path; line 5: "
        "the caption has no letter or digit: type what the image shows"
        "; and images: 1 file(s) not found or not allowed: gone.png")
    ann = coco_folder(tmp_path / "coco")
    good = json.loads(ann.read_text())
    ann.write_text(json.dumps({**good, "annotations": [
        {"image_id": 3}, {"image_id": 99, "caption": "x"}, {"image_id": 3, "caption": 5}]}))
    assert refusal(lambda: load_coco_captions(ann, root=tmp_path)) == (
        "coco/annotations/captions_val2017.json: 3 problems: annotations[0] lacks ['caption']; "
        "annotations[1].image_id is not the id of any entry of images; annotations[2]: the "
        "caption is not text")
    karpathy = tmp_path / "dataset_x.json"
    karpathy.write_text(json.dumps({"images": [
        {"split": "test", "filename": "ok.png", "sentences": [{"raw": " "}, {}]},
        {"split": "test", "filename": "ok.png", "sentences": 3}, "no object"]}))
    message = refusal(lambda: load_karpathy(karpathy, tmp_path, root=tmp_path))
    assert message.startswith("dataset_x.json: 4 problems: images[0]: the caption is empty")
    assert message.count("; ") == 3 and "more)" not in message


def refusal(load) -> str:
    """The message of the :class:`DatasetError` ``load()`` raises."""
    with pytest.raises(DatasetError) as caught:
        load()
    return str(caught.value)


def test_no_annotation_file_says_what_is_accepted(tmp_path):
    """An annotations-only COCO folder: the message lists the accepted files and the ones
    found instead, relative to the folder (it used to say "found []")."""
    folder = tmp_path / "upload"
    for name in ("captions_train2017.json", "captions_val2017.json", "instances_val2017.json",
                 "person_keypoints_val2017.json"):
        (folder / "annotations").mkdir(parents=True, exist_ok=True)
        (folder / "annotations" / name).write_text("{}")
    message = refusal(lambda: load_image_captions(folder, root=folder))
    assert message == (
        "no caption annotation file found; accepted: a *.csv of path,caption rows, "
        "annotations/captions_test.json (COCO captions of split test), or a dataset_*.json "
        "(Karpathy split); found instead 4 other .json/.csv file(s): "
        "annotations/captions_train2017.json; annotations/captions_val2017.json; "
        "annotations/instances_val2017.json; annotations/person_keypoints_val2017.json")
    assert str(tmp_path) not in message
    empty = tmp_path / "images_only"
    write_png(empty / "a.png", 1)
    assert refusal(lambda: load_image_captions(empty, root=tmp_path)).startswith(
        "images_only: no caption annotation file found; accepted")
    assert refusal(lambda: load_image_captions(empty, root=tmp_path)).endswith(
        "; found no .json or .csv file")


def test_empty_dataset(tmp_path):
    (tmp_path / "e.csv").write_text("path,caption\n")
    with pytest.raises(EmptyDatasetError):
        load_caption_csv(tmp_path / "e.csv")
    with pytest.raises(EmptyDatasetError):
        CaptionFolder([], [], [])


def test_format_recognised_from_path(tmp_path):
    coco = coco_folder(tmp_path / "coco")
    assert load_image_captions(coco).source["format"] == "coco"
    assert load_image_captions(tmp_path / "coco", split="val2017").source["format"] == "coco"
    write_png(tmp_path / "csv" / "p.png", 1)
    (tmp_path / "csv" / "pairs.csv").write_text("p.png,hello\n")
    assert load_image_captions(tmp_path / "csv").captions == ["hello"]
    (tmp_path / "k").mkdir()
    write_png(tmp_path / "k" / "f.png", 1)
    (tmp_path / "k" / "dataset_flickr8k.json").write_text(json.dumps(
        {"images": [{"split": "test", "filename": "f.png", "sentences": [{"raw": "f"}]}]}
    ))
    assert load_image_captions(tmp_path / "k").source["format"] == "karpathy"


def test_fingerprint_tracks_file_changes(tmp_path):
    ann = coco_folder(tmp_path)
    first = load_coco_captions(ann).fingerprint()
    assert load_coco_captions(ann).fingerprint() == first
    png = tmp_path / "val2017" / "b.png"
    st = png.stat()
    os.utime(png, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched = load_coco_captions(ann).fingerprint()
    assert touched != first and touched["captions"] == first["captions"]
    data = json.loads(ann.read_text())
    data["annotations"][0]["caption"] = "b changed"
    ann.write_text(json.dumps(data))
    assert load_coco_captions(ann).fingerprint()["captions"] != first["captions"]
    png.unlink()  # deleted after loading: the fingerprint says which file is gone
    with pytest.raises(MissingFilesError, match="b.png"):
        load_coco_captions(ann, check_files=False).fingerprint()


def test_world_dataset_protocol():
    ds = WorldDataset(4, split="test", seed=3)
    assert isinstance(ds, ImageCaptionDataset)
    world = World(WorldConfig(), "test", seed=3)
    for i in range(4):
        image, caption = ds.item(i)
        s = world.sample(i)
        assert caption == s.caption and np.array_equal(np.asarray(image), s.image)
    assert ds.groups() == [[0], [1], [2], [3]] and ds.n_images == 4
    assert ds.sample(2).phrases == world.sample(2).phrases
    with pytest.raises(IndexError):
        ds.sample(4)


def test_world_fingerprint_ignores_negatives_only():
    plain = WorldDataset(3, "test", 1, WorldConfig(negatives=False))
    full = WorldDataset(3, "test", 1, WorldConfig(negatives=True))
    # the negatives flag changes neither images nor captions, so it is not part of the key
    for i in range(3):
        a, b = plain.item(i), full.item(i)
        assert a[1] == b[1] and np.array_equal(np.asarray(a[0]), np.asarray(b[0]))
    assert plain.fingerprint() == full.fingerprint()
    others = [WorldDataset(4, "test", 1), WorldDataset(3, "train", 1), WorldDataset(3, "test", 2),
              WorldDataset(3, "test", 1, WorldConfig(pixel_noise=0.0))]
    assert all(o.fingerprint() != full.fingerprint() for o in others)


# --------------------------------------------------------------------- confinement
@pytest.fixture()
def jail(tmp_path):
    """A root holding one good image, and a secret file outside it."""
    root = tmp_path / "root"
    write_png(root / "ok.png", 1)
    secret = tmp_path / "secret.png"
    write_png(secret, 2)
    return root, secret


@pytest.mark.parametrize(
    "bad",
    ["{secret}", "../secret.png", "sub/../../secret.png", "link.png", "nowhere.png",
     "C:\\secret.png"],
    ids=["absolute", "dotdot", "nested-dotdot", "symlink-out", "missing", "windows-drive"],
)
def test_confined_csv_refuses_paths_leaving_the_root_like_missing_ones(jail, bad):
    root, secret = jail
    (root / "link.png").symlink_to(secret)
    name = bad.format(secret=secret)
    csv_file = root / "captions.csv"
    csv_file.write_text(f"ok.png,fine\n{name},sneaky\n")
    with pytest.raises(MissingFilesError) as caught:
        load_caption_csv(csv_file, root=root)
    message = str(caught.value)
    assert message == f"images: 1 file(s) not found or not allowed: {Path(name)}"
    assert str(root) not in message  # shown relative to the root


def test_confined_coco_and_karpathy_refuse_escaping_images(jail):
    root, secret = jail
    ann = root / "annotations" / "captions_train.json"
    ann.parent.mkdir()
    (root / "train").mkdir()
    (root / "train" / "ok.png").symlink_to(root / "ok.png")  # a symlink inside stays allowed
    ann.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "ok.png"}, {"id": 2, "file_name": str(secret)}],
        "annotations": [{"image_id": 1, "caption": "a"}, {"image_id": 2, "caption": "b"}],
    }))
    with pytest.raises(MissingFilesError, match="1 file\\(s\\) not found or not allowed"):
        load_coco_captions(ann, root=root)
    karpathy = root / "dataset_x.json"
    karpathy.write_text(json.dumps({"images": [
        {"split": "test", "filepath": "..", "filename": "secret.png", "sentences": [{"raw": "s"}]},
        {"split": "test", "filepath": "", "filename": "ok.png", "sentences": [{"raw": "o"}]},
    ]}))
    with pytest.raises(MissingFilesError, match="not allowed: ../secret.png$"):
        load_karpathy(karpathy, root, root=root)
    karpathy.write_text(json.dumps({"images": [
        {"split": "test", "filepath": "train", "filename": "ok.png", "sentences": [{"raw": "o"}]},
    ]}))
    assert load_karpathy(karpathy, root, root=root).captions == ["o"]


def test_confined_annotation_outside_the_root_is_not_read(jail, tmp_path):
    root, _ = jail
    outside = tmp_path / "private.csv"
    outside.write_text("root:x:0:0:secret-field,caption\n")
    (root / "captions.csv").symlink_to(outside)
    for target in (outside, root / "captions.csv", root.parent, tmp_path / "absent.csv"):
        with pytest.raises(MissingFilesError) as caught:
            load_image_captions(target, root=root)
        assert "not found or not allowed" in str(caught.value)
        assert "secret-field" not in str(caught.value) and str(tmp_path) not in str(caught.value)


def test_messages_do_not_quote_file_contents(tmp_path):
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text("a.png,one,SECRET-VALUE\n")
    with pytest.raises(MalformedDatasetError) as caught:
        load_caption_csv(csv_file, check_files=False, root=tmp_path)
    assert "SECRET-VALUE" not in str(caught.value) and "line 1" in str(caught.value)
