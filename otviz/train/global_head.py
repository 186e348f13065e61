"""The global contrastive term ``L_global`` of Eq. 10 (ConceptOT) on the pooled embeddings.

On a frozen backbone the pooled embeddings are fixed, so ``L_global`` is a constant: it is
computed and reported, and contributes no gradient. :class:`GlobalHead` makes it trainable:
two linear maps on the pooled image and text embeddings, initialised to the identity (the
run starts at the frozen model's global loss), and a learned logit scale initialised to the
backbone's; the loss is any member of the OT-CLIP family (OT-CLIP Eq. 5-10,
:func:`otviz.train.otclip_losses.otclip_loss`).
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from otviz.checkpoints.heads import load_global_head_state
from otviz.checkpoints.store import load_state_dict_strict
from otviz.train.otclip_losses import KINDS, otclip_loss

MAX_LOGIT_SCALE = 100.0  # CLIP's clamp of the learned logit scale


class GlobalHead(nn.Module):
    """Trainable global part: ``W_I g_I`` and ``W_T g_T`` (identity at start) and
    ``log s`` (CLIP's learned logit scale, clamped at 100).

    Args:
        dim: width E of the pooled embeddings.
        logit_scale: initial logit scale (the backbone's).
    """

    def __init__(self, dim: int, logit_scale: float) -> None:
        super().__init__()
        self.image = nn.Linear(dim, dim, bias=False)
        self.text = nn.Linear(dim, dim, bias=False)
        with torch.no_grad():
            self.image.weight.copy_(torch.eye(dim))
            self.text.weight.copy_(torch.eye(dim))
        self.log_scale = nn.Parameter(torch.tensor(math.log(logit_scale)))

    @property
    def logit_scale(self) -> Tensor:
        return self.log_scale.exp().clamp(max=MAX_LOGIT_SCALE)

    def forward(self, image_global: Tensor, text_global: Tensor) -> tuple[Tensor, Tensor]:
        """L2-normalised ``(image [B, E], text [B, E])`` embeddings."""
        return F.normalize(self.image(image_global), dim=-1), F.normalize(
            self.text(text_global), dim=-1
        )


def check_global_loss(kind: str) -> None:
    """Raise ``ValueError`` for a name that is not an OT-CLIP loss kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown global loss {kind!r}; known: {', '.join(KINDS)}")


def global_term(
    image_global: Tensor,
    text_global: Tensor,
    kind: str,
    logit_scale: float,
    head: GlobalHead | None,
) -> tuple[Tensor, Tensor]:
    """``(L_global, sim [B, B])`` of a batch of matched pairs.

    ``sim[i, j] = s_g(I_i, x_j)`` is the cosine of the (head-mapped) pooled embeddings,
    detached, for hard-negative mining (Alg. 2 lines 2-3 use one matrix for both). Without
    a head the loss is computed under ``no_grad`` at the fixed ``logit_scale``: a constant.
    """
    if head is None:
        with torch.no_grad():
            img = F.normalize(image_global, dim=-1)
            txt = F.normalize(text_global, dim=-1)
            return otclip_loss(img, txt, logit_scale, kind), img @ txt.T
    img, txt = head(image_global, text_global)
    return otclip_loss(img, txt, head.logit_scale, kind), (img @ txt.T).detach()


def load_global_head(path: str | os.PathLike) -> GlobalHead | None:
    """The trained global head stored with the method head at ``path``, in eval mode, or
    None when the run had none."""
    state = load_global_head_state(path)
    if state is None:
        return None
    dim, tensors = state
    head = GlobalHead(dim, 1.0)
    load_state_dict_strict(head, tensors)
    return head.eval()
