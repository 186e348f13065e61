"""ConceptOT's ablation (ConceptOT Table 4) at a reduced budget: the local weight lambda_l,
the anchor rank r, the Sinkhorn iterations L and the hard negatives K_h, one or two values
each around the defaults, every variant trained from the same recipe on the same frozen
backbone and scored on the same world test images.

``otviz ablate`` runs it; its flags are the :class:`~otviz.train.config.TrainConfig` fields
(the shared recipe) plus the variants (``lambda_l=0.25`` may be typed for ``λ_l=0.25``) and
the test set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from otviz.eval import alignment_tables as A
from otviz.eval.config import ABLATION_VARIANTS
from otviz.eval.table import Column, Table
from otviz.eval.world_set import EvalSet
from otviz.suite import MethodSuite, load_head
from otviz.train.config import TrainConfig
from otviz.train.loop import HEAD_DIR, train_method

StageProgress = Callable[[str, int, int], None]
ABLATION_COLUMNS = [
    Column("variant", "Variant", "text"), Column("rank", "r", "int"),
    Column("n_iters", "L", "int"), Column("lambda_local", "λ_l", "num", setting=True),
    Column("hard_negatives", "K_h", "int"), Column("avg_r1", "Avg R@1"),
    Column("overall", "Probe overall"), Column("pointing", "Pointing game"),
    Column("final_local", "Final local loss", "num"), Column("minutes", "Train min", "num"),
]

#: Metrics whose "best variant" claim is judged over seeds.
ABLATION_HEADLINE = (("ablation", "avg_r1"), ("ablation", "overall"), ("ablation", "pointing"))


def canonical_variant(name: str) -> str:
    """A variant name as :data:`ABLATION_VARIANTS` spells it ("lambda_l=0.25" -> "λ_l=0.25")."""
    return name.strip().replace("lambda_l", "λ_l")


def variant_dir(name: str) -> str:
    """A folder name for a variant ("λ_l=0.25" -> "lambda_l-0.25")."""
    return name.replace("λ", "lambda").replace("=", "-")


def ablation_table(
    base: TrainConfig,
    data: EvalSet,
    variants: Sequence[str] = tuple(ABLATION_VARIANTS),
    candidates: int = 16,
    progress: StageProgress | None = None,
) -> Table:
    """Train ConceptOT once per variant (``base`` with the variant's fields, in
    ``base.out/<variant>``) and score it on ``data``: two-stage Avg R@1 (as Table 4), probe
    overall and pointing game."""
    variants = [canonical_variant(v) for v in variants]
    unknown = sorted(set(variants) - set(ABLATION_VARIANTS))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {', '.join(ABLATION_VARIANTS)}")
    budget = f"{base.max_steps} steps" if base.max_steps > 0 else f"{base.epochs} epochs"
    table = Table("ablation", f"ConceptOT ablation ({budget} on {base.n_train} pairs each; "
                  f"{data.n_images} world test images)", ABLATION_COLUMNS)
    for done, name in enumerate(variants):
        config = dataclasses.replace(base, method="conceptot",
                                     out=str(Path(base.out) / variant_dir(name)),
                                     **ABLATION_VARIANTS[name])
        result = train_method(config, None if progress is None else (
            lambda step, total, m, name=name: progress(f"train {name}", step, total)))
        minutes = sum(h["seconds"] for h in result.history) / 60  # resumed steps included
        entry = load_head(Path(config.out) / HEAD_DIR, data.backbone)
        suite = MethodSuite(data.backbone, {"conceptot": entry}, f"ConceptOT {name}")
        retrieval = A.retrieval_table(suite, data, candidates, progress=progress).rows[0]
        probe = A.probe_table(suite, data, progress=progress).rows[0]
        grounding = A.grounding_table(suite, data, progress=progress,
                                       baselines=False).rows[0]
        table.rows.append({
            "variant": name, "rank": config.rank, "n_iters": config.n_iters,
            "lambda_local": config.lambda_local, "hard_negatives": config.hard_negatives,
            "avg_r1": retrieval["avg_r1"], "overall": probe["overall"],
            "pointing": grounding["pointing"], "final_local": result.history[-1]["local"],
            "minutes": minutes, "steps": result.steps,
        })
        if progress is not None:
            progress("ablation", done + 1, len(variants))
    table.notes.append(f"recipe: lr {base.lr}, batch {base.batch_size}; "
                       "λ_l weights the local term in training and in the reranking; train "
                       "min: the optimiser steps' wall time, on a shared machine")
    return table
