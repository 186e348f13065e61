"""``otviz report``: the paper-style figures of an evaluation, as PNG files.

From the tables ``otviz eval`` wrote (``tables.json``, and ``otclip_losses.json`` /
``ablation.json`` when present): bars of retrieval, grounding, zero-shot and selective
accuracy, the probe matrix, the OT-CLIP loss comparison with its convergence curves and the
ablation. From the trained heads: their training curves, ConceptOT's anchor similarity
matrix and anchor-word affinity for the world's vocabulary, and a grid of phrase-grounding
heatmaps (test examples x methods).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from otviz.checkpoints.heads import head_meta
from otviz.eval.alignment_tables import align_pairs, phrase_queries
from otviz.eval.classification_tables import ZERO_SHOT_RULES
from otviz.eval.config import ReportConfig
from otviz.eval.grounding_metrics import mean_offdiag_cosine
from otviz.eval.otclip_table import LOSS_LABELS
from otviz.eval.runner import build_suite, load_backbone, read_tables
from otviz.eval.table import Table
from otviz.eval.world_set import EvalSet
from otviz.methods.base import LOCAL_CONTRASTIVE, POWERSET_TRIPLET, QCT, local_objective
from otviz.ot.zeroshot import LONG_TAILED_RULES
from otviz.report.figures import (
    GRID_TITLE,
    curves_figure,
    grounding_grid_figure,
    grouped_bars_figure,
    with_title,
)
from otviz.suite import (
    ALIGN_METHODS,
    METHOD_LABELS,
    MethodSuite,
    flat_map_reasons,
    word_concept_embeddings,
)
from otviz.viz.anchors import affinity_figure, anchor_matrix_figure, cluster_order
from otviz.viz.probe import probe_accuracy_figure
from otviz.viz.tables import POINTING_LABELS, titled
from otviz.world import COLOURS, NEGATIVE_CATEGORIES, SHAPES, SIZES

#: Panel titles of the training curves, by local objective.
LOSS_PANELS = {LOCAL_CONTRASTIVE: "Eq. 9-10 local contrastive", QCT: "QC-Align: QCT",
               POWERSET_TRIPLET: "PowerCLIP: powerset triplet"}
#: The world's vocabulary as single words (anchor-word affinity).
WORLD_WORDS: list[str] = [*SIZES, *COLOURS, *SHAPES, "left", "right", "above", "below", "and",
                          "there"]


def _labels(table: Table) -> list[str]:
    """The first column of each row (method, task, loss or variant)."""
    first = table.columns[0].key
    return [str(r[first]) for r in table.rows]


#: Both pointing conventions, named (:data:`~otviz.viz.tables.POINTING_LABELS`): label -> key.
POINTING_SERIES = {label: key for key, label in POINTING_LABELS.items()}
# tables drawn as grouped bars of some columns: series label -> column key, and the y unit
# (a column no row of the table has is left out: an older table without ``pointing_tol``)
BAR_COLUMNS: dict[str, tuple[dict[str, str], str]] = {
    "retrieval": ({"I→T R@1": "i2t_r1", "T→I R@1": "t2i_r1", "Avg R@1": "avg_r1"}, "recall (%)"),
    "grounding": ({**POINTING_SERIES, "mean IoU": "mean_iou", "hit@0.5": "hit@0.5"}, "%"),
    "otclip_losses": ({"zero-shot mean": "zs_mean", "I→T R@1": "i2t_r1", "T→I R@1": "t2i_r1"}, "%"),
    "ablation": ({"Avg R@1": "avg_r1", "probe overall": "overall", **POINTING_SERIES}, "%"),
}


def _intervals(table: Table, columns: dict[str, str]) -> dict[str, list] | None:
    """Per series, each row's ``[low, high]`` interval over seeds, where the table has
    them (``<key>_ci``, :func:`otviz.eval.seeds.aggregate`)."""
    out = {label: table.column(f"{key}_ci") for label, key in columns.items()}
    out = {label: spans for label, spans in out.items() if any(s is not None for s in spans)}
    return out or None


def table_figures(tables: dict[str, Table]) -> dict[str, Figure]:
    """Bars (and the probe matrix) of the tables present, by file stem."""
    figs: dict[str, Figure] = {}
    for key, (columns, unit) in BAR_COLUMNS.items():
        if key in tables:
            t = tables[key]
            shown = {label: col for label, col in columns.items()
                     if any(v is not None for v in t.column(col))}
            series = {label: t.column(col) for label, col in shown.items()}
            figs[key] = grouped_bars_figure(_labels(t), series, t.title, unit,
                                            intervals=_intervals(t, shown))
    if "probe" in tables:
        t = tables["probe"]
        cats = [c for c in (*NEGATIVE_CATEGORIES, "overall", "compositional")
                if any(c in r for r in t.rows)]
        acc = np.array([[r.get(c, np.nan) for c in cats] for r in t.rows], dtype=float)
        figs["probe"] = with_title(  # the table's title: its reading, as otviz eval names it
            probe_accuracy_figure(_labels(t), cats, acc, int(t.rows[0]["n_items"])), t.title)
    for key, rules in (("zero_shot", tuple(ZERO_SHOT_RULES)),
                       ("selective", ("all", "confidence", "uot", "partial"))):
        if key in tables:
            t = tables[key]
            labels = {c.key: c.label for c in t.columns}
            shown = {labels[r]: r for r in rules if r in labels}
            figs[key] = grouped_bars_figure(
                _labels(t), {label: t.column(r) for label, r in shown.items()}, t.title,
                "top-1 accuracy (%)", intervals=_intervals(t, shown))
    if "long_tailed" in tables:
        t = tables["long_tailed"]
        groups = [f"{r['task']} {r['order']}" for r in t.rows]
        labels = {c.key: c.label for c in t.columns}
        shown = {labels[r]: r for r in ("softmax", *LONG_TAILED_RULES) if r in labels}
        figs["long_tailed"] = grouped_bars_figure(
            groups, {label: t.column(r) for label, r in shown.items()}, t.title,
            "top-1 accuracy (%)", intervals=_intervals(t, shown))
    return figs


def training_curves_figure(heads: str | Path, names: Sequence[str] = ALIGN_METHODS) -> Figure:
    """The local loss of every shipped head per training step (from its checkpoint), one
    panel per loss (Eq. 9-10 contrastive, QC-Align's QCT, PowerCLIP's triplet)."""
    panels: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for name in names:
        curve = head_meta(Path(heads) / name)["metrics"].get("curve")
        if curve:
            kind = LOSS_PANELS[local_objective(name)]
            panels.setdefault(kind, {})[METHOD_LABELS[name]] = (curve["step"], curve["local"])
    return curves_figure(panels, "local loss", smooth=5,
                         suptitle="Local loss of each method head during training")


def anchor_figures(suite: MethodSuite) -> dict[str, Figure]:
    """ConceptOT's anchor-anchor cosine matrix and anchor-word affinity (ConceptOT Fig. 4-5)."""
    entry = suite.methods.get("conceptot")
    if entry is None:
        return {}
    anchors = entry.method.unit_anchors().detach()
    cosine = (anchors @ anchors.T).double().numpy()
    order = cluster_order(cosine)
    words = word_concept_embeddings(suite.backbone, entry, WORLD_WORDS)
    affinity = (anchors @ words.T).double().numpy()
    return {"anchor_cosine": anchor_matrix_figure(cosine, order, mean_offdiag_cosine(anchors)),
            "anchor_word_affinity": affinity_figure(affinity, WORLD_WORDS, order)}


def grounding_examples_figure(suite: MethodSuite, data: EvalSet, n_examples: int) -> Figure:
    """The first gold phrase of each of the first ``n_examples`` test images, heatmap of
    every method with a plan (rows: examples, columns: methods)."""
    q = phrase_queries(data)
    first = [int((q.image == j).nonzero()[0]) for j in range(n_examples)
             if bool((q.image == j).any())]
    rows = torch.tensor(first, dtype=torch.long)
    names = [n for n, entry in suite.methods.items() if entry.method.has_plan]
    heats = [
        align_pairs(suite.methods[name], data, q.image[rows], data.positives[q.image[rows]],
                    lambda a, r: a.heatmap(q.select[rows][r, : a.token_mask.shape[1]])
                    ).reshape(len(first), *data.grid).numpy()
        for name in names
    ]
    return grounding_grid_figure(
        [data.samples[int(q.image[k])].image for k in first],
        [[heats[m][i] for m in range(len(names))] for i in range(len(first))],
        [q.boxes[k].tolist() for k in first], [f'"{q.texts[k]}"' for k in first],
        [METHOD_LABELS[n] for n in names], data.geometry,
        notes=[flat_map_reasons().get(n) for n in names],
        title=titled(GRID_TITLE, suite.backbone))


def render_report(config: ReportConfig) -> list[Path]:
    """Write every figure the inputs allow to ``config.out`` as PNG; returns the paths."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    eval_dir = Path(config.eval_dir)
    tables: dict[str, Table] = {}
    for stem in ("tables", "otclip_losses", "ablation"):
        if (eval_dir / f"{stem}.json").exists():
            tables |= read_tables(eval_dir / f"{stem}.json")
    figs = table_figures(tables)
    logs_file = eval_dir / "otclip_losses.json"
    if logs_file.exists():
        logs = json.loads(logs_file.read_text(encoding="utf-8")).get("logs", {})
        if logs:
            runs = {LOSS_LABELS.get(k, k): ([e["step"] for e in v], [e["loss"] for e in v])
                    for k, v in logs.items()}
            figs["otclip_curves"] = curves_figure(
                {"Pre-training loss per OT-CLIP loss (each its own objective)": runs}, "loss",
                smooth=5)
    backbone = load_backbone(config.backbone)
    suite = build_suite(backbone, config.heads, ALIGN_METHODS)
    if Path(config.heads).is_dir():
        figs["training_curves"] = training_curves_figure(config.heads)
    figs |= anchor_figures(suite)
    data = EvalSet.build(backbone, max(config.n_examples, 1), "test", config.seed,
                         config.cache_dir)
    figs["grounding_examples"] = grounding_examples_figure(suite, data, config.n_examples)
    paths = []
    for stem, fig in figs.items():
        path = out / f"{stem}.png"
        fig.savefig(path)
        paths.append(path)
    return paths
