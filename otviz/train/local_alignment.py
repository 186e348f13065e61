"""A local alignment term for tiny-CLIP pre-training: FILIP's token-wise late interaction.

Global InfoNCE (OT-CLIP Eq. 3-4) only ever compares pooled embeddings, so nothing asks a
patch token to carry its object's words. FILIP (Yao et al., 2021, Sec. 3.1.1) replaces the
pooled similarity by a token-wise maximum over the patch tokens ``x^I_i`` of image ``i`` and
the caption tokens ``x^T_j`` of caption ``j`` (both L2-normalised, in the joint space):

* image->text (FILIP Eq. 4): ``s^I_{ij} = 1/n_1 sum_k max_r x^I_{i,k} . x^T_{j,r}``, the mean
  over patches of each patch's best caption token;
* text->image (FILIP Eq. 5): ``s^T_{ij} = 1/n_2 sum_r max_k x^I_{i,k} . x^T_{j,r}``, the mean
  over the caption's content tokens of each token's best patch (padding, start and end
  tokens excluded, as in FILIP);

and trains them with the same symmetric InfoNCE as the global term (FILIP Eq. 1-2): the
image->text loss on ``s^I``, the text->image loss on ``s^T``. Only image-caption pairs are
used (no boxes, no attribute labels). The patch and token features are those the
training-free methods read (``Backbone(space="projected")``: final LayerNorm, then the
model's own projections), so the term shapes exactly what their heatmaps see.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SOT_TOKEN, EOT_TOKEN = 49406, 49407
"""open_clip's start- and end-of-text ids (padding is 0)."""


def content_mask(ids: Tensor) -> Tensor:
    """``[B, L]`` bool: the caption's word tokens (not padding, start or end of text)."""
    return (ids != 0) & (ids != SOT_TOKEN) & (ids != EOT_TOKEN)


def encode_with_tokens(
    model: nn.Module, images: Tensor, ids: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(image_emb [B,E], text_emb [T,E], patches [B,N,E], tokens [T,L,E])``, all
    L2-normalised, differentiable: the global embeddings of ``model(images, ids)`` and the
    last block's patch and caption tokens after the final LayerNorm and the model's own
    projections (what :class:`otviz.backbone.Backbone` gives in its ``"projected"`` space)."""
    out = model.forward_intermediates(
        image=images, text=ids, image_indices=1, text_indices=1, normalize=True,
        normalize_intermediates=True, image_output_fmt="NLC",
    )
    patches = out["image_intermediates"][-1] @ model.visual.proj
    tokens = out["text_intermediates"][-1] @ model.text.text_projection
    return (out["image_features"], out["text_features"], F.normalize(patches, dim=-1),
            F.normalize(tokens, dim=-1))


def token_max_similarities(
    patches: Tensor, tokens: Tensor, token_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """FILIP's late-interaction similarities ``(s^I [B, T], s^T [B, T])`` (Eq. 4-5) between
    every image ``i`` (``patches [B, N, E]``) and every caption ``j`` (``tokens [T, L, E]``,
    content tokens ``token_mask [T, L]``; every caption needs at least one)."""
    keep = token_mask.any(0)  # drop positions that are padding in every caption
    tokens, token_mask = tokens[:, keep], token_mask[:, keep]
    sim = torch.einsum("ind,jmd->ijnm", patches, tokens)  # [B, T, N, M]
    valid = token_mask[None, :, None, :]
    best_token = sim.masked_fill(~valid, -torch.inf).amax(3)  # [B, T, N]
    image_to_text = best_token.mean(2)
    best_patch = sim.amax(2)  # [B, T, M]
    count = token_mask.sum(1).clamp_min(1)
    text_to_image = (best_patch * token_mask[None]).sum(2) / count[None]
    return image_to_text, text_to_image


def filip_loss(patches: Tensor, tokens: Tensor, token_mask: Tensor, logit_scale: Tensor) -> Tensor:
    """FILIP's symmetric contrastive loss (Eq. 1-2 on the similarities of Eq. 4-5) with the
    matched pairs on the diagonal: the image->text cross-entropy over ``logit_scale * s^I``
    and the text->image one over ``logit_scale * s^T``, averaged. Caption rows beyond the
    ``B`` images are extra negatives for image->text only (as in
    :func:`otviz.train.losses.infonce_loss`)."""
    n = patches.shape[0]
    s_image, s_text = token_max_similarities(patches, tokens, token_mask)
    target = torch.arange(n, device=patches.device)
    image_to_text = F.cross_entropy(logit_scale * s_image, target)
    text_to_image = F.cross_entropy(logit_scale * s_text[:, :n].T, target)
    return 0.5 * (image_to_text + text_to_image)
