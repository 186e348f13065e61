"""The patch-token tables of the comparison (ConceptOT Tables 1-3, Sec. 2.6, Fig. 4): one
function per table, each taking a :class:`~otviz.suite.MethodSuite` (trained heads or
training-free) and an :class:`~otviz.eval.world_set.EvalSet` (a world split encoded by the
suite's backbone) and returning a :class:`~otviz.eval.table.Table` with one row per method.

* :func:`retrieval_table`: R@1/5/10 both ways under the two-stage protocol of App. G.4
  (global top-k, then ``s_g + lambda * s_l``, lambda = the weight the method was trained
  with);
* :func:`probe_table`: accuracy of ``s_g + lambda * s_l`` per SugarCrepe category, overall,
  and overall on the held-out compositional split (plus the local score alone);
* :func:`grounding_table`: pointing game, mean IoU and hit@0.5 over every gold noun phrase,
  from ``Alignment.heatmap`` (Sec. 2.6);
* :func:`anchor_table`: mean off-diagonal cosine of the anchor banks (Fig. 4);
* :func:`cost_table`: solver cost per pair and trainable parameters (Table 2).

Scoring is batched: every pair a table needs goes through the method in chunks of
``chunk`` pairs, never one by one. ``progress(stage, done, total)`` reports each chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from otviz.eval.grounding_baselines import (
    COLOUR_TOLERANCE,
    centre_prior_heatmaps,
    colour_oracle_heatmaps,
    colour_shared,
)
from otviz.eval.grounding_metrics import (
    TOLERANCE_PX,
    empty_regions,
    grounding_scores,
    mean_offdiag_cosine,
    phrase_token_select,
    pointing_hits,
    pointing_note,
    tokens_in_boxes,
)
from otviz.eval.probe import probe_accuracy
from otviz.eval.retrieval import DIRECTIONS, two_stage_recall
from otviz.eval.table import Column, Table
from otviz.eval.world_set import EvalSet
from otviz.explainers import EXPLAINERS, explain_pairs, unavailable
from otviz.methods.base import Alignment
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import METHOD_LABELS, MethodSuite, SuiteMethod, flat_map_reasons
from otviz.world import NEGATIVE_CATEGORIES

StageProgress = Callable[[str, int, int], None]
CHUNK = 512


def _label(name: str) -> str:
    return METHOD_LABELS.get(name, name)


@torch.no_grad()
def align_pairs(
    entry: SuiteMethod,
    data: EvalSet,
    image_idx: Tensor,
    text_idx: Tensor,
    reduce: Callable[[Alignment, slice], Tensor],
    chunk: int = CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> Tensor:
    """``reduce(alignment, rows)`` of the pairs ``(image_idx[p], text_idx[p])``, in batched
    calls of ``chunk`` pairs, concatenated along the first axis (``rows`` is the chunk's
    slice of the inputs, for per-pair side inputs such as token selections)."""
    n = image_idx.numel()
    parts = []
    for s in range(0, n, chunk):
        rows = slice(s, min(s + chunk, n))
        batch = data.pairs(image_idx[rows], text_idx[rows], entry.space)
        parts.append(reduce(entry.method(batch), rows).detach().double().cpu())
        if progress is not None:
            progress(rows.stop, n)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def pair_scores(
    entry: SuiteMethod,
    data: EvalSet,
    image_idx: Tensor,
    text_idx: Tensor,
    chunk: int = CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Tensor, Tensor]:
    """``(s_g [P], s_l [P])`` (float64) of the pairs, batched."""
    both = align_pairs(
        entry, data, image_idx, text_idx,
        lambda a, rows: torch.stack([a.global_score, a.local_score], dim=1), chunk, progress,
    )
    return both[:, 0], both[:, 1]


def phrase_heatmaps(
    entry: SuiteMethod,
    data: EvalSet,
    image_idx: Tensor,
    text_idx: Tensor,
    select: Tensor,
    chunk: int = CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> Tensor:
    """``[P, N]`` (float64) phrase heatmaps of the pairs ``(image_idx[p], text_idx[p])``, each
    over the tokens ``select[p]`` (``[P, L]`` on the untrimmed token axis), batched:
    the method's ``phrase_patch_map``: ``Alignment.heatmap`` (ConceptOT Sec. 2.6) unless it
    defines its own (PowerCLIP: the membership-weighted regions of the phrase's node)."""

    def phrase_map(a: Alignment, rows: slice) -> Tensor:
        return entry.method.phrase_patch_map(a, select[rows, : a.token_mask.shape[1]])

    return align_pairs(entry, data, image_idx, text_idx, phrase_map, chunk, progress)


def _stage(progress: StageProgress | None, stage: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(stage, done, total)


# ----------------------------------------------------------------------- retrieval
RETRIEVAL_COLUMNS = [Column("method", "Method", "text")] + [
    Column(f"{d}_r{k}", f"{'I→T' if d == 'i2t' else 'T→I'} R@{k}")
    for d in DIRECTIONS for k in (1, 5, 10)
] + [Column("avg_r1", "Avg R@1")]


def retrieval_table(
    suite: MethodSuite,
    data: EvalSet,
    k: int = 16,
    chunk: int = CHUNK,
    progress: StageProgress | None = None,
    also_k: Sequence[int] = (),
) -> Table:
    """Image-text retrieval on ``data``'s true pairs, two-stage (ConceptOT Table 1, App.
    G.4): every method reranks the same global top-``k`` candidates of each query; for each
    of ``also_k`` (e.g. the paper's 128) the R@1 columns of another reranking depth."""
    img, txt = data.global_embeddings()
    global_scores = torch.nn.functional.normalize(img, dim=-1) @ torch.nn.functional.normalize(
        txt, dim=-1).T
    positives = data.positives
    extra = [kk for kk in dict.fromkeys(also_k) if kk != k]
    columns = RETRIEVAL_COLUMNS + [
        Column(f"{key}_top{kk}", f"{label} (top-{kk})") for kk in extra
        for key, label in (("i2t_r1", "I→T R@1"), ("t2i_r1", "T→I R@1"), ("avg_r1", "Avg R@1"))
    ]
    table = Table("retrieval", f"Retrieval on {data.n_images} world {data.split} pairs "
                  f"(two-stage: global top-{k}, then s_g + λ s_l)", columns)
    for name, entry in suite.methods.items():
        stage = _stage(progress, f"retrieval {name}")

        def local(image_idx: Tensor, text_idx: Tensor, entry: SuiteMethod = entry,
                  stage: Callable[[int, int], None] | None = stage) -> Tensor:
            return pair_scores(entry, data, image_idx, positives[text_idx], chunk,
                               stage)[1].float()

        recalls = two_stage_recall(global_scores, local, k, entry.lambda_local)
        row = {"method": _label(name), "name": name, **recalls,
               "avg_r1": (recalls["i2t_r1"] + recalls["t2i_r1"]) / 2,
               "lambda": entry.lambda_local}
        for kk in extra:
            more = two_stage_recall(global_scores, local, kk, entry.lambda_local)
            row.update({f"i2t_r1_top{kk}": more["i2t_r1"], f"t2i_r1_top{kk}": more["t2i_r1"],
                        f"avg_r1_top{kk}": (more["i2t_r1"] + more["t2i_r1"]) / 2})
        table.rows.append(row)
    table.notes.append(f"candidates per query: {k}" + "".join(f", {kk} (top-{kk} columns)"
                                                              for kk in extra) +
                       "; λ per method: the weight of its local term in training "
                       "(ConceptOT λ_l = 0.5, PowerCLIP λ = 0.2)")
    return table


# ----------------------------------------------------------------------- probe
def probe_scores(
    entry: SuiteMethod, data: EvalSet, chunk: int = CHUNK, progress: StageProgress | None = None
) -> tuple[Tensor, Tensor, list[str]]:
    """``(positive [n_items, 2], negative [n_items, 2], categories)``: ``(s_g, s_l)`` of
    each probe item's true caption and its hard negative, on the same image."""
    images, negatives, categories = data.dataset.negative_items()
    pos_idx = data.positives
    texts = torch.cat([pos_idx, negatives])
    imgs = torch.cat([torch.arange(data.n_images), images])
    g, s = pair_scores(entry, data, imgs, texts, chunk, _stage(progress, "probe"))
    both = torch.stack([g, s], dim=1)
    pos, neg = both[: data.n_images], both[data.n_images :]
    return pos[images], neg, categories


def _probe_accuracies(
    entry: SuiteMethod, data: EvalSet, chunk: int, progress: StageProgress | None
) -> tuple[dict[str, float], dict[str, float]]:
    """Probe accuracy of ``s_g + lambda s_l`` and of ``s_l`` alone."""
    pos, neg, cats = probe_scores(entry, data, chunk, progress)
    lam = entry.lambda_local
    combined = probe_accuracy(pos[:, 0] + lam * pos[:, 1], neg[:, 0] + lam * neg[:, 1], cats)
    return combined, probe_accuracy(pos[:, 1], neg[:, 1], cats)


def probe_table(
    suite: MethodSuite,
    data: EvalSet,
    compositional: EvalSet | None = None,
    chunk: int = CHUNK,
    progress: StageProgress | None = None,
) -> Table:
    """Compositional probe (ConceptOT Table 3): accuracy of ``s_g + lambda s_l`` (true
    caption strictly above its hard negative) per category and overall on ``data``, the
    overall on the held-out ``compositional`` split, and the overall of ``s_l`` alone."""
    columns = [Column("method", "Method", "text")]
    columns += [Column(c, c) for c in NEGATIVE_CATEGORIES] + [Column("overall", "Overall")]
    if compositional is not None:
        columns.append(Column("compositional", "Held-out pairs"))
    columns.append(Column("local_overall", "Overall (s_l alone)"))
    n_items = len(data.dataset.negative_items()[2])
    table = Table("probe", f"Compositional probe on {data.n_images} world {data.split} images "
                  f"({n_items} items)", columns)
    for name, entry in suite.methods.items():
        combined, local = _probe_accuracies(entry, data, chunk, progress)
        row = {"method": _label(name), "name": name, **combined,
               "local_overall": local["overall"], "n_items": n_items}
        if compositional is not None:
            row["compositional"] = _probe_accuracies(entry, compositional, chunk,
                                                     progress)[0]["overall"]
        table.rows.append(row)
    table.notes.append("a tie counts as a failure, so a method whose local score cannot tell "
                       "the captions apart scores its s_g accuracy (Global-only row)")
    if compositional is not None:
        table.notes.append(f"held-out pairs: {compositional.n_images} images of the "
                           "compositional split (colour-shape pairs never seen in training)")
    return table


# ----------------------------------------------------------------------- grounding


@dataclass
class PhraseQueries:
    """Every gold noun phrase of a set's true captions that keeps a token in the context:
    its image ``[P]``, token selection ``[P, L]``, enclosing gold pixel box ``[P, 4]``,
    text, its object's colour, whether another object of the scene shares that colour
    ``[P]``, its caption word span ``[P, 2]`` (``start, end``), every gold box ``[P, K,
    4]`` and every gold box grown by :data:`TOLERANCE_PX` source pixels on each side
    ``[P, K, 4]`` (phrases with fewer than ``K`` boxes padded with NaN boxes, which hold
    no point)."""

    image: Tensor
    select: Tensor
    boxes: Tensor
    texts: list[str]
    colours: list[str]
    shared_colour: Tensor
    spans: Tensor
    gold: Tensor
    near: Tensor


def _padded(boxes: list[list[tuple[float, ...]]]) -> Tensor:
    k = max(len(b) for b in boxes)
    out = torch.full((len(boxes), k, 4), float("nan"), dtype=torch.float64)
    for i, b in enumerate(boxes):
        out[i, : len(b)] = torch.tensor(b, dtype=torch.float64)
    return out


def phrase_queries(data: EvalSet, tolerance: float = TOLERANCE_PX) -> PhraseQueries:
    """The :class:`PhraseQueries` of ``data``, in image order and caption order."""
    images, spans, boxes, texts, colours, shared, gold, near = [], [], [], [], [], [], [], []
    for j, sample in enumerate(data.samples):
        tx, ty = tolerance * sample.pixel_scale[0], tolerance * sample.pixel_scale[1]
        for phrase in sample.phrases:
            images.append(j)
            spans.append((phrase.start, phrase.end))
            boxes.append(phrase.box)
            texts.append(phrase.text)
            colours.append(sample.objects[phrase.object_index].colour)
            shared.append(colour_shared(sample, phrase.object_index))
            gold.append(phrase.gold_boxes)
            near.append([(x0 - tx, y0 - ty, x1 + tx, y1 + ty)
                         for x0, y0, x1, y1 in phrase.gold_boxes])
    image_idx = torch.tensor(images, dtype=torch.long)
    token_word, mask = data.text_tokens(data.positives[image_idx])
    span_idx = torch.tensor(spans, dtype=torch.long)
    select = phrase_token_select(token_word, mask, span_idx)
    kept = select.any(1)
    keep = kept.tolist()
    return PhraseQueries(image_idx[kept], select[kept],
                         torch.tensor(boxes, dtype=torch.float64)[kept],
                         [t for t, k in zip(texts, keep, strict=True) if k],
                         [c for c, k in zip(colours, keep, strict=True) if k],
                         torch.tensor(shared, dtype=torch.bool)[kept], span_idx[kept],
                         _padded(gold)[kept], _padded(near)[kept])


GROUNDING_COLUMNS = [
    Column("method", "Method", "text"), Column("pointing", "Pointing game"),
    Column("pointing_tol", f"Pointing, {TOLERANCE_PX:g} px tolerance"),
    Column("pointing_shared_colour", "Pointing, colour not unique"),
    Column("mean_iou", "Mean IoU"), Column("hit@0.5", "Hit@0.5"),
]
#: The columns of a real data set's table (no colours; the tolerant pointing game).
DATASET_GROUNDING_COLUMNS = [
    Column("method", "Method", "text"), Column("pointing", "Pointing game"),
    Column("pointing_tol", f"Pointing, {TOLERANCE_PX:g} px tolerance"),
    Column("mean_iou", "Mean IoU"), Column("hit@0.5", "Box acc. (IoU ≥ 0.5)"),
]


def _grounding_row(
    label: str, name: str, heat: Tensor, q: PhraseQueries, geometry: TokenGeometry,
    threshold: float, phrase_hits: dict[str, dict] | None = None,
) -> dict:
    """Scores of one row: :func:`grounding_scores` of ``heat`` against the enclosing gold
    box (mean IoU, hit@0.5), the pointing game on any gold box (expected hits under the tie
    rule, :func:`~otviz.eval.grounding_metrics.pointing_hits`), also with the tolerance and
    on the shared-colour subset; each phrase's hits go to ``phrase_hits[name]`` when
    given."""
    scores = grounding_scores(heat, geometry, q.boxes, threshold)
    hits = pointing_hits(heat, geometry, q.gold)
    hits_near = pointing_hits(heat, geometry, q.near)
    scores["pointing"] = float(hits.mean())
    subset = hits[q.shared_colour]
    shared = float(subset.mean()) if subset.numel() else float("nan")
    if phrase_hits is not None:
        phrase_hits[name] = {"hit": hits.tolist(), "hit_tol": hits_near.tolist()}
    return {"method": label, "name": name, **scores, "pointing_tol": float(hits_near.mean()),
            "pointing_shared_colour": shared, "n_shared_colour": int(subset.numel())}


def baseline_maps(data: EvalSet, q: PhraseQueries, seed: int | None = None
                  ) -> list[tuple[str, str, Tensor]]:
    """``(label, name, [P, N] maps)`` of the model-free baselines
    (:mod:`otviz.eval.grounding_baselines`): on the world, the colour-only pixel oracle;
    then the centre prior and the uniform map; with ``seed``, a random map (uniform noise
    drawn from ``seed``: its peak is a token drawn at random)."""
    geometry, n = data.geometry, q.image.numel()
    rows = []
    if data.is_world:
        oracle = colour_oracle_heatmaps([data.samples[int(j)].image for j in q.image],
                                        q.colours, geometry)
        rows.append(("Colour oracle (pixels)", "colour_oracle", oracle))
    flat = torch.ones(n, geometry.n, dtype=torch.float64)
    rows += [("Centre prior", "centre_prior", centre_prior_heatmaps(n, geometry)),
             ("Uniform map", "uniform", flat)]
    if seed is not None:
        noise = torch.rand(n, geometry.n, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(seed))
        rows.append((f"Random map (seed {seed})", "random", noise))
    return rows


def baseline_rows(data: EvalSet, q: PhraseQueries, threshold: float = 0.5,
                  seed: int | None = None, phrase_hits: dict[str, dict] | None = None
                  ) -> list[dict]:
    """Grounding rows of the model-free baselines (:func:`baseline_maps`)."""
    return [{**_grounding_row(label, name, heat, q, data.geometry, threshold, phrase_hits),
             "baseline": True}
            for label, name, heat in baseline_maps(data, q, seed)]


def explainer_rows(
    data: EvalSet, q: PhraseQueries, names: Sequence[str], threshold: float = 0.5,
    progress: StageProgress | None = None, phrase_hits: dict[str, dict] | None = None,
) -> list[dict]:
    """Grounding rows of the explainers ``names`` (:mod:`otviz.explainers`): each phrase's map
    from its image and its text alone (encoded by the backbone's text tower), scored like the
    methods' heatmaps, with the explainer's wall time per phrase. An explainer that cannot
    read the backbone's tower gets a row of its "not available" note and no scores."""
    images = [data.samples[int(j)].image for j in q.image]
    rows = []
    for name in names:
        note = unavailable(data.backbone, name)
        if note is not None:
            rows.append({"method": note, "name": name, "explainer": True})
            continue
        run = explain_pairs(data.backbone, name, images, q.texts)
        rows.append({**_grounding_row(EXPLAINERS[name].label, name, run.maps, q,
                                      data.geometry, threshold, phrase_hits=phrase_hits),
                     "explainer": True, "ms_per_phrase": run.ms / max(1, len(q.texts))})
        if progress is not None:
            progress(f"grounding {name}", len(q.texts), len(q.texts))
    return rows


def grounding_table(
    suite: MethodSuite,
    data: EvalSet,
    threshold: float = 0.5,
    chunk: int = CHUNK,
    progress: StageProgress | None = None,
    baselines: bool = True,
    explainers: Sequence[str] = (),
    seed: int | None = None,
    phrase_hits: dict[str, dict] | None = None,
) -> Table:
    """Weak phrase grounding (ConceptOT Sec. 2.6) over every gold noun phrase: pointing
    game, mean IoU and hit@0.5 of the heatmap ``Alignment.heatmap`` of the phrase's tokens,
    or the method's own ``phrase_patch_map`` where it defines one (PowerCLIP: the membership-
    weighted regions of the phrase's node) (box: patches above ``threshold`` x peak,
    enclosing envelope). On the world, the pointing on the phrases whose colour another
    object of the scene shares; on a real set (:class:`~otviz.eval.world_set.GroundingProbeDataset`)
    the pointing with :data:`TOLERANCE_PX` instead. The rows of the ``explainers``
    (:func:`explainer_rows`) follow the methods'; with ``baselines``, the model-free rows
    (:func:`baseline_rows`, a random map with ``seed``) come last. ``phrase_hits``, when
    given, receives each row's per-phrase hits by row name."""
    q = phrase_queries(data)
    image_idx, select = q.image, q.select
    world = data.is_world
    what = "world" if world else data.source_name
    table = Table("grounding", f"Weak grounding of {image_idx.numel()} gold noun phrases "
                  f"({data.n_images} {what} {data.split} {'images' if world else 'captions'})",
                  list(GROUNDING_COLUMNS if world else DATASET_GROUNDING_COLUMNS))
    for name, entry in suite.methods.items():
        if not entry.method.has_plan:
            continue  # no patch-token plan (Global-only)
        heat = phrase_heatmaps(entry, data, image_idx, data.positives[image_idx], select,
                               chunk, _stage(progress, f"grounding {name}"))
        table.rows.append(_grounding_row(_label(name), name, heat, q, data.geometry,
                                         threshold, phrase_hits=phrase_hits))
    table.rows += explainer_rows(data, q, explainers, threshold, progress, phrase_hits)
    if baselines:
        table.rows += baseline_rows(data, q, threshold, seed, phrase_hits)
    if explainers:
        table.notes.append("explainers (Grad-CAM, LeGrad, MaskCLIP, Chefer relevance): the "
                           "phrase's map from the image and the phrase's text embedding alone "
                           "(docs/explainers.md)")
    table.notes.append(f"heatmap box: the cells of the tokens at >= {threshold} of the peak, "
                       "enclosing envelope; the peak is where its token looks (the tower's "
                       "token geometry)")
    table.notes.append(pointing_note(int(empty_regions(tokens_in_boxes(data.geometry,
                                                                       q.gold)).sum())))
    table.notes += [f"{_label(n)}: {why}" for n, why in flat_map_reasons().items()
                    if n in suite.methods]
    if world:
        table.notes.append(f"colour not unique: the {int(q.shared_colour.sum())} phrases whose "
                           "object shares its colour with another object of the scene")
    else:
        table.notes.append(
            "pointing game: where the hottest token looks inside any gold box of the phrase; "
            f"{TOLERANCE_PX:g} px tolerance: inside a gold box grown by {TOLERANCE_PX:g} "
            "source-image pixels on every side; box accuracy: IoU >= 0.5 between the heatmap "
            "box and the enclosing box of the phrase's gold boxes; each image resized to the "
            "model's input without cropping")
    if baselines:
        table.notes.append(
            ("baselines: colour oracle = share of a patch's pixels within "
             f"{COLOUR_TOLERANCE} (per channel) of the phrase's palette colour; " if world
             else "baselines: ") +
            "centre prior = Gaussian on the image centre; uniform map = a flat map (its "
            "pointing: the chance that a uniformly drawn token lies in a gold box)"
            + ("; random map = uniform noise, its peak a random patch"
               if seed is not None else ""))
    return table


# ----------------------------------------------------------------------- anchors
def anchor_table(suite: MethodSuite) -> Table:
    """Anchor banks (ConceptOT Fig. 4): rank, concept width, mean and largest off-diagonal
    cosine of every method with anchors (ConceptOT reports 0.19 for its 32 anchors)."""
    columns = [Column("method", "Method", "text"), Column("r", "r", "int"),
               Column("dim", "d_c", "int"), Column("mean_offdiag", "Mean off-diag cos", "num"),
               Column("max_offdiag", "Max off-diag cos", "num")]
    table = Table("anchors", "Concept anchors", columns)
    for name, entry in suite.methods.items():
        unit = getattr(entry.method, "unit_anchors", None)
        if unit is None:
            continue
        anchors = unit().detach().double()
        gram = anchors @ anchors.T
        off = gram[~torch.eye(gram.shape[0], dtype=torch.bool)]
        table.rows.append({"method": _label(name), "name": name, "r": anchors.shape[0],
                           "dim": anchors.shape[1], "mean_offdiag": mean_offdiag_cosine(anchors),
                           "max_offdiag": float(off.max())})
    return table


# ----------------------------------------------------------------------- cost
def trainable_parameters(entry: SuiteMethod) -> int:
    """Parameters of the method that training updates (0 for a training-free method)."""
    return sum(p.numel() for p in entry.method.parameters() if p.requires_grad)


@torch.no_grad()
def ms_per_pair(entry: SuiteMethod, data: EvalSet, n_pairs: int = 256, repeats: int = 3) -> float:
    """Median wall time per pair (ms) of one batched call on ``n_pairs`` true pairs (after a
    warm-up call), at the current torch thread count."""
    idx = torch.arange(min(n_pairs, data.n_images))
    batch = data.pairs(idx, data.positives[idx], entry.space)
    entry.method(batch)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        entry.method(batch)
        times.append(time.perf_counter() - t0)
    return 1000.0 * sorted(times)[len(times) // 2] / idx.numel()


def cost_table(
    suite: MethodSuite, data: EvalSet, retrieval: Table | None = None, n_pairs: int = 256
) -> Table:
    """Cost per method (ConceptOT Table 2): Avg R@1 (from ``retrieval``), solver time per
    pair of a batched call and trainable parameters."""
    columns = [Column("method", "Method", "text")]
    if retrieval is not None:
        columns.append(Column("avg_r1", "Avg R@1"))
    columns += [Column("ms_per_pair", "ms/pair", "ms"), Column("params", "Params", "int")]
    avg = {} if retrieval is None else {r["name"]: r["avg_r1"] for r in retrieval.rows}
    table = Table("cost", f"Cost per pair (batch of {min(n_pairs, data.n_images)} pairs, "
                  f"{torch.get_num_threads()} CPU thread(s)) and trainable parameters", columns)
    for name, entry in suite.methods.items():
        table.rows.append({"method": _label(name), "name": name, "avg_r1": avg.get(name),
                           "ms_per_pair": ms_per_pair(entry, data, n_pairs),
                           "params": trainable_parameters(entry)})
    table.notes.append("ms/pair: the method's whole forward (projections, solver, score) on "
                       "cached backbone features; the backbone itself is not counted")
    return table
