"""``otviz eval --dataset voc:DIR --tables segmentation`` on a PASCAL VOC 2012 folder in its
published layout written here (palette class masks with void borders, images of several
sizes): labelled pixels per class equal to the masks' own counts, the gold-mask row at
mIoU 1, an mIoU for every method and explainer asked; VOC20 voids the background; hostile
masks and ids are refused or skipped, naming the file; Cityscapes and ADE20K in their
layouts; the class names cut into captions that fit the text tower's context."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from otviz.cli import evaluate
from otviz.data.datasets import MalformedDatasetError
from otviz.data.segmentation_sets import VOC_CLASSES, VOID, load_segmentation_set
from otviz.eval.config import EvalConfig
from otviz.eval.dataset_segmentation import class_chunks, run_segmentation_eval

METHODS = "filip,dense_uot,conceptot"
SIZES = ((64, 48), (40, 56), (50, 50))


def _palette() -> list[int]:
    """VOC's colour map (bit-interleaved), as its PNGs carry it."""
    out = []
    for k in range(256):
        r = g = b = 0
        c = k
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        out += [r, g, b]
    return out


def write_voc(root: Path, masks: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """A VOC 2012 folder: ``JPEGImages/<id>.jpg``, ``SegmentationClass/<id>.png`` (mode P,
    VOC palette), ``ImageSets/Segmentation/val.txt``."""
    for sub in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for key, mask in masks.items():
        h, w = mask.shape
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
            root / "JPEGImages" / f"{key}.jpg")
        png = Image.fromarray(mask.astype(np.uint8), mode="P")
        png.putpalette(_palette())
        png.save(root / "SegmentationClass" / f"{key}.png")
    (root / "ImageSets/Segmentation/val.txt").write_text("\n".join(masks) + "\n")


def _masks(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Background with two objects each, a void band around each object."""
    out = {}
    for n, (w, h) in enumerate(SIZES):
        mask = np.zeros((h, w), dtype=np.uint8)
        for cls in rng.choice(np.arange(1, 21), 2, replace=False):
            x0, y0 = rng.integers(2, w // 2), rng.integers(2, h // 2)
            x1, y1 = x0 + rng.integers(8, w // 2), y0 + rng.integers(8, h // 2)
            mask[y0 - 1 : y1 + 1, x0 - 1 : x1 + 1] = 255
            mask[y0:y1, x0:x1] = cls
        out[f"2007_{n:06d}"] = mask
    return out


@pytest.fixture(scope="module")
def voc(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("voc") / "VOC2012"
    masks = _masks(rng)
    write_voc(root, masks, rng)
    return root, masks


def _run(root: Path, kind: str, out: Path, tmp: Path, *more: str) -> dict:
    argv = ["--dataset", f"{kind}:{root}", "--tables", "segmentation", "--methods", METHODS,
            "--explainers", "maskclip,legrad", "--threads", "1", "--shard", "2", "--quiet",
            "--cache-dir", str(tmp / "cache"), "--out", str(out), *more]
    assert evaluate.main(argv) == 0
    return json.loads((out / "segmentation.json").read_text())["tables"]["segmentation"]


def test_voc21_pixels_gold_and_every_method(voc, tmp_path: Path) -> None:
    root, masks = voc
    table = _run(root, "voc", tmp_path / "out", tmp_path)
    rows = {r["name"]: r for r in table["rows"]}
    labels = np.concatenate([m.ravel() for m in masks.values()])
    expected = {c: int((labels == k).sum()) for k, c in enumerate(VOC_CLASSES)}
    for row in table["rows"]:
        if "pixels" in row:
            assert row["pixels"] == expected
    assert rows["gold_masks"]["miou"] == 1.0
    for name in (*METHODS.split(","), "maskclip", "legrad", "uniform", "centre_prior"):
        assert 0.0 <= rows[name]["miou"] <= 1.0, name
        assert 0.0 <= rows[name]["pointing"] <= rows[name]["pointing_tol"] <= 1.0, name
    # pointing: one trial per (image, object class present), the gold masks always hit
    trials = {c: sum(int((m == k).any()) for m in masks.values()) if k else 0
              for k, c in enumerate(VOC_CLASSES)}
    assert rows["gold_masks"]["pointing_trials"] == trials
    assert rows["gold_masks"]["pointing"] == rows["gold_masks"]["pointing_tol"] == 1.0
    # the uniform map: every pixel tied, so a class scores its pixels' share of its images
    chance = [np.mean([(m == k).sum() / m.size for m in masks.values() if (m == k).any()])
              for k in range(1, 21) if trials[VOC_CLASSES[k]]]
    assert rows["uniform"]["pointing"] == pytest.approx(np.mean(chance))
    # the uniform map: background everywhere; its IoU is the background's share
    present = [c for c in VOC_CLASSES if expected[c]]
    share = expected["background"] / sum(expected.values())
    assert rows["uniform"]["iou_background"] == pytest.approx(share)
    assert rows["uniform"]["miou"] == pytest.approx(share / len(present))
    assert (tmp_path / "out" / "segmentation.md").read_text().count("| Gold masks | 100.0") == 1
    # the tiny CLIP's 32-token context: the names go without commas, so every class is read
    assert not any("context cut" in n for n in table["notes"])


def test_voc21_with_a_sliding_window(voc, tmp_path: Path) -> None:
    """Windows of 32 px every 16 on images resized to a shorter side of 40: the same labelled
    pixels, gold masks at 1, an mIoU per method, and the setting in the stamp."""
    root, masks = voc
    out = tmp_path / "out"
    table = _run(root, "voc", out, tmp_path, "--slide", "40:32:16")
    labels = np.concatenate([m.ravel() for m in masks.values()])
    gold = next(r for r in table["rows"] if r["name"] == "gold_masks")
    assert gold["miou"] == 1.0
    assert gold["pixels"] == {c: int((labels == k).sum()) for k, c in enumerate(VOC_CLASSES)}
    for row in table["rows"]:
        if row["name"] in METHODS.split(","):
            assert 0.0 <= row["miou"] <= 1.0
    stamp = json.loads((out / "segmentation.json").read_text())["stamp"]
    assert stamp["config"]["slide"] == "40:32:16"


def test_voc21_with_prompt_templates(voc, tmp_path: Path, monkeypatch) -> None:
    """``--templates``: named in the title and the stamp's config. With one template "{}"
    the plans read the bare names' captions, so every method's row equals the single-prompt
    run's exactly (the mean of one template's maps is that map); with two templates the
    methods read the filled captions and the explainers the ensembled embeddings. (The 80
    templates on the tiny CLIP would take 560 captions per image: the set is patched.)"""
    from otviz.text import templates as T

    root, _ = voc
    single = _run(root, "voc", tmp_path / "one", tmp_path)
    assert "one prompt a class" in single["title"]
    before = {r["name"]: r for r in single["rows"]}
    monkeypatch.setitem(T.TEMPLATE_SETS, "imagenet80", ("{}",))
    bare = _run(root, "voc", tmp_path / "bare", tmp_path, "--templates", "imagenet80")
    for row in bare["rows"]:
        if row["name"] in (*METHODS.split(","), "gold_masks", "uniform", "centre_prior"):
            assert row == before[row["name"]], row["name"]
    monkeypatch.setitem(T.TEMPLATE_SETS, "imagenet80", ("a photo of a {}.", "itap of my {}."))
    out = tmp_path / "out"
    table = _run(root, "voc", out, tmp_path, "--templates", "imagenet80")
    assert "imagenet80 ensemble of 2 templates" in table["title"]
    assert json.loads((out / "segmentation.json").read_text())["stamp"]["config"][
        "templates"] == "imagenet80"
    rows = {r["name"]: r for r in table["rows"]}
    for name in (*METHODS.split(","), "maskclip", "legrad"):
        assert 0.0 <= rows[name]["miou"] <= 1.0, name
    assert rows["gold_masks"] == before["gold_masks"]
    assert any(rows[m]["miou"] != before[m]["miou"] for m in METHODS.split(","))


def test_template_mean_against_a_loop() -> None:
    """Each class's map is the mean of its maps over the templates that kept it, placed at
    the bare names' row; a class no template kept gets an all-zero map."""
    from otviz.eval.dataset_segmentation import template_mean

    gen = torch.Generator().manual_seed(0)
    first = torch.rand(5, 4, generator=gen, dtype=torch.float64)
    second = torch.rand(3, 4, generator=gen, dtype=torch.float64)
    target = [[[2, 0, 1, -1]], [[3, 4, -1, 5]]]  # two images, one window, four classes
    rows_a = [[[0, 1, 2, -1]], [[3, 4, -1, -1]]]
    rows_b = [[[2, -1, 0, -1]], [[1, -1, -1, -1]]]
    got = template_mean([(first, rows_a), (second, rows_b)], target, 6)
    expected = torch.zeros(6, 4, dtype=torch.float64)
    expected[2] = (first[0] + second[2]).double() / 2
    expected[0] = first[1].double()
    expected[1] = (first[2] + second[0]).double() / 2
    expected[3] = (first[3] + second[1]).double() / 2
    expected[4] = first[4].double()
    torch.testing.assert_close(got, expected, atol=1e-15, rtol=0)  # row 5: kept by none


def test_voc20_voids_the_background(voc, tmp_path: Path) -> None:
    root, masks = voc
    table = _run(root, "voc20", tmp_path / "out", tmp_path)
    labels = np.concatenate([m.ravel() for m in masks.values()])
    expected = {c: int((labels == k + 1).sum()) for k, c in enumerate(VOC_CLASSES[1:])}
    gold = next(r for r in table["rows"] if r["name"] == "gold_masks")
    assert gold["pixels"] == expected and gold["miou"] == 1.0
    assert "iou_background" not in gold


def test_hostile_masks_and_ids(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    root = tmp_path / "voc"
    mask = np.zeros((20, 30), dtype=np.uint8)
    mask[5:10, 5:10] = 40  # not a VOC label
    write_voc(root, {"bad": mask}, rng)
    (root / "ImageSets/Segmentation/val.txt").write_text("bad\n../../etc/passwd\nmissing\n")
    data = load_segmentation_set("voc", root)
    assert len(data) == 1 and data.skipped.counts["missing image"] == 2
    with pytest.raises(MalformedDatasetError, match=r"bad\.png.*40"):
        data.load_labels(0)
    Image.fromarray(np.zeros((21, 30), dtype=np.uint8), mode="L").save(
        root / "SegmentationClass" / "bad.png")
    with pytest.raises(MalformedDatasetError, match=r"bad\.png: class mask is 30x21"):
        load_segmentation_set("voc", root).load_labels(0)
    Image.fromarray(np.zeros((20, 30, 3), dtype=np.uint8)).save(
        root / "SegmentationClass" / "bad.png")
    with pytest.raises(MalformedDatasetError, match="mode RGB"):
        load_segmentation_set("voc", root).load_labels(0)


def test_world_export_reads_back_as_voc(tmp_path: Path) -> None:
    """World samples in VOC's layout: the reader gives back each sample's labels, objects
    as 1 + their shape's index, their antialiased edges void."""
    from otviz.data.grounding_sets.export import world_draw
    from otviz.data.segmentation_export import export_voc
    from otviz.world import SHAPES
    from otviz.world.render import object_labels, shape_alpha

    samples = world_draw(3, "test", 0)
    data = load_segmentation_set("voc", export_voc(samples, tmp_path / "voc"))
    assert [it.key for it in data.items] == ["world_000000", "world_000001", "world_000002"]
    for i, sample in enumerate(samples):
        labels = data.load_labels(i)
        assert np.array_equal(np.asarray(data.load_image(i)), sample.image)
        own = object_labels(sample.objects, sample.image.shape[0])
        for obj in sample.objects:
            x0, y0, x1, y1 = obj.box
            alpha = shape_alpha(obj.shape, x1 - x0)
            inner = labels[y0:y1, x0:x1]
            assert (inner[alpha == 1.0] == 1 + SHAPES.index(obj.shape)).all()
            assert (inner[(alpha > 0) & (alpha < 1)] == VOID).all()
        assert (labels[own == 0][labels[own == 0] != VOID] == 0).all()



def _write_set(root: Path, images: dict[str, tuple[str, np.ndarray]], rng: np.random.Generator
               ) -> None:
    """Image and mask files at the relative paths given (``key -> (image path, mask)``, the
    mask written at ``key``)."""
    for key, (image, mask) in images.items():
        for rel in (image, key):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
        h, w = mask.shape
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / image)
        Image.fromarray(mask, mode="L").save(root / key)


@pytest.mark.parametrize("kind", ["cityscapes", "ade20k", "coco-object"])
def test_scanned_layouts_count_their_labels(kind: str, tmp_path: Path) -> None:
    """Cityscapes (train ids: label k is class k, nested city folders), ADE20K (label 0
    void, k the class k - 1; 150 names in several captions of the tiny CLIP) and
    COCO-Object (SCLIP's layout: ``images/val2017/<id>.jpg``,
    ``annotations/val2017/<id>_instanceTrainIds.png``, 0 background, k the k-th of COCO's 80
    object classes): pixels per class are the masks' counts, the gold masks score 1."""
    from otviz.data.segmentation_sets import LAYOUTS

    rng = np.random.default_rng(2)
    layout = LAYOUTS[kind]
    top = len(layout.names) - (kind == "cityscapes")
    masks = {}
    for n, (w, h) in enumerate(((48, 32), (40, 40))):
        mask = rng.integers(0, top + 1, (h, w)).astype(np.uint8)
        mask[:2] = VOID
        stem = f"city{n}/img{n}" if kind == "cityscapes" else f"img{n}"
        key = f"{layout.masks.format(split=layout.split)}/{stem}{layout.mask_suffix}"
        image = f"{layout.images.format(split=layout.split)}/{stem}{layout.image_suffix}"
        masks[key] = (image, mask)
    _write_set(tmp_path / kind, masks, rng)
    data = load_segmentation_set(kind, tmp_path / kind)
    assert len(data) == 2
    config = EvalConfig(dataset=f"{kind}:{tmp_path / kind}", tables="segmentation",
                        methods="conceptot", threads=1, out="",
                        cache_dir=str(tmp_path / "cache"))
    (table,), _ = run_segmentation_eval(config)
    labels = np.concatenate([m.ravel() for _, m in masks.values()])
    shift = 1 if kind == "ade20k" else 0
    expected = {c: int((labels == k + shift).sum()) for k, c in enumerate(layout.classes)}
    gold = next(r for r in table.rows if r["name"] == "gold_masks")
    assert gold["pixels"] == expected and gold["miou"] == 1.0
    assert 0.0 <= next(r for r in table.rows if r["name"] == "conceptot")["miou"] <= 1.0
    if kind == "coco-object":
        assert layout.classes[0] == "background" and len(layout.classes) == 81
        assert any("traffic light" in n and "and background" in n for n in table.notes)


def test_class_chunks_fit_the_context() -> None:
    """Every chunk's caption keeps its last word under the tiny CLIP's 32 tokens, the
    chunks cover the names in order, and no chunk could take its next name."""
    from otviz.data.segmentation_classes import ADE20K_NAMES
    from otviz.eval.runner import load_backbone
    from otviz.text.words import split_words

    backbone = load_backbone()
    chunks = class_chunks(backbone, ADE20K_NAMES)
    assert chunks[0][0] == 0 and chunks[-1][1] == len(ADE20K_NAMES)
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:], strict=False))

    def last_word_read(names: tuple[str, ...]) -> bool:
        caption = ", ".join(names)
        return int(backbone.words([caption]).token_word.max()) + 1 == len(split_words(caption))

    for start, end in chunks:
        assert last_word_read(ADE20K_NAMES[start:end])
        if end < len(ADE20K_NAMES):
            assert not last_word_read(ADE20K_NAMES[start : end + 1])


def test_a_stopped_run_resumes_from_its_shards(voc, tmp_path: Path, monkeypatch) -> None:
    """Every shard's counts are kept in out/shards: a second run computes none of them, a
    run missing one computes that one only, and the table is the same."""
    from otviz.eval import dataset_segmentation as D

    root, _ = voc
    out = tmp_path / "out"
    first = _run(root, "voc", out, tmp_path)
    files = sorted((out / "shards").glob("segmentation-*.json"))
    assert len(files) == 2  # 3 images, 2 a shard
    computed = []
    real = D._shard_counts
    monkeypatch.setattr(D, "_shard_counts",
                        lambda job, k, part: computed.append(k) or real(job, k, part))
    assert _run(root, "voc", out, tmp_path) == first and computed == []
    files[1].unlink()
    assert _run(root, "voc", out, tmp_path) == first and len(computed) == 1
