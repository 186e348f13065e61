"""OT-CLIP Table 1 in miniature: the six losses of OT-CLIP's family (InfoNCE, entropic OT,
DBOT, unbalanced OT, fused Gromov OT, U-FG OT; OT-CLIP Eq. 5-10) each pre-train a small
tiny CLIP from scratch on the world at the same reduced budget (same model, data, seed,
steps and schedule), then each model is scored on the world's zero-shot classification
(vanilla softmax, as OT-CLIP Table 1) and on held-out retrieval.

``otviz eval --otclip-losses`` runs it; the flags are the :class:`OTCLIPTableConfig`
fields (all prefixed ``otclip_``); ``--otclip-seeds`` repeats it per seed and reports the mean
and Student-t interval (:func:`otclip_loss_tables`) and, paired by seed, whether each OT loss
beats InfoNCE (:func:`otclip_claims`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from otviz.backbone import Backbone
from otviz.backbone_spec import BackboneSpec
from otviz.eval.classification_metrics import accuracy
from otviz.eval.classification_tables import classification_sets, temperature
from otviz.eval.config import OTCLIPTableConfig
from otviz.eval.held_out import HeldOutRetrieval
from otviz.eval.seeds import aggregate, claims_table
from otviz.eval.table import Column, Table
from otviz.ot.zeroshot import zero_shot_predict
from otviz.train.pretrain import pretrain
from otviz.train.pretrain_config import PretrainConfig

StageProgress = Callable[[str, int, int], None]
LOSS_LABELS = {"infonce": "InfoNCE", "entropic_ot": "Entropic OT", "dbot": "DBOT",
               "unbalanced_ot": "Unbalanced OT", "fgw_ot": "Fused Gromov OT",
               "ufg_ot": "U-FG OT"}
#: What OT-CLIP Table 1 compares (zero-shot) and the retrieval it also reports.
CLAIM_METRICS = ("zs_mean", "i2t_r1", "t2i_r1")


def pretrain_config(config: OTCLIPTableConfig, loss: str) -> PretrainConfig:
    """The pre-training run of ``loss`` at the table's shared budget: a CLIP as OT-CLIP
    trains it (Sec. 4.1: a ViT with its patch embedding, the loss alone: no token-wise local
    term and no world hard negatives, which the shipped tiny CLIP's recipe adds)."""
    w = config.otclip_width
    return PretrainConfig(
        steps=config.otclip_steps, batch_size=config.otclip_batch_size, lr=config.otclip_lr,
        warmup_steps=max(1, config.otclip_steps // 10), seed=config.otclip_seed,
        n_train=config.otclip_n_train, n_test=config.otclip_n_test, embed_dim=w,
        vision_width=w, vision_layers=config.otclip_layers, vision_heads=config.otclip_heads,
        text_width=w, text_layers=config.otclip_layers, text_heads=config.otclip_heads,
        vision_pos_embed="sin_cos_2d", vision_stem="patch", loss=loss, hard_negatives=0,
        local_weight=0.0,
        threads=config.otclip_threads,
        processes=config.otclip_processes, eval_every=0,
        out=str(Path(config.otclip_runs) / loss),
    )


def zero_shot_accuracies(backbone: Backbone, n_images: int, seed: int = 0) -> dict[str, float]:
    """Softmax zero-shot top-1 accuracy per classification task (OT-CLIP Table 1's
    protocol: vanilla inference)."""
    eps = temperature(backbone)
    return {
        cs.label: accuracy(zero_shot_predict(cs.image_emb, cs.class_emb, "softmax",
                                             eps=eps).labels, cs.labels)
        for cs in classification_sets(backbone, n_images, seed=seed)
    }


def otclip_loss_table(
    config: OTCLIPTableConfig, progress: StageProgress | None = None
) -> tuple[Table, dict[str, list[dict[str, float]]]]:
    """Pre-train one model per loss, score each; returns the table and each run's training
    log (loss per step, for convergence curves)."""
    losses = config.losses()
    columns = [Column("loss", "Loss", "text"), Column("shape", "Shape"),
               Column("colour", "Colour"), Column("colour_shape", "Colour+shape"),
               Column("colour_shape (held-out)", "Held-out pairs"),
               Column("zs_mean", "Zero-shot mean"), Column("i2t_r1", "I→T R@1"),
               Column("t2i_r1", "T→I R@1"), Column("i2t_r5", "I→T R@5"),
               Column("t2i_r5", "T→I R@5"), Column("final_loss", "Final loss", "num"),
               Column("minutes", "Minutes", "num")]
    c = config
    table = Table("otclip_losses", f"OT-CLIP loss family pre-training a tiny CLIP from scratch "
                  f"({c.otclip_steps} steps x {c.otclip_batch_size} pairs each)", columns)
    logs: dict[str, list[dict[str, float]]] = {}
    for done, loss in enumerate(losses):
        pre = pretrain_config(config, loss)
        t0 = time.perf_counter()
        metrics = pretrain(pre, None if progress is None else (
            lambda step, total, entry, loss=loss: progress(f"pretrain {loss}", step, total)),
            held_out=HeldOutRetrieval)
        backbone = BackboneSpec(checkpoint=pre.out).load()
        zs = zero_shot_accuracies(backbone, config.otclip_n_classify, config.otclip_seed)
        logs[loss] = [{k: e[k] for k in ("step", "loss")} for e in backbone.info["log"]]
        table.rows.append({
            "loss": LOSS_LABELS[loss], "name": loss, **zs,
            "zs_mean": sum(zs.values()) / len(zs),
            **{k: metrics[k] for k in ("i2t_r1", "t2i_r1", "i2t_r5", "t2i_r5", "i2t_r10",
                                        "t2i_r10")},
            "final_loss": metrics["final_loss"], "minutes": (time.perf_counter() - t0) / 60,
        })
        if progress is not None:
            progress("otclip losses", done + 1, len(losses))
    table.notes += [
        f"each model: width {c.otclip_width}, {c.otclip_layers}+{c.otclip_layers} layers, "
        f"{c.otclip_n_train} world training samples, lr {c.otclip_lr}, seed {c.otclip_seed}; "
        f"retrieval on {c.otclip_n_test} held-out test pairs, zero-shot on "
        f"{c.otclip_n_classify} images per task (softmax)",
        "final loss values are not comparable across losses (different objectives)",
    ]
    return table, logs


def otclip_loss_tables(
    config: OTCLIPTableConfig, progress: StageProgress | None = None
) -> tuple[list[Table], dict[int, dict[str, list[dict[str, float]]]]]:
    """:func:`otclip_loss_table` at each seed of ``config.seed_list()`` (pre-training and
    world drawn from the seed, models under ``<otclip_runs>/s<seed>`` when there are several);
    one seed gives its table, several the mean and Student-t interval over them
    (:func:`otviz.eval.seeds.aggregate`) and :func:`otclip_claims`. Returns the tables and
    the training logs per seed."""
    seeds = config.seed_list()
    if len(seeds) == 1:
        table, logs = otclip_loss_table(replace(config, otclip_seed=seeds[0]), progress)
        return [table], {seeds[0]: logs}
    runs, logs_per_seed = [], {}
    for seed in seeds:
        one = replace(config, otclip_seed=seed,
                      otclip_runs=str(Path(config.otclip_runs) / f"s{seed}"))
        table, logs_per_seed[seed] = otclip_loss_table(one, progress)
        runs.append(table)
    tables = [aggregate(runs, seeded="the pre-training and of the world's samples")]
    losses = config.losses()
    if "infonce" in losses and len(losses) > 1:
        tables.append(otclip_claims(runs))
    return tables, logs_per_seed


def otclip_claims(runs: Sequence[Table], baseline: str = "infonce") -> Table:
    """OT-CLIP's claim that its losses beat InfoNCE (Sec. 4.2, Table 1), judged per loss and
    metric (:data:`CLAIM_METRICS`) from the paired per-seed differences of the per-seed
    tables ``runs`` (:func:`otviz.eval.seeds.claims_table`)."""
    losses = [row["name"] for row in runs[0].rows if row["name"] != baseline]
    claims = [("otclip_losses", metric, loss, baseline)
              for loss in losses for metric in CLAIM_METRICS]
    return claims_table({"otclip_losses": runs}, claims, key="otclip_claims",
                        question="Does an OT loss beat InfoNCE?")
