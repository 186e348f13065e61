"""``otviz eval --dataset voc:DIR`` (and ``voc20:``, ``context60:``, ``context59:``,
``ade20k:``, ``cityscapes:``, ``coco-stuff:``, ``coco-object:``): the segmentation table
(:mod:`otviz.eval.segmentation`) on a segmentation set in its published layout
(:mod:`otviz.data.segmentation_sets`).

Every image is read with captions listing the candidate classes' names (SCLIP's names,
``"aeroplane, bicycle, bird, ship, ..."``), as many captions as the text tower's context
needs (:func:`class_chunks`: one for VOC on a 77-token CLIP), so an alignment method's plan
between the image's patches and a caption's tokens gives each of its classes a mass per
patch: the class's phrase map, read as a segmentation like every other row. An explainer
reads each class from a text embedding (``--templates``, :mod:`otviz.text.templates`):
``single``, the prompt ``"a photo of a {name}."`` (CLIP's template); ``imagenet80``, the
class's ensemble of CLIP's 80 ImageNet templates (each filled template's unit embedding,
averaged, normalised: SCLIP's ``clip_segmentor.py`` lines 37-42), its 80 encodes per class
made once per run. A method's plan is between the patches and a caption's tokens, not a
class embedding: under ``single`` it reads the captions listing the bare names; under an
ensemble, per template, captions listing the names filled into it (``"a bad photo of a
aeroplane., a bad photo of a bicycle., ..."``, each name's words the class's phrase, cut to
the context like the bare names), and a class's map is the mean over the templates of its
phrase maps (:func:`template_mean`): as many plans per image as the templates' captions
(VOC on a 77-token CLIP: about 3 a template, 240 for the 80, against 1). The image
is resized to the model's input without cropping (or read in sliding windows,
:mod:`otviz.eval.sliding_window`, with ``--slide``), its maps drawn back
onto the mask's own pixels, so every labelled pixel of the set is scored at its original
resolution, as mmsegmentation scores it.

Images are scored in shards of ``--shard`` images (features through the feature cache),
each shard's counts written to ``out/shards/segmentation-<key>.json`` before the next starts
(a stopped run started again with the same arguments reads them and goes on); the counts
are summed over the shards (IoU is a ratio of sums, so this is the whole set's). Under
``torchrun --nproc-per-node N -m otviz eval --dataset ...`` shard ``k`` goes to rank
``k % N``, each on its own device, and every process reads the counts back from the shard
files; rank 0 writes the outputs. An image that does not decode is left out and named in the
stamp.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from otviz.backbone import Backbone
from otviz.checkpoints.identity import backbone_fingerprint
from otviz.data.feature_cache import FeatureCache
from otviz.data.grounding_sets import GroundingSet
from otviz.data.segmentation_sets import (
    SEGMENTATION_KINDS,
    SegmentationSet,
    load_segmentation_set,
)
from otviz.errors import InputError
from otviz.eval.alignment_tables import PhraseQueries, phrase_queries
from otviz.eval.config import EvalConfig
from otviz.eval.dataset_models import (
    dataset_backbone,
    dataset_suite,
    decodable_items,
    one_space,
    package_versions,
    to_device,
)
from otviz.eval.runner import _atomic_write, write_tables
from otviz.eval.segmentation import (
    RowCounts,
    RowMaps,
    ScoredImage,
    candidate_rows,
    method_token_maps,
    other_token_maps,
    prompts_reading,
    reading,
    row_token_maps,
    rule_note,
    scored_rows,
    segmentation_columns,
    segmented,
    template_embeddings,
)
from otviz.eval.segmentation_metrics import THRESHOLD, SegmentationCounts
from otviz.eval.sliding_window import (
    SlideWindow,
    Windows,
    image_windows,
    pasted_maps,
    windowed,
)
from otviz.eval.table import Table
from otviz.eval.world_set import EvalSet, GroundingProbeDataset, model_input_size
from otviz.explainers import explainer_names
from otviz.knobs import CLASS_SET_SOURCE
from otviz.process_group import barrier, gathered, setup, teardown
from otviz.suite import MethodSuite
from otviz.text.templates import SINGLE_TEMPLATE, TEMPLATE_SETS
from otviz.text.words import split_words
from otviz.towers.resclip_sfr import ClassSet

StageProgress = Callable[[str, int, int], None]
#: The prompt an explainer encodes for a class under ``--templates single``.
PROMPT = SINGLE_TEMPLATE


def segmentation_spec(spec: str) -> tuple[str, str] | None:
    """``(kind, path)`` when ``spec`` names a segmentation set (``voc:PATH``, ``voc20:``,
    ``context60:``, ``context59:``, ``ade20k:``, ``cityscapes:``, ``coco-stuff:``,
    ``coco-object:``), else
    ``None``; :class:`InputError` for such a kind without a path."""
    kind, _, path = spec.partition(":")
    if kind not in SEGMENTATION_KINDS:
        return None
    if not path:
        raise InputError(f"--dataset {kind}: takes a folder, {kind}:PATH")
    return kind, path


def run_segmentation_eval(config: EvalConfig, progress: StageProgress | None = None
                          ) -> tuple[list[Table], dict[str, Any]]:
    """The segmentation table of ``config.dataset`` (module docstring) and its stamp;
    written to ``config.out`` (``segmentation.json``, ``segmentation.md``) unless empty."""
    spec = segmentation_spec(config.dataset)
    if spec is None:
        raise InputError(f"--dataset {config.dataset.partition(':')[0]}: not a segmentation "
                         f"set ({', '.join(SEGMENTATION_KINDS)})")
    kind, path = spec
    names = [n.strip() for n in config.tables.split(",")] if config.tables != "all" else []
    if any(n != "segmentation" for n in names):
        raise InputError(f"--dataset {kind}: makes the segmentation table only "
                         "(--tables segmentation)")
    data = load_segmentation_set(kind, path, config.split, config.limit)
    slide = SlideWindow.parse(config.slide)
    info = setup(config.device or "auto")
    if info.distributed and not config.out:
        teardown(info)
        raise InputError(f"--dataset {kind}: under torchrun needs --out (the processes "
                         "gather the counts from the shard files written there)")
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, config.threads))
    try:
        resclip = config.features == CLASS_SET_SOURCE
        backbone = dataset_backbone(replace(config, features="resclip-rcs") if resclip
                                    else config)
        if resclip:
            backbone = class_set_reading(backbone, data.names, config.templates,
                                         data.background)
        chunks = class_chunks(backbone, data.names)
        single = config.templates == "single"
        grounding = data.as_grounding(PROMPT if single else "{}", chunks)
        suite, suite_note = dataset_suite(backbone, config, grounding)
        to_device(backbone, str(info.device) if info.distributed else config.device)
        backbone = one_space(backbone, suite)
        frame = model_input_size(backbone)
        kept, unreadable = decodable_items(data)
        shards = [kept[s : s + config.shard] for s in range(0, len(kept), config.shard)]
        templates = () if single else TEMPLATE_SETS[config.templates]
        text = (template_embeddings(backbone, data.names, templates)
                if templates and config.explainers else None)
        templated = [(data.as_grounding("{}", own, template=t), len(own)) for t, own in (
            (t, class_chunks(backbone, [t.format(n) for n in data.names])) for t in templates)]
        job = _Job(data, grounding, chunks, slide, suite, backbone, frame, config, progress
                   if info.is_main else None, text, templated)
        identity = {"backbone": backbone_fingerprint(backbone), "suite": suite.label,
                    "methods": list(suite.methods), "explainers": config.explainers,
                    "seed": config.seed, "frame": list(frame), "slide": config.slide,
                    "chunks": chunks, "templates": config.templates, "counts": 2}
        if len({json.dumps(i, sort_keys=True, default=str)
                for i in gathered(identity, info)}) > 1:
            raise InputError("the processes of this torchrun job do not load the same model "
                             "(random weights: no --pretrained?); each would score the shards "
                             "with its own")
        for k in range(info.rank, len(shards), info.world_size):
            _kept_counts(job, k, shards[k], _shard_file(data, shards[k], identity, config.out))
            if progress is not None and info.is_main:
                progress("shards", k + 1, len(shards))
        barrier(info)  # every shard is on disk once all processes are here
        results = [job.done.get(k) or _read(_shard_file(data, part, identity, config.out))
                   for k, part in enumerate(shards)]
    finally:
        teardown(info)
        torch.set_num_threads(threads)
    if not results:
        raise InputError(f"{kind}: no image of split {data.source['split']} decodes")
    missing = [k for k, r in enumerate(results) if r is None]
    if missing:
        raise RuntimeError(f"shards {missing} were not written by the processes of this job")
    total = list(results[0]["rows"])
    for other in results[1:]:
        total = [_summed(a, b) for a, b in zip(total, other["rows"], strict=True)]
    cut = sorted({c for r in results for c in r["cut"]})
    per = len(chunks)
    table = _table(data, total, len(kept), reading(backbone), slide, config.templates)
    if per > 1:
        table.notes.append(f"the {len(data.names)} class names in {per} captions per image "
                           "(each within the text tower's context): a method's plan shares an "
                           "image's mass among one caption's classes")
    if cut:
        table.notes.append("classes the text tower's context cut from the caption (no map: "
                           f"never predicted by a method): {', '.join(cut)}")
    if backbone.classes is not None:
        table.notes.append(
            "features resclip: ResCLIP's RCS with its semantic feedback refinement against "
            + ("background and " if data.background else "") + f"the {len(data.names)} class "
            f"names ({prompts_reading(config.templates)}; class set "
            f"{backbone.classes.digest[:12]}; no PAMR); the explainers run the model as under "
            "every source")
    table.notes.append(f"methods: {suite.label}; {suite_note}")
    stamp = {"model": backbone.name, "pretrained": backbone.info.get("pretrained"),
             "backbone_weights": backbone_fingerprint(backbone)["weights"],
             "versions": package_versions(), "frame": list(frame),
             "dataset": {**data.source, "digest": data.digest(), "path": Path(path).name},
             "skipped": data.skipped.as_dict(), "undecodable": unreadable,
             "seed": config.seed, "shards": len(shards), "processes": info.world_size,
             "config": asdict(config)}
    if config.out and info.is_main:
        write_tables([table], config.out, {"stamp": stamp}, stem="segmentation")
    return [table], stamp


@dataclass
class _Job:
    """What every shard of a run reads, and the shards this process computed (by index)."""

    data: SegmentationSet
    grounding: GroundingSet
    chunks: list[tuple[int, int]]
    slide: SlideWindow | None
    suite: MethodSuite
    backbone: Backbone
    frame: tuple[int, int]
    config: EvalConfig
    progress: StageProgress | None
    text: Tensor | None = None  # the classes' [C, E] ensembled embeddings (explainers)
    #: per template of an ensemble: the grounding set of its filled names, captions an image
    templated: list[tuple[GroundingSet, int]] = field(default_factory=list)
    done: dict[int, dict[str, Any]] = field(default_factory=dict)


WindowRows = list[list[list[int]]]


def _queries(job: _Job, part: list[int], own: list[Windows], grounding: GroundingSet,
             per: int) -> tuple[EvalSet, PhraseQueries, WindowRows]:
    """The images ``part`` of ``grounding`` (``per`` captions an image) read in their
    windows ``own``: the set, its phrase queries and, per image and window, the query row
    of each class (-1: cut by the context)."""
    probe = GroundingProbeDataset(windowed(
        [grounding.items[i * per + c] for i in part for c in range(per)], own,
        {**grounding.source, "slide": job.config.slide, "items": part}, grounding), job.frame)
    evalset = EvalSet(probe, job.backbone, FeatureCache(job.config.cache_dir))
    q = phrase_queries(evalset)
    rows = iter(candidate_rows(evalset, q))  # per item (image, window, chunk)
    return evalset, q, [[sum((next(rows) for _ in range(per)), []) for _ in win.boxes]
                        for win in own]


def template_mean(maps: Sequence[tuple[Tensor, WindowRows]], target: WindowRows, n: int
                  ) -> Tensor:
    """``[n, N]``: at each row ``target[j][w][c]`` the mean of the template maps
    ``maps[t][0][maps[t][1][j][w][c]]`` of class ``c`` in window ``w`` of image ``j`` over the
    templates that kept the class (an all-zero map where none did)."""
    total = torch.zeros(n, maps[0][0].shape[1], dtype=torch.float64)
    count = torch.zeros(n, dtype=torch.float64)
    for template_maps, rows in maps:
        pairs = [(r, s) for tj, sj in zip(target, rows, strict=True)
                 for tw, sw in zip(tj, sj, strict=True)
                 for r, s in zip(tw, sw, strict=True) if r >= 0 and s >= 0]
        if pairs:
            at, src = (torch.tensor(x) for x in zip(*pairs, strict=True))
            total.index_add_(0, at, template_maps[src].double())
            count.index_add_(0, at, torch.ones(len(pairs), dtype=torch.float64))
    return total / count.clamp_min(1)[:, None]


def _templated_method_maps(job: _Job, part: list[int], own: list[Windows], target: WindowRows,
                           n: int) -> list[RowMaps]:
    """The methods' rows under a template ensemble: per template, each method's class maps
    on the captions of its filled names, then their mean (:func:`template_mean`) on the
    rows ``target`` of the bare names' queries."""
    per_method: dict[str, tuple[str, dict[str, bool], list[tuple[Tensor, WindowRows]]]] = {}
    for grounding, per in job.templated:
        evalset, q, rows = _queries(job, part, own, grounding, per)
        for label, name, flags, maps in method_token_maps(job.suite, evalset, q,
                                                          job.config.chunk, job.progress):
            per_method.setdefault(name, (label, flags, []))[2].append((maps, rows))
    return [(label, name, flags, template_mean(maps, target, n))
            for name, (label, flags, maps) in per_method.items()]


def _shard_counts(job: _Job, k: int, part: list[int]) -> dict[str, Any]:
    """Shard ``k`` (images ``part``): every row's counts and the classes the context cut."""
    data, config = job.data, job.config
    own = [image_windows(data.items[i].size, job.slide) for i in part]
    evalset, q, per_window = _queries(job, part, own, job.grounding, len(job.chunks))
    images = [ScoredImage(ws[0], data.load_labels(i), data.local_classes())
              for ws, i in zip(per_window, part, strict=True)]
    cut = sorted({data.names[c] for ws in per_window for w in ws for c, r in enumerate(w)
                  if r < 0})
    text = None
    if job.text is not None:  # each phrase query's class: its index in its window's rows
        of_row = torch.empty(q.image.numel(), dtype=torch.long)
        for c, r in ((c, r) for ws in per_window for w in ws for c, r in enumerate(w) if r >= 0):
            of_row[r] = c
        text = job.text[of_row]
    explainers = explainer_names(config.explainers)
    if job.templated:
        maps = (_templated_method_maps(job, part, own, per_window, q.image.numel())
                + other_token_maps(evalset, q, explainers, config.seed + k, text))
    else:
        maps = row_token_maps(job.suite, evalset, q, explainers, config.chunk, job.progress,
                              config.seed + k, text)
    draw = partial(pasted_maps, geometry=evalset.geometry, windows=own, rows=per_window,
                   labels_size=[im.gold.shape for im in images])
    return {"rows": segmented(maps, images, draw, len(data.classes), THRESHOLD,
                              data.background), "cut": cut}


def _shard_file(data: SegmentationSet, part: list[int], identity: dict[str, Any], out: str
                ) -> Path | None:
    """Where a shard's counts are kept: ``out/shards/<key>.json``, the key a digest of what
    they depend on (model, methods, seed, frame, window, class captions, the images)."""
    if not out:
        return None
    key = hashlib.sha256(json.dumps({**identity, "data": data.subset(part).digest()},
                                    sort_keys=True, default=str).encode()).hexdigest()[:24]
    return Path(out) / "shards" / f"segmentation-{key}.json"


def _kept_counts(job: _Job, k: int, part: list[int], done: Path | None) -> None:
    """Shard ``k``'s counts into ``job.done``: read back when an earlier run wrote them,
    else computed and written to ``done`` (when given)."""
    stored = _read(done)
    if stored is None:
        stored = _shard_counts(job, k, part)
        if done is not None:
            done.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(done, json.dumps({"cut": stored["cut"], "rows": [
                [label, name, flags, c if isinstance(c, str) else c.as_dict()]
                for label, name, flags, c in stored["rows"]]}))
    job.done[k] = stored


def _read(done: Path | None) -> dict[str, Any] | None:
    """A shard's counts as a run wrote them (:func:`_kept_counts`), or ``None``."""
    if done is None or not done.is_file():
        return None
    record = json.loads(done.read_text(encoding="utf-8"))
    return {"cut": record["cut"], "rows": [
        (label, name, flags, c if isinstance(c, str) else SegmentationCounts.from_dict(c))
        for label, name, flags, c in record["rows"]]}


def class_set_reading(backbone: Backbone, names: Sequence[str], templates: str,
                      background: bool) -> Backbone:
    """``backbone`` (read at ``resclip-rcs``) read at ``resclip`` with the class set of
    ``names``, led by the class ``"background"`` on a set that scores one (``background``),
    each embedded as the table's explainers read a class (``templates``: ``single``,
    :data:`PROMPT`; an ensemble, :func:`~otviz.eval.segmentation.template_embeddings`), at
    the same input size: ResCLIP's semantic feedback refinement against the set's classes
    (:mod:`otviz.towers.resclip_sfr`). SFR gives its pixels under the threshold class 0,
    the background in the authors' VOC21 / Context60 / COCO-Object class files (there 26
    stuff words, SCLIP's ``cls_voc21.txt`` line 1; here the one word); on the other sets
    class 0 is the set's first class, as there. The class set enters the backbone's
    identity, so the feature cache and the shard files of another class set are never
    read."""
    texts = ["background", *names] if background else list(names)
    classes = ClassSet.of(template_embeddings(backbone, texts, TEMPLATE_SETS[templates]))
    return backbone.with_features(CLASS_SET_SOURCE, backbone.image_tower.side, classes=classes)


def class_chunks(backbone: Backbone, names: Sequence[str], separator: str = ", "
                 ) -> list[tuple[int, int]]:
    """The class names cut into consecutive chunks ``(start, end)``, each as long as the
    caption listing them still has its last word read by the text tower (its context: 77
    tokens for OpenAI's CLIP, 32 for the tiny CLIP): VOC's 20 names fit one caption of
    ViT-B/16, ADE20K's 150 take several."""

    def fits(start: int, end: int) -> bool:
        caption = separator.join(names[start:end])
        return int(backbone.words([caption]).token_word.max()) + 1 >= len(split_words(caption))

    chunks, start = [], 0
    while start < len(names):
        end = start + 1
        while end < len(names) and fits(start, end + 1):
            end += 1
        chunks.append((start, end))
        start = end
    return chunks


def _summed(a: RowCounts, b: RowCounts) -> RowCounts:
    """One row's counts over two shards."""
    if isinstance(a[3], str) or isinstance(b[3], str):
        return a
    return (*a[:3], a[3].merged(b[3]))


def _table(data: SegmentationSet, rows: list[RowCounts], n: int, read: str,
           slide: SlideWindow | None, templates: str) -> Table:
    fmt, split = data.source["format"], data.source["split"]
    table = Table("segmentation", f"Open-vocabulary segmentation of {n} {fmt} {split} images "
                  f"({len(data.classes)} classes; {read}; {prompts_reading(templates)})",
                  segmentation_columns(data.classes))
    single = templates == "single"
    prompt = (f"'{PROMPT.format('{name}')}'" if single else
              f"the class's {templates} ensemble (each template's unit text embedding, "
              "averaged, normalised; SCLIP)")
    plan = ("listing the class names" if single else "listing the class names filled into "
            "each template, the class's phrase maps averaged over the templates")
    table.rows = scored_rows(rows, data.classes)
    pixels = table.rows[-1]["pixels"]
    table.notes += [
        "candidates: " + ", ".join(data.names) + (" and background" if data.background else
                                                  "; background pixels void"),
        rule_note(THRESHOLD, data.background),
        "methods: each class's phrase map of the plan between the patches and the caption "
        f"{plan}; explainers: the map of {prompt}; " + (
            "each image resized to the model's input without cropping, no sliding window"
            if slide is None else
            f"sliding window: each image resized to a shorter side of {slide.short} px (the "
            f"longer at most 2048), {slide.crop} px windows every {slide.stride} px, each "
            "resized to the model's input, the maps averaged where windows overlap") +
        "; maps drawn onto the mask's own pixels",
        "labelled pixels: " + ", ".join(f"{c} {v:,}" for c, v in pixels.items()),
        "sanity rows: gold masks (the labels as maps: 100), uniform map"]
    return table

