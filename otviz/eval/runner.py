"""``otviz eval``: every table of the comparison for one backbone and one method suite, printed
and written as JSON and Markdown.

:func:`run_eval` builds the suite (trained heads from ``heads``, or the training-free
configuration), encodes the world's test and compositional splits once through the
feature cache, and runs the tables of :mod:`otviz.eval.alignment_tables` and
:mod:`otviz.eval.classification_tables` that ``tables`` names, reporting progress.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from otviz.backbone import Backbone
from otviz.backbone_spec import BackboneSpec
from otviz.eval import alignment_tables as A
from otviz.eval import classification_tables as C
from otviz.eval import seeds as S
from otviz.eval.config import ALIGNMENT_TABLES, TRAINING_FREE, EvalConfig
from otviz.eval.segmentation import reading, segmentation_table
from otviz.eval.table import Column, Table
from otviz.eval.world_set import EvalSet
from otviz.explainers import explainer_names
from otviz.suite import ALIGN_METHODS, WORLD_FIT_CAPTIONS, MethodSuite

StageProgress = Callable[[str, int, int], None]
JSON_FILE, MARKDOWN_FILE = "tables.json", "tables.md"


def load_backbone(path: str = "") -> Backbone:
    """The tiny-CLIP checkpoint at ``path`` (default: the shipped one)."""
    return BackboneSpec(checkpoint=path or None).load()


def eval_spec(config: EvalConfig) -> BackboneSpec:
    """The backbone ``config`` names, on the CPU (where the methods are fitted): its
    ``--model`` with ``--pretrained`` under ``--dataset`` (the world's tables are the tiny
    CLIP's: ``--backbone``), read at ``--features``, ``--image-size``, ``--proxy``."""
    world = {} if config.dataset else {"model": None, "pretrained": None}
    return BackboneSpec.from_fields(config, device="cpu", **world)


def build_suite(backbone: Backbone, heads: str, names: Sequence[str]) -> MethodSuite:
    """Trained heads from ``heads`` or, for ``"training-free"``, the training-free suite
    (ConceptOT anchors fitted on the world's vocabulary phrases)."""
    if heads == TRAINING_FREE:
        return MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS, ("global_only", *names))
    return MethodSuite.from_heads(backbone, heads, tuple(names))


#: The metric of every "best ..." claim judged over seeds (best mean vs the runner-up).
HEADLINE_METRICS = (("retrieval", "avg_r1"), ("probe", "overall"), ("grounding", "pointing"))


def run_eval(config: EvalConfig, progress: StageProgress | None = None) -> list[Table]:
    """The tables ``config.tables`` for ``config``'s backbone and suite (see the module
    docstring); writes them to ``config.out`` unless it is empty. With ``config.seeds``:
    every table once per seed (test draw ``seed``; heads ``config.heads`` with ``{seed}``
    replaced, when it has one), then the tables over seeds (mean and interval) and the
    claims table (:mod:`otviz.eval.seeds`); the per-seed tables go to the JSON too."""
    names = config.table_names()
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, config.threads))
    extra: dict[str, Any] = {"config": asdict(config)}
    try:
        seeds = config.seed_list()
        if not seeds:
            tables = _run(config, names, progress)
        else:
            per_seed = {s: _run(seed_config(config, s), names, progress) for s in seeds}
            tables = over_seeds(list(per_seed.values()), config.claim_list())
            if "trust" in names:
                from otviz.eval.trust.table import refresh_verdicts

                refresh_verdicts(tables)
            extra["per_seed"] = {str(s): {t.key: t.to_dict() for t in ts}
                                 for s, ts in per_seed.items()}
    finally:
        torch.set_num_threads(threads)
    if config.out:
        write_tables(tables, config.out, extra)
    return tables


def seed_config(config: EvalConfig, seed: int) -> EvalConfig:
    """``config`` for one seed: the test draw ``seed``, heads ``heads.format(seed=seed)``."""
    heads = config.heads.replace("{seed}", str(seed))
    return replace(config, seed=seed, seeds="", heads=heads, out="")


def over_seeds(
    per_seed: list[list[Table]], claims: Sequence[tuple[str, str, str, str]] = (),
    headline: Sequence[tuple[str, str]] = HEADLINE_METRICS,
) -> list[Table]:
    """Tables over seeds (one list of tables per seed) and the claims table: the given
    claims and, for the headline metrics, "the best mean row beats the runner-up"."""
    runs = {t.key: [tables[i] for tables in per_seed] for i, t in enumerate(per_seed[0])}
    judged = S.best_vs_runner_up(runs, headline) + list(claims)
    return [S.aggregate(r) for r in runs.values()] + [S.claims_table(runs, judged)]


def _run(config: EvalConfig, names: list[str], progress: StageProgress | None) -> list[Table]:
    backbone = eval_spec(config).build()
    tables: dict[str, Table] = {}
    suite = None
    if any(n in ALIGNMENT_TABLES or n == "segmentation" for n in names):
        suite = build_suite(backbone, config.heads, config.method_names())

        def encoding(done: int, total: int) -> None:
            if progress is not None:
                progress("encoding", done, total)

        test = EvalSet.build(backbone, config.n_test, "test", config.seed, config.cache_dir,
                             encoding)
        kw: dict[str, Any] = {"chunk": config.chunk, "progress": progress}
        if "retrieval" in names or "cost" in names:
            tables["retrieval"] = A.retrieval_table(suite, test, config.candidates,
                                                    also_k=config.also_k(), **kw)
        if "probe" in names:
            comp = None if config.n_compositional < 1 else EvalSet.build(
                backbone, config.n_compositional, "compositional", config.seed,
                config.cache_dir, encoding)
            tables["probe"] = A.probe_table(suite, test, comp, **kw)
        if "grounding" in names:
            tables["grounding"] = A.grounding_table(
                suite, test, explainers=explainer_names(config.explainers), **kw)
        if "segmentation" in names:
            tables["segmentation"] = segmentation_table(
                suite, test, explainer_names(config.explainers), chunk=config.chunk,
                progress=progress, templates=config.templates)
        if "anchors" in names:
            tables["anchors"] = A.anchor_table(suite)
        if "cost" in names:
            tables["cost"] = A.cost_table(suite, test, tables["retrieval"])
        for t in tables.values():
            t.notes.append(f"methods: {suite.label}")
    if "zero_shot" in names or "selective" in names:
        sets = C.classification_sets(backbone, config.n_classify, seed=config.seed)
        if "zero_shot" in names:
            tables["zero_shot"] = C.zero_shot_table(backbone, sets=sets)
        if "selective" in names:
            tables["selective"] = C.selective_table(backbone, rate=config.selective_rate,
                                                    sets=sets)
    if "trust" in names:
        from otviz.eval.trust.table import trust_tables

        suite = suite or build_suite(backbone, config.heads, config.method_names())
        tables["trust"], tables["trust_cost"] = trust_tables(
            suite, config.n_test, config.seed, explainer_names(config.explainers),
            progress=progress)
        tables["trust"].notes.append(f"methods: {suite.label}")
    if "long_tailed" in names:
        tables["long_tailed"] = C.long_tailed_table(backbone, config.lt_n_max, config.imbalance,
                                                    seed=config.seed)
        if progress is not None:
            progress("long-tailed", 1, 1)
    named = reading(backbone)
    for table in tables.values():
        if named not in table.title:
            table.title = f"{table.title} ({named})"
    return [tables[n] for n in names] + ([tables["trust_cost"]] if "trust" in names else [])


def write_tables(
    tables: list[Table], out: str | os.PathLike, extra: dict[str, Any] | None = None,
    stem: str = "tables",
) -> tuple[Path, Path]:
    """``out/<stem>.json`` (raw values and ``extra``) and ``out/<stem>.md`` (the Markdown
    tables), each written to a temporary file and renamed."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    record = {"tables": {t.key: t.to_dict() for t in tables}, "written": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(extra or {})}
    json_path = _atomic_write(directory / f"{stem}.json", json.dumps(record, indent=1))
    md_path = _atomic_write(directory / f"{stem}.md", "\n".join(t.markdown() for t in tables))
    return json_path, md_path


def read_tables(path: str | os.PathLike) -> dict[str, Table]:
    """The tables of a ``tables.json`` written by :func:`write_tables`, by key."""
    record = json.loads(Path(path).read_text(encoding="utf-8"))
    return {
        key: Table(key, t["title"], [Column(c["key"], c["label"], c["format"])
                                     for c in t["columns"]], t["rows"], t["notes"])
        for key, t in record["tables"].items()
    }


def _atomic_write(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


#: Manifest fields of a head's eval record: table key -> (row key, manifest name).
EVAL_METRICS: dict[str, tuple[tuple[str, str], ...]] = {
    "retrieval": (("avg_r1", "avg_r1"), ("i2t_r1", "i2t_r1"), ("t2i_r1", "t2i_r1")),
    "probe": (("overall", "probe_overall"), ("compositional", "probe_held_out")),
    "grounding": (("pointing", "pointing_game"), ("mean_iou", "mean_iou")),
    "cost": (("ms_per_pair", "ms_per_pair"), ("params", "params")),
}


def record_eval_metrics(
    tables: list[Table], manifest: str | os.PathLike, heads: str | os.PathLike, command: str,
    config: EvalConfig,
) -> list[str]:
    """Add each trained head's metrics of ``tables`` to its manifest entry (``eval``
    field: the values, the command and the test-set sizes); returns the keys updated."""
    from otviz.checkpoints.manifest import manifest_key, update_manifest

    per_method: dict[str, dict[str, Any]] = {}
    for table in tables:
        for row_key, field_name in EVAL_METRICS.get(table.key, ()):
            for row in table.rows:
                if row.get("name") in ALIGN_METHODS and row.get(row_key) is not None:
                    per_method.setdefault(row["name"], {})[field_name] = row[row_key]
    keys = []
    for name, metrics in per_method.items():
        key = manifest_key(manifest, Path(heads) / name)
        update_manifest(manifest, key, {"eval": {
            **metrics, "command": command, "n_test": config.n_test,
            "n_compositional": config.n_compositional, "candidates": config.candidates,
            "world_seed": config.seed}})
        keys.append(key)
    return keys
