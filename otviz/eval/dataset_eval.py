"""``otviz eval --dataset KIND:PATH``: the grounding table on a real data set (Flickr30k
Entities, RefCOCO/+/g, Visual Genome regions; :mod:`otviz.data.grounding_sets`), through the
world's own grounding-table code (:func:`otviz.eval.alignment_tables.grounding_table`).

The set is read once, then evaluated in shards of ``shard`` captions: each shard is an
:class:`~otviz.eval.world_set.EvalSet` over a
:class:`~otviz.eval.world_set.GroundingProbeDataset` (features through the feature cache,
keyed by the model and the shard's images and captions), scored by every method, explainer
and baseline, and its rows and per-phrase hits written to ``out/shards/<key>.json`` before
the next shard starts. A stopped run started again with the same arguments reads the
shards already written and goes on; nothing computed is lost. The table is the phrase-
weighted mean of the shards' rows (every metric is a mean over phrases, so this is the
mean over the whole set).

Several processes: ``torchrun --nproc-per-node N -m otviz eval --dataset ...`` shares
the shards among the processes (shard ``k`` to rank ``k % N``), each on its own device; rank
0 gathers the rows from the shard files (:func:`run_dataset_eval`).

Outputs in ``out``: ``<stem>.json`` (the table, the stamp: model, pretrained tag, package
versions, the data set's digest and source, seed, what the readers skipped and why),
``<stem>.md`` and ``<stem>.csv`` (one row per phrase and method: hit, hit with tolerance).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from otviz.backbone import Backbone
from otviz.checkpoints.identity import backbone_fingerprint
from otviz.data.datasets import EmptyDatasetError
from otviz.data.feature_cache import FeatureCache
from otviz.data.grounding_sets import (
    DEFAULT_SPLITS,
    GroundingSet,
    load_grounding_set,
    parse_dataset_spec,
)
from otviz.eval.alignment_tables import (
    DATASET_GROUNDING_COLUMNS,
    grounding_table,
    phrase_queries,
)
from otviz.eval.config import EvalConfig
from otviz.eval.dataset_models import (
    dataset_backbone,
    dataset_suite,
    decodable_items,
    one_space,
    package_versions,
    to_device,
)
from otviz.eval.dataset_segmentation import run_segmentation_eval, segmentation_spec
from otviz.eval.dataset_trust import DATASET_TRUST_METRICS, dataset_trust_table, shard_trust
from otviz.eval.grounding_metrics import (
    POINTING_RULE,
    empty_regions,
    pointing_note,
    tokens_in_boxes,
)
from otviz.eval.runner import _atomic_write, write_tables
from otviz.eval.segmentation import reading
from otviz.eval.table import Table
from otviz.eval.trust.metrics import TrustSettings, require_quantus
from otviz.eval.world_set import (
    EvalSet,
    GroundingProbeDataset,
    model_input_size,
)
from otviz.explainers import explainer_names
from otviz.process_group import barrier, gathered, setup, teardown
from otviz.suite import MethodSuite

StageProgress = Callable[[str, int, int], None]
#: Row values that are means over phrases (combined across shards weighted by phrases).
_MEANS = ("pointing", "pointing_tol", "mean_iou", "hit@0.5", "ms_per_phrase")
_TRUST_SUFFIX = ".trust.json"  # a shard's trust values, beside its rows


def run_dataset_eval(config: EvalConfig, progress: StageProgress | None = None
                     ) -> tuple[list[Table], dict[str, Any]]:
    """The grounding table of ``config.dataset`` (see the module docstring), then with
    ``--tables grounding,trust`` the trust table's localisation metrics
    (:mod:`otviz.eval.dataset_trust`), and their stamp; written to ``config.out`` unless it
    is empty (``grounding.*``, ``trust.json`` and ``trust.md``).

    Under ``torchrun`` (:mod:`otviz.process_group`) each of the ``W`` processes computes the
    shards ``k`` with ``k % W`` equal to its rank, on ``cuda:LOCAL_RANK`` when there is a GPU
    (else the CPU, gloo), and writes them to ``out/shards`` as one process would; the
    processes meet at a barrier, every one reads the table back from the shard files, and
    rank 0 writes the outputs. A stopped job started again resumes from the shards written.
    A segmentation set (``voc:``, ``voc20:``) goes to
    :func:`~otviz.eval.dataset_segmentation.run_segmentation_eval`."""
    if segmentation_spec(config.dataset) is not None:
        return run_segmentation_eval(config, progress)
    kind, path = parse_dataset_spec(config.dataset)
    split = config.split or DEFAULT_SPLITS[kind]
    trust = None
    if "trust" in config.dataset_table_names():
        require_quantus()  # before any shard is computed
        trust = TrustSettings(seed=config.seed)
    info = setup(config.device or "auto")
    if info.distributed and not config.out:
        teardown(info)
        raise ValueError("otviz eval --dataset under torchrun needs --out: the processes "
                         "gather the rows from the shard files written there")
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, config.threads))
    try:
        data = load_grounding_set(kind, path, split, config.images or None, config.limit)
        backbone = dataset_backbone(config)
        suite, suite_note = dataset_suite(backbone, config, data)
        to_device(backbone, str(info.device) if info.distributed else config.device)
        backbone = one_space(backbone, suite)
        frame = model_input_size(backbone)
        identity = {"backbone": backbone_fingerprint(backbone), "suite": suite.label,
                    "methods": list(suite.methods), "explainers": config.explainers,
                    "seed": config.seed, "frame": list(frame)}
        if len({json.dumps(i, sort_keys=True, default=str)
                for i in gathered(identity, info)}) > 1:
            raise ValueError("the processes of this torchrun job do not load the same model "
                             "(random weights: no --pretrained?); each would score the shards "
                             "with its own")
        shards = [data.subset(range(s, min(s + config.shard, len(data))))
                  for s in range(0, len(data), config.shard)]
        results: list[dict[str, Any]] = []
        for k in range(info.rank, len(shards), info.world_size):
            results.append(_shard(shards[k], k, identity, backbone, suite, config, frame,
                                  progress if info.is_main else None, trust))
            if progress is not None and info.is_main:
                progress("shards", k + 1, len(shards))
        if info.distributed:  # every shard is on disk once all processes are here
            barrier(info)
            results = _gathered(shards, identity, config.out, trust is not None)
    finally:
        teardown(info)
        torch.set_num_threads(threads)
    table = _combined(results, data, split)
    table.notes.append(f"methods: {suite.label}; {suite_note}")
    tables = [table]
    if trust is not None:
        tables.append(dataset_trust_table(
            [r["trust"] for r in results], f"{data.source['format']} {split}", trust))
        tables[1].notes.append(f"methods: {suite.label}; {suite_note}")
    for shown in tables:
        shown.title = f"{shown.title} ({reading(backbone)})"
    stamp = {"model": backbone.name, "pretrained": backbone.info.get("pretrained"),
             "backbone_weights": identity["backbone"]["weights"],
             "versions": package_versions(), "dataset": {**data.source, "digest": data.digest(),
                                                         "path": Path(path).name},
             "skipped": data.skipped.as_dict(),
             "undecodable": [m for r in results for m in r["unreadable"]],
             "seed": config.seed, "shards": len(shards), "processes": info.world_size,
             "config": asdict(config)}
    if config.out and info.is_main:
        write_tables([table], config.out, {"stamp": stamp}, stem="grounding")
        _atomic_write(Path(config.out) / "grounding.csv", _phrase_csv(results, data))
        if trust is not None:
            write_tables(tables[1:], config.out, {"stamp": stamp}, stem="trust")
    return tables, stamp


def _shard_file(data: GroundingSet, identity: dict[str, Any], out: str) -> Path:
    """Where a shard's rows are kept: ``out/shards/<key>.json``, the key a digest of what
    they depend on (the backbone, methods, seed, frame and the shard's items)."""
    key = hashlib.sha256(json.dumps({**identity, "data": data.digest()}, sort_keys=True,
                                    default=str).encode()).hexdigest()[:24]
    return Path(out) / "shards" / f"{key}.json"


def _gathered(shards: list[GroundingSet], identity: dict[str, Any], out: str, trust: bool
              ) -> list[dict[str, Any]]:
    """Every shard's result, read from the files the processes wrote."""
    results = [_stored(_shard_file(part, identity, out), trust) for part in shards]
    missing = [k for k, r in enumerate(results) if r is None]
    if missing:
        raise RuntimeError(f"shards {missing} were not written to {Path(out).name}/shards by "
                           "the processes of this job")
    return [r for r in results if r is not None]


def _stored(done: Path | None, trust: bool) -> dict[str, Any] | None:
    """A shard's result as an earlier run wrote it (with its trust values under ``"trust"``
    when ``trust``; kept beside it in ``<key>.trust.json``), or ``None``; trust values
    written without one of :data:`DATASET_TRUST_METRICS` (an older version's) are read as
    not written."""
    if done is None or not done.is_file():
        return None
    result = json.loads(done.read_text(encoding="utf-8"))
    if trust:
        values = done.with_suffix(_TRUST_SUFFIX)
        if not values.is_file():
            return None
        result["trust"] = json.loads(values.read_text(encoding="utf-8"))
        if any(set(DATASET_TRUST_METRICS) - set(row["values"])
               for row in result["trust"]["rows"].values()):
            return None
    return result


def _shard(data: GroundingSet, k: int, identity: dict[str, Any], backbone: Backbone,
           suite: MethodSuite, config: EvalConfig, frame: tuple[int, int],
           progress: StageProgress | None, trust: TrustSettings | None) -> dict[str, Any]:
    """One shard's rows and per-phrase hits (and with ``trust`` its localisation values per
    phrase), each read back when an earlier run wrote it."""
    done = _shard_file(data, identity, config.out) if config.out else None
    stored = _stored(done, trust is not None)
    if stored is not None:
        return stored
    grounding = _stored(done, False)

    def encoding(n: int, total: int) -> None:
        if progress is not None:
            progress(f"encoding shard {k + 1}", n, total)

    data, unreadable = _decodable(data)
    if data is None:
        result: dict[str, Any] = {"rows": [], "hits": {}, "phrases": [], "notes": [],
                                  "unreadable": unreadable}
        _kept(result, done)
        if trust is not None:
            result["trust"] = _kept({"rows": {}, "phrases": 0, "images": 0},
                                    _trust_file(done))
        return result
    probe = GroundingProbeDataset(data, frame)
    if grounding is None:
        grounding = _grounding_shard(probe, k, backbone, suite, config, unreadable, progress,
                                     encoding, done)
    if trust is None:
        return grounding
    if progress is not None:
        progress(f"trust shard {k + 1}", 0, 1)
    values = shard_trust(probe, suite, explainer_names(config.explainers), trust)
    return {**grounding, "trust": _kept(values, _trust_file(done))}


def _trust_file(done: Path | None) -> Path | None:
    """Where a shard's trust values are kept: beside its rows, ``<key>.trust.json``."""
    return None if done is None else done.with_suffix(_TRUST_SUFFIX)


def _grounding_shard(probe: GroundingProbeDataset, k: int, backbone: Backbone,
                     suite: MethodSuite, config: EvalConfig, unreadable: list[str],
                     progress: StageProgress | None, encoding: Callable[[int, int], None],
                     done: Path | None) -> dict[str, Any]:
    """The grounding table's rows and per-phrase hits of one shard, kept in ``done``."""
    data = probe.data
    evalset = EvalSet(probe, backbone, FeatureCache(config.cache_dir), encoding)
    hits: dict[str, dict] = {}
    table = grounding_table(suite, evalset, chunk=config.chunk, progress=progress,
                            explainers=explainer_names(config.explainers),
                            seed=config.seed + k, phrase_hits=hits)
    q = phrase_queries(evalset)  # the phrases the table scored (a cut caption loses some)
    phrases = []
    for j, (start, end) in zip(q.image.tolist(), q.spans.tolist(), strict=True):
        item = data.items[j]
        n = next(n for n, p in enumerate(item.phrases) if (p.start, p.end) == (start, end))
        phrases.append([item.key, n, item.phrases[n].text])
    empty = int(empty_regions(tokens_in_boxes(evalset.geometry, q.gold)).sum())
    return _kept({"rows": table.rows, "hits": hits, "phrases": phrases,
                  "notes": table.notes, "unreadable": unreadable, "empty": empty}, done)


def _kept(result: dict[str, Any], done: Path | None) -> dict[str, Any]:
    """``result``, written to ``done`` first (when given)."""
    if done is not None:
        done.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(done, json.dumps(result))
    return result


def _decodable(data: GroundingSet) -> tuple[GroundingSet | None, list[str]]:
    """``(the items whose image decodes, or None when none does; a message per other)``."""
    kept, unreadable = decodable_items(data)
    if len(kept) == len(data.items):
        return data, unreadable
    return (data.subset(kept) if kept else None), unreadable


def _combined(results: list[dict[str, Any]], data: GroundingSet, split: str) -> Table:
    """The phrase-weighted mean of the shards' rows, as one grounding table."""
    unreadable = sum(len(r["unreadable"]) for r in results)
    results = [r for r in results if r["rows"]]
    if not results:
        raise EmptyDatasetError(f"{data.source['format']} {split}: no image could be decoded")
    n_phrases = sum(len(r["phrases"]) for r in results)
    table = Table("grounding", f"Weak grounding of {n_phrases} gold phrases "
                  f"({len(data)} {data.source['format']} {split} captions, "
                  f"{data.source.get('images')} images)", list(DATASET_GROUNDING_COLUMNS))
    for i, first in enumerate(results[0]["rows"]):
        row = dict(first)
        weights = [r["rows"][i].get("n", 0.0) for r in results]
        total = sum(weights)
        for key in _MEANS:
            if key in first and total:
                row[key] = sum(w * r["rows"][i][key] for w, r in zip(weights, results,
                                                                     strict=True)) / total
        if "n" in first:
            row["n"] = total
        table.rows.append(row)
    empty = sum(r.get("empty", 0) for r in results)  # the tie rule's note counts every shard
    table.notes += [pointing_note(empty) if n.startswith(POINTING_RULE) else n
                    for n in results[0]["notes"]]
    counts = dict(data.skipped.counts)
    if unreadable:
        counts["caption on an undecodable image"] = unreadable
    if counts:
        table.notes.append("skipped while reading: " + ", ".join(
            f"{n} {reason}" for reason, n in sorted(counts.items())))
    return table


def _phrase_csv(results: list[dict[str, Any]], data: GroundingSet) -> str:
    """One line per phrase and row: item key, phrase index, text, row name, hits (expected
    hits under the pointing game's tie rule, written to round-trip exactly)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["item", "phrase", "text", "method", "hit", "hit_tol"])
    for r in results:
        for name, h in r["hits"].items():
            for (item, n, text), hit, tol in zip(r["phrases"], h["hit"], h["hit_tol"],
                                                 strict=True):
                w.writerow([item, n, text, name, repr(float(hit)), repr(float(tol))])
    return out.getvalue()
