"""The training losses: tiny-CLIP pre-training's global contrastive loss
(:func:`contrastive_loss`) and the training objective of a method head, Eq. 10 of ConceptOT
and its per-method variants (:class:`TrainObjective`).

Pre-training: CLIP's symmetric InfoNCE (OT-CLIP Eq. 3-4, :func:`infonce_loss`), with the
world's hard-negative captions as extra image->text negatives, or another member of
OT-CLIP's family (:func:`otviz.train.otclip_losses.otclip_loss`, Eq. 7-10); FILIP's
token-wise local term beside it lives in :mod:`otviz.train.local_alignment`.

Method heads:

``L = L_global + lambda * L_local + beta * method.regulariser() (+ R_A)`` where ``R_A`` is
the pull of ConceptOT's anchors toward the k-means anchors of a backbone start
(``anchor_pull``, :mod:`otviz.train.anchor_tether`) and ``L_local`` depends on the method
(:func:`local_objective`):

* ``local_contrastive`` (every patch-token method: Global+Patch, FILIP, Text-Attn, Balanced
  OT, Dense UOT, ConceptOT, and any new one): the bidirectional local contrastive loss of
  Eq. 9-10 over each positive and its K_h mined hard negatives per direction; all
  ``B + 2 B K_h`` pairs of a step go through the method in one batched call;
* ``qct`` (QC-Align): the batch mean of the Sinkhorn-divergence QCT loss over the positive
  pairs (``L = L_global + lambda L_QCT``, QC-Align's only local term; no negatives);
* ``powerset_triplet`` (PowerCLIP): the triplet loss ``Phi(S) + Phi(S^T)`` over the ``C x C``
  NLA similarities of the batch (Eq. 8-9, 16), over every in-batch negative (not mined;
  pairs sharing a caption or an image are no negatives), with the hinge averaged over the
  negatives (``powerset_negatives="all"``, the default) or on the hardest one (``"hardest"``,
  Eq. 9, which collapses on a frozen backbone: :func:`otviz.methods.powerclip.triplet_loss`);
* ``none`` (Global-only): no local scorer, only the global term (which needs a trainable
  global head to train anything).

Sharding (data parallel): every process holds the whole global batch of features (cheap,
cached) and mines on its full ``B x B`` score matrix, so the negatives are those of one
process; each process scores the pairs of its share of the positives. Each objective
returns ``local_part``, the process's share of ``L_local`` such that the shares sum to it;
the process loss weights it by the number of processes, and DistributedDataParallel's
gradient average then gives exactly the gradient of the one-process loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from otviz.errors import InputError
from otviz.methods.base import (
    LOCAL_CONTRASTIVE,
    NO_LOCAL,
    POWERSET_TRIPLET,
    QCT,
    AlignmentMethod,
    PairBatch,
    local_objective,
    method_class,
)
from otviz.train.anchor_tether import anchor_pull
from otviz.train.config import TrainConfig
from otviz.train.global_head import GlobalHead, global_term
from otviz.train.negatives import HardNegatives, mine_hard_negatives
from otviz.train.otclip_losses import otclip_loss


def infonce_loss(image_emb: Tensor, text_emb: Tensor, logit_scale: Tensor) -> Tensor:
    """Symmetric InfoNCE of CLIP (OT-CLIP Eq. 3-4) on L2-normalised embeddings, matched pairs
    on the diagonal: the mean of the image->text and text->image cross-entropies. Text rows
    beyond the B images are extra negatives for image->text only (NegCLIP's hard-negative
    captions)."""
    n = image_emb.shape[0]
    logits = logit_scale * image_emb @ text_emb.T  # [B, B + extra]
    target = torch.arange(n, device=logits.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits[:, :n].T, target))


def contrastive_loss(image_emb: Tensor, text_emb: Tensor, logit_scale: Tensor, kind: str) -> Tensor:
    """Pre-training's batch loss ``kind``: :func:`infonce_loss` for ``"infonce"``, any other
    kind from OT-CLIP's family (:func:`otviz.train.otclip_losses.otclip_loss`)."""
    if kind == "infonce":
        return infonce_loss(image_emb, text_emb, logit_scale)
    return otclip_loss(image_emb, text_emb, logit_scale, kind)


def local_weight(config: TrainConfig) -> float:
    """``lambda`` of the method's local term: the config field its class names
    (:attr:`AlignmentMethod.local_weight_field`; PowerCLIP's own, else ``lambda_local``)."""
    return float(getattr(config, method_class(config.method).local_weight_field))


def local_contrastive_loss(
    positive: Tensor,
    neg_text: Tensor,
    neg_image: Tensor,
    tau: float,
    text_valid: Tensor | None = None,
    image_valid: Tensor | None = None,
) -> Tensor:
    """Per-positive bidirectional local contrastive loss (ConceptOT Eq. 9 and its X->I twin),
    ``[B]``: ``(l_{I->X}(i) + l_{X->I}(i)) / 2`` with

    ``l_{I->X}(i) = -log e^{s(I_i, x_i)/tau} / (e^{s(I_i, x_i)/tau} + sum_{j in N_X(i)}
    e^{s(I_i, x_j)/tau})``.

    Its mean over the batch is ``(L^l_{I->X} + L^l_{X->I}) / 2`` of Eq. 10.

    Args:
        positive: ``[B]`` local scores ``s_l(I_i, x_i)``.
        neg_text: ``[B, K]`` scores ``s_l(I_i, x_j)``, ``j in N_X(i)``.
        neg_image: ``[B, K]`` scores ``s_l(I_j, x_i)``, ``j in N_I(i)``.
        tau: local temperature ``tau_l``.
        text_valid, image_valid: ``[B, K]`` bool masks of real negatives.
    """

    def one_way(neg: Tensor, valid: Tensor | None) -> Tensor:
        logits = torch.cat([positive[:, None], neg], dim=1) / tau
        if valid is not None:
            keep = torch.cat([torch.ones_like(valid[:, :1]), valid], dim=1)
            logits = logits.masked_fill(~keep, -torch.inf)
        return -F.log_softmax(logits, dim=1)[:, 0]

    return 0.5 * (one_way(neg_text, text_valid) + one_way(neg_image, image_valid))


def negative_pairs(rows: Tensor, neg: HardNegatives) -> tuple[Tensor, Tensor]:
    """``(image_idx, text_idx)`` of the ``S + 2 S K`` pairs scored for positives ``rows``:
    the positives, then each image with its K hard captions, then each caption with its K
    hard images (row-major), as indices into the batch."""
    k = neg.text.shape[1]
    rep = rows.repeat_interleave(k)
    image_idx = torch.cat([rows, rep, neg.image[rows].reshape(-1)])
    text_idx = torch.cat([rows, neg.text[rows].reshape(-1), rep])
    return image_idx, text_idx


def check_alignable(batch: PairBatch) -> None:
    """Refuse a training batch with a pair that has nothing to align (an all-False token or
    patch mask): its positive would be scored :data:`~otviz.methods.base.NO_ALIGNMENT` and
    its loss be of order ``1e30``, a step that wrecks the head rather than a datum; the
    boundary's caption rule (a letter or digit) keeps such pairs out of every loader, so
    one reaching here is a caller's batch, named by its rows."""
    empty = ~batch.token_mask.any(1) | ~batch.patch_mask.any(1)
    if bool(empty.any()):
        rows = empty.nonzero().flatten().tolist()
        raise InputError(f"training batch: pair(s) {rows[:8]} have no content token or no "
                         "patch (an all-False token_mask or patch_mask row): nothing to align")


@dataclass
class StepTerms:
    """Detached terms of one step on one process.

    ``local_part`` is this process's share of ``L_local`` (the shares sum to it);
    ``anchor_pull`` is ``R_A`` (weighted; zero without a pull)."""

    global_loss: Tensor
    local_part: Tensor
    regulariser: Tensor
    anchor_pull: Tensor


class TrainObjective(nn.Module):
    """The trainable parts (method head, optional global head) and the loss of a step.

    One ``forward`` computes a process's loss; wrapping this module in
    DistributedDataParallel synchronises the gradients of everything that trains.

    Args:
        method: the method head.
        config: the recipe (weights, temperatures, K_h, global loss kind).
        logit_scale: the backbone's logit scale (the frozen global term's temperature).
        head: optional trainable global head.
        world_size: number of processes sharing the global batch.
    """

    def __init__(
        self,
        method: AlignmentMethod,
        config: TrainConfig,
        logit_scale: float,
        head: GlobalHead | None = None,
        world_size: int = 1,
    ) -> None:
        super().__init__()
        self.method = method
        self.head = head
        self.config = config
        self.logit_scale = logit_scale
        self.world_size = world_size
        self.kind = local_objective(method.name)
        self.anchor_pull = anchor_pull(method, config)
        self._local: dict[str, Callable[[PairBatch, Tensor, Tensor, Tensor], Tensor]] = {
            LOCAL_CONTRASTIVE: self._local_contrastive,
            QCT: self._qct,
            POWERSET_TRIPLET: self._powerset_triplet,
            NO_LOCAL: lambda batch, sim, excluded, rows: sim.new_zeros(()),
        }

    def forward(
        self, batch: PairBatch, excluded: Tensor, rows: Tensor
    ) -> tuple[Tensor, StepTerms]:
        """Loss of this process and its detached terms.

        Args:
            batch: the whole global batch of B matched pairs.
            excluded: ``[B, B]`` pairs that are no negatives (:func:`positive_mask`).
            rows: this process's positives (indices into the batch).
        """
        cfg = self.config
        check_alignable(batch)
        g_loss, sim = global_term(
            batch.image_global, batch.text_global, cfg.global_loss, self.logit_scale, self.head
        )
        local_part = self._local[self.kind](batch, sim, excluded, rows)
        reg = self.method.regulariser()
        pull = (reg.new_zeros(()) if self.anchor_pull is None
                else self.anchor_pull(self.method.anchors))
        loss = (g_loss + local_weight(cfg) * self.world_size * local_part + cfg.beta * reg
                + pull)
        return loss, StepTerms(g_loss.detach(), local_part.detach(), reg.detach(),
                               pull.detach())

    # ------------------------------------------------------------------ local terms
    def _local_contrastive(
        self, batch: PairBatch, sim: Tensor, excluded: Tensor, rows: Tensor
    ) -> Tensor:
        """Eq. 9-10 over the positives ``rows``, their share of the batch mean."""
        neg = mine_hard_negatives(sim, self.config.hard_negatives, excluded)
        image_idx, text_idx = negative_pairs(rows, neg)
        scores = self.method(batch.index(image_idx, text_idx)).local_score
        s, k = rows.numel(), neg.text.shape[1]
        pos, neg_text, neg_image = scores.split([s, s * k, s * k])
        per_item = local_contrastive_loss(
            pos,
            neg_text.view(s, k),
            neg_image.view(s, k),
            self.config.tau_local,
            neg.text_valid[rows],
            neg.image_valid[rows],
        )
        return per_item.sum() / batch.size

    def _qct(self, batch: PairBatch, sim: Tensor, excluded: Tensor, rows: Tensor) -> Tensor:
        """QC-Align's ``L_QCT`` (mean over the batch's positive pairs), this share."""
        return self.method.qct_loss(batch.index(rows, rows)) * (rows.numel() / batch.size)

    def _powerset_triplet(
        self, batch: PairBatch, sim: Tensor, excluded: Tensor, rows: Tensor
    ) -> Tensor:
        """PowerCLIP's triplet loss over the whole ``C x C`` batch (Eq. 8-9, 16). It is cheap
        (region and phrase embeddings once per item), so every process computes all of it
        and takes ``1 / world_size`` as its share."""
        return self.method.powerset_loss(batch, excluded) / self.world_size
