"""The evaluation runner's tables on a tiny fixture (a random tiny CLIP made here, a handful of
world samples), checked against per-pair references computed one pair at a time."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from otviz.backbone import Backbone
from otviz.eval import alignment_tables as A
from otviz.eval import classification_tables as C
from otviz.eval.classification_metrics import accuracy, shot_split_accuracy
from otviz.eval.table import Column, Table
from otviz.eval.world_set import EvalSet, WorldProbeDataset, trim_tokens
from otviz.ot.sinkhorn import sinkhorn_log
from otviz.ot.zeroshot import long_tailed_predict, zero_shot_predict
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite
from otviz.text.words import split_words
from otviz.world import NEGATIVE_CATEGORIES, ClassificationView, long_tailed_counts
from otviz.world.classification import ORDERS
from tests.helpers import random_tiny_clip

NAMES = ("global_only", "filip", "dense_uot", "conceptot", "powerclip")


@pytest.fixture(autouse=True)
def _threads() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("evaltables")
    backbone = Backbone.from_checkpoint(random_tiny_clip(root / "bb", 3))
    suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:40], NAMES)
    test = EvalSet.build(backbone, 6, "test", 0, str(root / "cache"))
    comp = EvalSet.build(backbone, 4, "compositional", 0, str(root / "cache"))
    return {"backbone": backbone, "suite": suite, "test": test, "comp": comp}


def one_pair(data: EvalSet, entry, image: int, text: int):
    """The alignment of a single pair (the reference: no batching, no trimming)."""
    batch = data.features(entry.space).pairs([image], [text])
    nodes, node_mask = data.nodes()
    batch.nodes, batch.node_mask = nodes[[text]], node_mask[[text]]
    with torch.no_grad():
        return entry.method(batch)


def test_probe_dataset_lists_true_captions_then_negatives() -> None:
    ds = WorldProbeDataset(5, "test", 0)
    assert len(ds) == 5 + sum(len(s.negatives) for s in ds.samples)
    for j, s in enumerate(ds.samples):
        p = int(ds.positives[j])
        assert ds.captions[p] == s.caption and ds.categories[p] is None
        negs = [q for q in range(len(ds)) if ds.pair_image[q] == j and ds.categories[q]]
        assert [ds.categories[q] for q in negs] == [c for c in NEGATIVE_CATEGORIES
                                                    if c in s.negatives]
        assert all(ds.captions[q] == s.negatives[ds.categories[q]] for q in negs)
        assert all(ds.trees[q].leaves() == [w.text for w in split_words(ds.captions[q])]
                   for q in negs + [p])
    assert ds.groups() == [[int(p)] for p in ds.positives]
    assert ds.fingerprint()["kind"] == "world-probe"


def test_trimming_the_padding_changes_no_score(setup: dict) -> None:
    data, suite = setup["test"], setup["suite"]
    idx = torch.arange(data.n_images)
    for entry in suite.methods.values():
        full = data.features(entry.space).pairs(idx, data.positives)
        full.nodes, full.node_mask = (t[data.positives] for t in data.nodes())
        trimmed = trim_tokens(data.features(entry.space).pairs(idx, data.positives))
        assert trimmed.tokens.shape[1] < full.tokens.shape[1]
        with torch.no_grad():
            a = entry.method(full).local_score
            b = entry.method(data.pairs(idx, data.positives, entry.space)).local_score
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _recall_by_hand(scores: np.ndarray, k: int) -> float:
    hits = 0
    for i in range(scores.shape[0]):
        rank = sum(1 for j in range(scores.shape[1]) if j != i and scores[i, j] >= scores[i, i])
        hits += rank < k
    return hits / scores.shape[0]


def test_retrieval_table_matches_per_pair_reranking(setup: dict) -> None:
    data, suite = setup["test"], setup["suite"]
    k = 3
    table = A.retrieval_table(suite, data, k=k, chunk=5)
    img, txt = data.global_embeddings()
    g = (torch.nn.functional.normalize(img, dim=-1)
         @ torch.nn.functional.normalize(txt, dim=-1).T).double().numpy()
    n = data.n_images
    for row in table.rows:
        entry = suite.methods[row["name"]]
        local = np.array([[float(one_pair(data, entry, i, int(data.positives[t])).local_score[0])
                           for t in range(n)] for i in range(n)])
        combined = g + entry.lambda_local * local
        for direction, s, gs in (("i2t", combined, g), ("t2i", combined.T, g.T)):
            # candidates: each query's global top-k; the rest can never be retrieved
            top = np.argsort(-gs, axis=1, kind="stable")[:, :k]
            masked = np.full_like(s, -np.inf)
            for q in range(n):
                masked[q, top[q]] = s[q, top[q]]
            for kk in (1, 5, 10):
                assert row[f"{direction}_r{kk}"] == pytest.approx(_recall_by_hand(masked, kk),
                                                                  abs=1e-6), (row, direction, kk)
        assert row["avg_r1"] == pytest.approx((row["i2t_r1"] + row["t2i_r1"]) / 2)


def test_probe_table_matches_per_item_scores(setup: dict) -> None:
    data, comp, suite = setup["test"], setup["comp"], setup["suite"]
    table = A.probe_table(suite, data, comp, chunk=7)
    images, negatives, cats = data.dataset.negative_items()
    assert table.rows[0]["n_items"] == len(cats)
    for row in table.rows:
        entry = suite.methods[row["name"]]
        lam = entry.lambda_local
        hits: dict[str, list[bool]] = {}
        local_hits = []
        for j, q, c in zip(images.tolist(), negatives.tolist(), cats, strict=True):
            pos = one_pair(data, entry, j, int(data.positives[j]))
            neg = one_pair(data, entry, j, q)
            sp = float(pos.global_score[0] + lam * pos.local_score[0])
            sn = float(neg.global_score[0] + lam * neg.local_score[0])
            hits.setdefault(c, []).append(sp > sn)
            local_hits.append(float(pos.local_score[0]) > float(neg.local_score[0]))
        for c, h in hits.items():
            assert row[c] == pytest.approx(sum(h) / len(h)), (row["name"], c)
        everything = [x for h in hits.values() for x in h]
        assert row["overall"] == pytest.approx(sum(everything) / len(everything))
        assert row["local_overall"] == pytest.approx(sum(local_hits) / len(local_hits))
        assert 0.0 <= row["compositional"] <= 1.0
    # Global-only has no local score: ties everywhere, so s_l alone wins nothing
    assert next(r for r in table.rows if r["name"] == "global_only")["local_overall"] == 0.0


def test_grounding_table_matches_per_phrase_heatmaps(setup: dict) -> None:
    data, suite = setup["test"], setup["suite"]
    table = A.grounding_table(suite, data, chunk=4)
    assert "global_only" not in {r["name"] for r in table.rows}
    q = A.phrase_queries(data)
    assert q.image.numel() == sum(len(s.phrases) for s in data.samples)  # all fit the context
    h, w = data.grid
    for row in [r for r in table.rows if not r.get("baseline")]:
        entry = suite.methods[row["name"]]
        hits, ious = [], []
        for p in range(q.image.numel()):
            j = int(q.image[p])
            a = one_pair(data, entry, j, int(data.positives[j]))
            sel = q.select[p : p + 1, : a.token_mask.shape[1]]
            heat = entry.method.phrase_patch_map(a, sel)[0]  # PowerCLIP: its node map
            # a tie for the peak broken at random: the share of the tied patches in the box
            heat32 = heat.float().clamp_min(0)
            tied = (heat32 == heat32.max()).reshape(h, w).nonzero()
            cx, cy = (tied[:, 1] + 0.5) * 80 / w, (tied[:, 0] + 0.5) * 80 / h
            x0, y0, x1, y1 = q.boxes[p].tolist()
            hits.append(float(((x0 <= cx) & (cx < x1) & (y0 <= cy) & (cy < y1)).double().mean()))
            hot = (heat >= 0.5 * heat.max()).reshape(h, w).nonzero()
            bx0, by0 = hot[:, 1].min() * 8, hot[:, 0].min() * 8
            bx1, by1 = (hot[:, 1].max() + 1) * 8, (hot[:, 0].max() + 1) * 8
            inter = max(0, min(x1, bx1) - max(x0, bx0)) * max(0, min(y1, by1) - max(y0, by0))
            union = (x1 - x0) * (y1 - y0) + (bx1 - bx0) * (by1 - by0) - inter
            ious.append(float(inter) / float(union))
        assert row["pointing"] == pytest.approx(np.mean(hits)), row["name"]
        shared = [h for h, s in zip(hits, q.shared_colour.tolist(), strict=True) if s]
        if shared:
            assert row["pointing_shared_colour"] == pytest.approx(np.mean(shared)), row["name"]
        assert row["mean_iou"] == pytest.approx(np.mean(ious), abs=1e-6), row["name"]
        assert row["hit@0.5"] == pytest.approx(np.mean(np.array(ious) >= 0.5)), row["name"]


def test_grounding_baseline_rows_match_a_pixel_count_reference(setup: dict) -> None:
    """The colour oracle's peak is the 8 x 8 cell with the most pixels of the phrase's palette
    colour; the shared-colour flags follow the scene's objects; the uniform map's pointing
    is the share of patch centres inside the box."""
    from otviz.world import COLOUR_RGB

    data, suite = setup["test"], setup["suite"]
    table = A.grounding_table(suite, data, chunk=4)
    rows = {r["name"]: r for r in table.rows}
    assert [r["name"] for r in table.rows][-3:] == ["colour_oracle", "centre_prior", "uniform"]
    q = A.phrase_queries(data)
    flags, oracle_hits, uniform = [], [], []
    for sample in data.samples:
        for phrase in sample.phrases:
            obj = sample.objects[phrase.object_index]
            flags.append(sum(o.colour == obj.colour for o in sample.objects) > 1)
            diff = np.abs(sample.image.astype(int) - np.array(COLOUR_RGB[obj.colour])).max(2)
            counts = (diff <= 32).reshape(10, 8, 10, 8).sum(axis=(1, 3))
            row, col = np.unravel_index(counts.argmax(), counts.shape)
            x0, y0, x1, y1 = phrase.box
            oracle_hits.append(x0 <= col * 8 + 4 < x1 and y0 <= row * 8 + 4 < y1)
            centres = np.arange(4, 80, 8)
            inside_x = ((x0 <= centres) & (centres < x1)).sum()
            inside_y = ((y0 <= centres) & (centres < y1)).sum()
            uniform.append(inside_x * inside_y / 100)
    assert q.shared_colour.tolist() == flags
    assert rows["colour_oracle"]["pointing"] == pytest.approx(np.mean(oracle_hits))
    assert rows["uniform"]["pointing"] == pytest.approx(np.mean(uniform))
    assert rows["uniform"]["n_shared_colour"] == sum(flags)


def test_anchor_and_cost_tables(setup: dict) -> None:
    data, suite = setup["test"], setup["suite"]
    anchors = A.anchor_table(suite)
    assert [r["name"] for r in anchors.rows] == ["conceptot"]
    p = torch.nn.functional.normalize(suite.methods["conceptot"].method.anchors.detach().double(),
                                      dim=-1)
    r = p.shape[0]
    pairs = [float(p[i] @ p[j]) for i in range(r) for j in range(r) if i != j]
    assert anchors.rows[0]["mean_offdiag"] == pytest.approx(sum(pairs) / len(pairs))
    assert anchors.rows[0]["max_offdiag"] == pytest.approx(max(pairs))
    retrieval = Table("retrieval", "", [], [{"name": n, "avg_r1": 0.5} for n in NAMES])
    cost = A.cost_table(suite, data, retrieval, n_pairs=4)
    assert [r["name"] for r in cost.rows] == list(NAMES)
    assert all(r["params"] == 0 for r in cost.rows)  # training-free: nothing trains
    assert all(r["ms_per_pair"] >= 0 and r["avg_r1"] == 0.5 for r in cost.rows)


def test_classification_tables_match_direct_predictions(setup: dict) -> None:
    backbone = setup["backbone"]
    sets = C.classification_sets(backbone, 12, seed=1)
    assert [s.label for s in sets] == ["shape", "colour", "colour_shape",
                                       "colour_shape (held-out)"]
    zs = C.zero_shot_table(backbone, sets=sets)
    eps = C.temperature(backbone)
    # every FGW rule in both scalings, each next to its unit-mass variant
    assert [c.key for c in zs.columns[2:]] == ["softmax", "fgw_isoftmax", "fgw_isoftmax_unit",
                                               "fgw_pgd", "fgw_pgd_unit"]
    for cs, row in zip(sets, zs.rows, strict=True):
        for rule in C.ZERO_SHOT_RULES:
            pred = zero_shot_predict(cs.image_emb, cs.class_emb, rule, eps=eps)
            assert row[rule] == accuracy(pred.labels, cs.labels)
        images, labels = cs.view.batch(range(12))
        emb = torch.cat([backbone.model.encode_image(backbone.image_tensor([im]))
                         for im in images]).detach()
        cls = C.pooled_text_embeddings(backbone, cs.view.prompts())
        cos = torch.nn.functional.normalize(emb, dim=-1) @ torch.nn.functional.normalize(
            cls, dim=-1).T
        assert row["softmax"] == pytest.approx(float((cos.argmax(1).numpy() == labels).mean()))
        assert row["classes"] == len(cs.view.classes)
    sel = C.selective_table(backbone, rate=0.5, sets=sets)
    assert all(0.0 <= r[k] <= 1.0 for r in sel.rows for k in ("confidence", "uot", "partial"))
    assert [r["all"] for r in sel.rows] == [r["softmax"] for r in zs.rows]
    lt = C.long_tailed_table(backbone, n_max=10, imbalance=10.0, tasks=("shape",))
    # 10 * 10 ** (-k / 7) rounded: 10, 7, 5, 4, 3, 2, 1, 1 images per class
    assert [(r["order"], r["images"]) for r in lt.rows] == [("LT", 33), ("U", 80), ("RLT", 33)]
    labels = {c.key: c.label for c in lt.columns}
    assert labels["lt_fgw"] == "LT fused Gromov OT (Eq. 14, alpha0 = 0.01)"
    assert labels["lt_sinkhorn"] == "LT Sinkhorn (alpha0 = 0)"
    view = ClassificationView("shape", split="test", seed=0)
    for row, order in zip(lt.rows, ORDERS, strict=True):
        images, truth = view.long_tailed(10, 10.0, order)
        image_emb = C.pooled_image_embeddings(backbone, list(images))
        class_emb = C.pooled_text_embeddings(backbone, view.prompts())
        counts = long_tailed_counts(len(view.classes), 10, 10.0, order)
        prior = torch.tensor(counts, dtype=torch.float32)
        # alpha0 = 0: plain entropic OT with the images' unit rows and the prior's columns
        cost = 1 - F.normalize(image_emb, dim=-1) @ F.normalize(class_emb, dim=-1).T
        b = len(truth) * prior / prior.sum()
        plain = sinkhorn_log(cost[None], torch.ones(1, len(truth)), b[None], eps, 1000,
                             tol=1e-4).plan[0].argmax(1)
        assert row["lt_sinkhorn"] == accuracy(plain, torch.from_numpy(truth))
        assert row["lt_sinkhorn_class"] == shot_split_accuracy(
            plain, torch.from_numpy(truth), counts)["mean_per_class"]
        fgw = long_tailed_predict(image_emb, class_emb, prior, eps=eps, alpha0=0.01).labels
        assert row["lt_fgw"] == accuracy(fgw, torch.from_numpy(truth))


def test_table_markdown_and_json() -> None:
    t = Table("x", "Title", [Column("method", "Method", "text"), Column("a", "A"),
                             Column("b", "B", "num"), Column("n", "N", "int")],
              [{"method": "m", "a": 0.1234, "b": 1.5, "n": 12345},
               {"method": "z", "a": math.nan, "b": None, "n": 0}], ["a note"])
    md = t.markdown()
    assert "| m | 12.3 | 1.500 | 12,345 |" in md and "| z | - | - | 0 |" in md
    assert md.startswith("**Title**") and "- a note" in md and "|---|---:|---:|---:|" in md
    assert t.to_dict()["rows"][0]["a"] == 0.1234


def test_runner_writes_json_and_markdown(tmp_path: Path, setup: dict) -> None:
    from otviz.eval.runner import read_tables, write_tables

    t = Table("x", "Title", [Column("method", "Method", "text"), Column("a", "A")],
              [{"method": "m", "a": 0.5}])
    json_path, md_path = write_tables([t], tmp_path, {"config": {"k": 1}})
    assert read_tables(json_path)["x"].rows == t.rows
    assert md_path.read_text() == t.markdown()
