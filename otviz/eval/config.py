"""What the commands that evaluate are told, importable without torch (their flags are
built from these fields): :class:`EvalConfig` (``otviz eval``), :class:`OTCLIPTableConfig`
(``otviz eval --otclip-losses``), :class:`ReportConfig` (``otviz report``) and the rows of
the ablation (``otviz ablate``); the code that runs them is in :mod:`otviz.eval.runner`,
:mod:`otviz.eval.otclip_table`, :mod:`otviz.report.render` and :mod:`otviz.eval.ablation`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from otviz import assets
from otviz.knobs import (
    OTCLIP_LOSSES,
    ClassSetSourceText,
    Count,
    ImageSide,
    ListOf,
    NonNegative,
    NonNegativeInt,
    OneOf,
    OTCLIPLosses,
)
from otviz.text.templates import TEMPLATE_SETS

ALIGNMENT_TABLES = ("retrieval", "probe", "grounding", "anchors", "cost")
CLASSIFICATION_TABLES = ("zero_shot", "long_tailed", "selective")
TABLES = ALIGNMENT_TABLES + CLASSIFICATION_TABLES
#: Tables made only when named (not part of "all"): the trust metrics (Quantus) cost minutes;
#: the segmentation table (otviz.eval.segmentation) reads every grounding row as a segmenter.
ON_REQUEST_TABLES = ("trust", "segmentation")
#: The tables of a real data set (--dataset): the grounding table, and on request the trust
#: table's localisation metrics; on a segmentation set (voc, voc20) the segmentation table.
DATASET_TABLES = ("grounding", "trust", "segmentation")
TRAINING_FREE = "training-free"
Tables = Annotated[str, ListOf(TABLES + ON_REQUEST_TABLES, ("all",))]
Templates = Annotated[str, OneOf(tuple(TEMPLATE_SETS))]


def known_names(text: str, known: tuple[str, ...], what: str) -> list[str]:
    """The names of the comma list ``text``, in order; ``ValueError`` naming ``what`` when
    one is not in ``known``."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return names


@dataclass
class EvalConfig:
    """What ``otviz eval`` measures, on what (every field is a command-line flag)."""

    backbone: str = ""  # tiny-CLIP checkpoint dir ("" : the shipped checkpoints/tiny-clip)
    heads: str = str(assets.path("heads"))  # dir of <method>/ heads, or "training-free"
    methods: str = ""  # comma list of comparison methods ("" : all eight)
    explainers: str = ""  # comma list of explainers in the grounding table ("all", "" : none)
    tables: Tables = "all"  # the tables to compute: a comma list, or "all" (every table but
    # "trust", the Quantus metrics, and "segmentation", mIoU of every map read as a
    # segmenter, made only when named); with --dataset: grounding (always) and trust (its
    # localisation metrics: pointing, mass, rank, AUC); voc/voc20: segmentation
    n_test: Count = 1000  # world test images (retrieval, probe, grounding)
    n_compositional: NonNegativeInt = 500  # compositional-split images (held-out probe column)
    seed: NonNegativeInt = 0  # world seed of the test and compositional splits
    seeds: str = ""  # comma list: repeat over these seeds (test draw; heads "{seed}") and
    # report mean and 95 % interval (otviz.eval.seeds); "" : the one seed above
    claims: str = ""  # with seeds: "table:metric:A>B;..." claims to judge (plus every "best")
    candidates: Count = 16  # global top-k candidates per query (two-stage retrieval)
    also_candidates: str = "128"  # comma list of further top-k columns (ConceptOT: 128)
    n_classify: Count = 400  # images per zero-shot / selective task
    lt_n_max: Count = 100  # images of the largest class of a long-tailed test set
    imbalance: NonNegative = 10.0  # long-tailed test sets: largest / smallest class size
    selective_rate: NonNegative = 0.5  # selective classification: share of images answered
    chunk: Count = 512  # pairs per batched method call
    threads: Count = 2  # torch CPU threads
    cache_dir: str = ".cache/otviz-features"  # frozen-backbone feature cache
    out: str = "runs/eval"  # writes tables.json and tables.md here ("" : print only)
    dataset: str = ""  # KIND:PATH of a real grounding set (flickr30k, refcoco, refcoco+,
    # refcocog, vg): its grounding table instead of the world's tables (grounding.json/.md/.csv);
    # or of a segmentation set in its published layout (voc, voc20, context60, context59,
    # ade20k, cityscapes, coco-stuff, coco-object): its segmentation table (segmentation.json/.md)
    split: str = ""  # split of --dataset ("" : test, testA for refcoco/+, all for vg)
    images: str = ""  # image folder of --dataset ("" : the layout's own, under PATH)
    limit: NonNegativeInt = 0  # --dataset: read the first N images of the split (0 : all)
    shard: Count = 256  # --dataset: captions per shard (each shard's rows are kept on disk,
    # so a stopped run resumes)
    model: str = ""  # --dataset: any open_clip model name ("" : the tiny-CLIP --backbone)
    pretrained: str = ""  # --dataset: its pretrained tag or weight file (e.g. openai)
    device: str = ""  # --dataset: torch device of the backbone ("" : cuda when present)
    features: ClassSetSourceText = "last"  # where the patch features come from: last, layer:K
    # (block K, negative from the end), maskclip, sclip, clearclip, naclip, resclip-rcs, scclip,
    # proxy (with --proxy), resclip (--dataset segmentation sets only: ResCLIP's feedback
    # refinement against the set's class names, embedded as --templates says) (trained heads are
    # refused on a source they were not trained on: pair another with --heads training-free)
    image_size: ImageSide = 0  # run the image tower at this side in px (0 : its native size;
    # ViTs only, position embeddings interpolated)
    proxy: str = ""  # the second backbone of --features proxy (ProxyCLIP): a timm ViT
    # NAME (its tag's weights from the hub), NAME:FILE (a local weight file) or NAME:random
    slide: str = ""  # --dataset segmentation sets: sliding window SHORT:CROP:STRIDE in px
    # (SCLIP: 336:224:112; the image resized to a shorter side SHORT, CROP windows every
    # STRIDE, maps averaged where they overlap); "" : each image one resize
    templates: Templates = "single"  # --tables segmentation: the prompts an explainer reads a
    # class from: single ("a photo of a {}." on a data set; the phrase as written on the world)
    # or imagenet80 (CLIP's 80 ImageNet templates, their unit embeddings averaged, as SCLIP)

    def table_names(self) -> list[str]:
        if self.tables == "all":
            return list(TABLES)
        return known_names(self.tables, TABLES + ON_REQUEST_TABLES, "tables")

    def dataset_table_names(self) -> list[str]:
        """With a grounding ``dataset``: ``["grounding"]``, plus ``"trust"`` when named
        (``"segmentation"`` is refused: a grounding set has no masks)."""
        if self.tables == "all":
            return ["grounding"]
        names = known_names(self.tables, DATASET_TABLES, "tables with --dataset")
        if "segmentation" in names:
            raise ValueError("--tables segmentation needs a segmentation set with masks "
                             "(--dataset voc:DIR, voc20:, context60:, context59:, ade20k:, "
                             "cityscapes:, coco-stuff:, coco-object:)")
        return ["grounding"] + (["trust"] if "trust" in names else [])

    def seed_list(self) -> list[int]:
        return [int(s) for s in self.seeds.split(",") if s.strip()]

    def claim_list(self) -> list[tuple[str, str, str, str]]:
        """``claims`` as ``(table, metric, A, B)``."""
        out = []
        for claim in filter(None, (c.strip() for c in self.claims.split(";"))):
            key, metric, pair = claim.split(":")
            a, b = pair.split(">")
            out.append((key.strip(), metric.strip(), a.strip(), b.strip()))
        return out

    def also_k(self) -> list[int]:
        return [int(k) for k in self.also_candidates.split(",") if k.strip()]

    def method_names(self) -> tuple[str, ...]:
        from otviz.suite import ALIGN_METHODS

        if not self.methods:
            return tuple(ALIGN_METHODS)
        return tuple(known_names(self.methods, tuple(ALIGN_METHODS), "methods"))


@dataclass
class OTCLIPTableConfig:
    """The shared reduced pre-training budget and the scoring of the comparison."""

    otclip_kinds: OTCLIPLosses = ",".join(OTCLIP_LOSSES)  # the OT-CLIP losses (a comma list)
    otclip_steps: Count = 400  # pre-training steps of each tiny CLIP
    otclip_batch_size: Count = 128  # pre-training batch
    otclip_lr: NonNegative = 2e-3  # pre-training learning rate
    otclip_n_train: Count = 16000  # world training samples
    otclip_n_test: Count = 500  # held-out retrieval pairs
    otclip_width: Count = 64  # embed dim and both tower widths
    otclip_layers: Count = 2  # layers of both towers
    otclip_heads: Count = 2  # attention heads of both towers
    otclip_n_classify: Count = 300  # images per zero-shot task
    otclip_threads: Count = 2  # torch threads per process
    otclip_processes: Count = 1  # data-parallel pre-training processes
    otclip_seed: NonNegativeInt = 0  # seed of the pre-training and the world
    otclip_seeds: str = ""  # comma list: one pre-training per loss and seed, mean and 95 %
    # interval over the seeds (otviz.eval.seeds); "" : the one seed above
    otclip_runs: str = "runs/otclip"  # the pre-trained models go to <runs>/<loss> (with
    # several seeds: <runs>/s<seed>/<loss>)

    def losses(self) -> list[str]:
        return known_names(self.otclip_kinds, OTCLIP_LOSSES, "OT-CLIP losses")

    def seed_list(self) -> list[int]:
        """The seeds of ``otclip_seeds``, or ``[otclip_seed]`` when it is empty."""
        seeds = [int(s) for s in self.otclip_seeds.split(",") if s.strip()]
        return seeds or [self.otclip_seed]


@dataclass
class ReportConfig:
    """Where the tables and heads are, where the figures go (every field is a flag)."""

    eval_dir: str = "runs/eval"  # folder of tables.json (+ otclip_losses.json, ablation.json)
    heads: str = str(assets.path("heads"))  # trained heads ("training-free": no curves)
    backbone: str = ""  # tiny-CLIP checkpoint ("" : the shipped one)
    n_examples: Count = 4  # grounding grid rows
    seed: NonNegativeInt = 0  # world seed of the examples
    cache_dir: str = ".cache/otviz-features"  # frozen-backbone feature cache
    out: str = "runs/report"  # folder of the PNG figures


#: Table 4's rows: name -> the TrainConfig fields it changes.
ABLATION_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "r=16": {"rank": 16},
    "r=48": {"rank": 48},
    "L=3": {"n_iters": 3},
    "λ_l=0.25": {"lambda_local": 0.25},
    "λ_l=1.0": {"lambda_local": 1.0},
    "K_h=2": {"hard_negatives": 2},
    "K_h=8": {"hard_negatives": 8},
}
