"""Every knob of method-head training on a frozen backbone, in one dataclass.

Defaults are the papers' (ConceptOT Tables 6-7 for the recipe and the transport solver,
QC-Align's ``eps = 0.5`` and ``lambda = 0.5``, PowerCLIP's ``lambda = 0.2``, ``tau = 1e-3``,
``alpha = 0.75`` and ``M = 10`` random boxes), except where this machine forces a choice
(float32 on CPU instead of mixed precision, a synthetic-world training set). Every field is
an ``int``/``float``/``str``/``bool``, so :func:`otviz.cli.args.add_dataclass_flags` turns
each into a command-line flag (``--hard-negatives 2``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from otviz.knobs import (
    DEFAULT_LAMBDA,
    Count,
    FeatureSourceText,
    HeadStart,
    ImageSide,
    LowRankVariant,
    MethodName,
    NonNegative,
    NonNegativeInt,
    OTCLIPLoss,
    TripletNegatives,
)

if TYPE_CHECKING:
    from otviz.methods.base import MethodConfig

#: ConceptOT App. E, Table 6: ~100K COCO pairs, batch 64, 3 epochs for the transport methods
#: and 8 for the simpler scorers, lr 1e-4 with 5 % warm-up then cosine; reranking top-128.
PAPER_TRAIN_PAIRS = 100_000
PAPER_RERANK_TOP = 128

#: Fields that may change between a run and its resumption without changing the loss curve.
RESUMABLE_CHANGES = frozenset(
    {"out", "resume", "threads", "checkpoint_every", "log_every", "device", "cache_dir",
     "workers"}
)


@dataclass
class TrainConfig:
    """Training recipe of one method head (ConceptOT Sec. 2.4, 3.1, App. E Alg. 2).

    The ``method`` is any name of :data:`otviz.methods.METHODS`; its loss is chosen by
    :func:`otviz.train.losses.local_objective` (Eq. 9-10 for the patch-token methods, the
    QCT loss for ``qc_align``, the powerset triplet loss for ``powerclip``).
    """

    method: MethodName = "conceptot"  # the alignment method whose head is trained
    # ---------------------------------------------------------------- data and backbone
    data: str = "world"  # "world" (the synthetic world), or an image-caption folder, a
    # path,caption .csv, a COCO captions .json or a Karpathy dataset_*.json (these through
    # the feature cache), or webdataset shards, streamed: a .tar, a folder of .tar files or
    # a pattern shards/{000000..000099}.tar (KEY.jpg|png|webp + KEY.txt, as img2dataset)
    split: str = "train"  # split of a Karpathy / COCO folder (the world always trains on train)
    n_train: Count = 5000  # world samples (ignored for folders)
    world_seed: NonNegativeInt = 0  # seed of the world's training draw
    n_val: NonNegativeInt = 0  # world validation pairs (its "val" split) for early stopping
    # (0: none); the published head is the best validation epoch's
    patience: NonNegativeInt = 0  # validations (epochs) without improvement before stopping
    # early (0: never)
    backbone: str = ""  # tiny-CLIP checkpoint dir ("" : the shipped checkpoints/tiny-clip)
    open_clip_model: str = ""  # an open_clip name instead (e.g. ViT-B-16): real CLIP mode
    pretrained: str = ""  # open_clip pretrained tag or weight file ("" : random init)
    cache_dir: str = ".cache/otviz-features"  # frozen-backbone feature cache
    workers: NonNegativeInt = 2  # DataLoader processes decoding streamed shards, per
    # training process (0: decode in the training process)
    features: FeatureSourceText = "last"  # where the patch features come from: last, layer:K
    # (block K, negative from the end), maskclip, sclip, clearclip, naclip, resclip-rcs, scclip,
    # proxy (with --proxy); the head records it
    image_size: ImageSide = 0  # run the image tower at this side in px (0 : its native size)
    proxy: str = ""  # the second backbone of --features proxy (ProxyCLIP): a timm ViT
    # NAME (its tag's weights from the hub), NAME:FILE (a local weight file) or NAME:random
    # ---------------------------------------------------------------- optimisation (Table 6)
    epochs: Count = 3  # ConceptOT: 3 for transport methods, 8 for the simpler scorers
    max_steps: NonNegativeInt = 0  # > 0: stop after this many steps instead (epochs unbounded)
    batch_size: Count = 64  # global batch (split over the processes under torchrun)
    lr: NonNegative = 1e-4  # AdamW learning rate (peak, after the warm-up)
    weight_decay: NonNegative = 1e-2  # AdamW weight decay
    warmup_frac: NonNegative = 0.05  # linear warm-up over this share of the steps, then cosine
    grad_clip: NonNegative = 1.0  # max global gradient norm (0: no clipping)
    seed: NonNegativeInt = 0  # method initialisation, data order, region masks
    # ---------------------------------------------------------------- transport (Table 7)
    eps: NonNegative = 0.07  # Sinkhorn entropy epsilon of the transport methods
    tau_v: NonNegative = 0.2  # unbalanced relaxation tau_v on the patch side
    tau_t: NonNegative = 0.2  # unbalanced relaxation tau_t on the word side
    n_iters: Count = 5  # Sinkhorn iterations L
    rank: Count = 32  # concept anchors r
    concept_dim: Count = 256  # d_c of a "random" start ("backbone": the model's joint width)
    start: HeadStart = "auto"  # where the projections start: "backbone", the model's own
    # projection plus a zero update (step 0 = the training-free configuration); "random", a
    # new d_c-wide random projection (ConceptOT's recipe); "auto", "backbone" where the
    # towers' projections are affine maps (the embedded model, open_clip's ViTs), else "random"
    start_rank: NonNegativeInt = 0  # rank of the "backbone" start's update (0: full residual)
    anchor_hold: bool = False  # ConceptOT from the backbone: keep the anchors at the
    # training-free k-means anchors (not trained) while the projections' update trains
    anchor_pull: NonNegative = 0.0  # ConceptOT from the backbone: weight lambda_A of
    # lambda_A * ||P - P_kmeans||^2, pulling the anchors toward the training-free k-means
    # anchors while they train (0: no pull)
    kpp_reg: NonNegative = 1e-2  # regulariser of the k-means++ anchor initialisation
    lowrank_variant: LowRankVariant = "faithful"  # low-rank solver (otviz.ot.lowrank)
    # ---------------------------------------------------------------- local loss (Eq. 9-10)
    lambda_local: NonNegative = DEFAULT_LAMBDA  # lambda_l (also QC-Align's lambda)
    tau_local: NonNegative = 0.07  # tau_l
    hard_negatives: NonNegativeInt = 4  # K_h per direction
    beta: NonNegative = 1e-3  # anchor diversity weight
    # ---------------------------------------------------------------- QC-Align
    qc_eps: NonNegative = 0.5  # QC-Align's Sinkhorn entropy (replaces eps for qc_align)
    came_temperature: NonNegative = 1.0  # CAME's softmax temperature (1: the paper's softmax)
    # ---------------------------------------------------------------- PowerCLIP
    lambda_powerset: NonNegative = 0.2  # weight of PowerCLIP's powerset triplet loss
    powerset_tau: NonNegative = 1e-3  # temperature of the powerset similarity
    powerset_alpha: NonNegative = 0.75  # PowerCLIP's alpha
    powerset_gamma: NonNegative = 0.2  # triplet margin (the paper gives no value)
    powerset_negatives: TripletNegatives = "all"  # "all" (mean hinge, VSE++) or "hardest"
    # (Eq. 9)
    n_regions: Count = 15  # random boxes per image (PowerCLIP-R, Sec. 3.2; M = 15 won on
    # validation among the paper's 5-15, docs/reproduced.md)
    # ---------------------------------------------------------------- global term
    train_global_head: bool = False  # a trainable linear head on the pooled embeddings
    global_loss: OTCLIPLoss = "infonce"  # OT-CLIP loss kind (otviz.train.otclip_losses)
    # ---------------------------------------------------------------- run control
    out: str = "runs/method-head"  # run directory: head/ (the method) and state/ (resume)
    resume: bool = True  # continue from out/state when it exists
    checkpoint_every: NonNegativeInt = 0  # steps between resume checkpoints (0: each epoch's end)
    log_every: Count = 10  # steps between log lines
    threads: Count = 2  # torch CPU threads per process
    device: str = "auto"  # "auto" (the local GPU under torchrun if any), "cpu", "cuda"

    def method_config(self) -> MethodConfig:
        """The :class:`MethodConfig` of the trained method: the shared solver fields, then
        the method's own (:meth:`otviz.methods.base.AlignmentMethod.train_settings`, e.g.
        QC-Align's ``eps``, the PowerCLIP settings in ``extra``)."""
        from otviz.methods.base import MethodConfig, method_class

        shared = MethodConfig(
            concept_dim=self.concept_dim,
            eps=self.eps,
            tau_v=self.tau_v,
            tau_t=self.tau_t,
            n_iters=self.n_iters,
            rank=self.rank,
            kpp_reg=self.kpp_reg,
            lowrank_variant=self.lowrank_variant,
            trainable=True,
            start=self.start,
            start_rank=self.start_rank,
        )
        return dataclasses.replace(shared, **method_class(self.method).train_settings(self))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``TypeError``."""
        return cls(**values)

    def resume_conflicts(self, saved: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """Fields that differ from a saved run's config and would change its loss curve:
        ``{field: (saved, now)}``."""
        now = self.to_dict()
        default = type(self)().to_dict()  # fields added after a run was saved: their default
        return {
            k: (saved.get(k, default[k]), v)
            for k, v in now.items()
            if k not in RESUMABLE_CHANGES and saved.get(k, default[k]) != v
        }


def paper_recipe(config: TrainConfig) -> TrainConfig:
    """``config`` with ConceptOT's recipe (Table 6): lr 1e-4, weight decay 1e-2, batch 64,
    5 % warm-up, gradient clipping 1.0, and the paper's number of steps, ``epochs x
    (100K pairs / 64)`` (3 epochs, 4,686 steps, for the transport methods, 8 epochs,
    12,496 steps, for the others), whatever ``n_train`` is (the world's pairs are cycled).
    The fast default (``otviz train`` without it) trains 3 epochs of ``n_train`` pairs."""
    from otviz.methods.base import method_class

    epochs = method_class(config.method).paper_epochs
    batch = 64
    return dataclasses.replace(
        config, lr=1e-4, weight_decay=1e-2, batch_size=batch, warmup_frac=0.05, grad_clip=1.0,
        epochs=epochs, max_steps=epochs * (PAPER_TRAIN_PAIRS // batch),
    )
