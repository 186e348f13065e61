"""The dense last-block paths, as their papers rewrite the last transformer block: the
token mixing (which attention replaces ``softmax(q k^T / sqrt(d))``) and which of the
block's other terms stay. Shared by every transformer tower family (:mod:`.vit`,
:mod:`.timm_tower`); each family supplies its own ``q, k, v`` and its block's terms, read
from the model's current parameters at every call (no copy, no hook).

With ``q, k, v`` ``[B, heads, T, d]`` the per-head queries, keys and values of the last
block (after its first norm), ``s = d^-1/2`` the block's own attention scale, and each
path's terms as the authors' code computes them (repository, file, lines):

* MaskCLIP (Zhou et al., ECCV 2022, Sec. 3.2): ``A = I`` (each token reads its own value);
  the block's residual and feed-forward kept. chongzhou96/MaskCLIP,
  ``mmseg/models/backbones/vit.py`` L96-104 (the last layer with ``return_qkv``:
  ``v = out_proj(v_proj(norm1(x)))``, ``v += x``, ``v = ffn(norm2(v), identity=v)``),
  L434-437 (the final norm on ``v``); ``mmseg/models/decode_heads/maskclip_head.py``
  L80 (the projection ``proj(v)``).
* SCLIP (Wang et al., 2023, its correlative self-attention):
  ``A = softmax(s q q^T) + softmax(s k k^T)``; the residual and feed-forward kept.
  wangf3014/SCLIP, ``clip/model.py`` L249-251 (``x = x + custom_attn(...)``,
  ``x = x + mlp(ln_2(x))``), L295-298 (the two softmaxes).
* ClearCLIP (Lan et al., ECCV 2024, its q-q attention): ``A = softmax(s q q^T)``; no
  residual, no feed-forward. mc-lan/ClearCLIP, ``open_clip/transformer.py`` L525-526
  (``ignore_residual``: ``output += custom_attn(...)``), L614-617 (q-q), L620
  (``out_proj``); ``configs/base_config.py`` L7 (``ignore_residual=True``).
* NACLIP (Hajimiri et al., WACV 2025, neighbourhood attention in its "reduced"
  architecture):
  ``A = softmax(s k k^T + Omega)`` with ``Omega[p, p'] = exp(-|pos_p - pos_p'|^2 /
  (2 sigma^2))`` a Gaussian of the two patches' grid distance (sigma = 5 patches, the
  authors' default; zero for prefix tokens); no residual, no feed-forward.
  sinahmr/NACLIP, ``clip/model.py`` L118-119 (``reduced``: ``x = custom_attn(...)``),
  L154-177 (the window and its addition), L198-207 (``k k^T`` plus ``Omega``);
  ``naclip.py`` L21 (``gaussian_std=5.``).

* ResCLIP's residual cross-correlation self-attention, RCS (Yang et al., CVPR 2025), on
  its default NACLIP-style last block (``resclip-rcs``): ``A = tau ((1 - lambda)
  softmax(s k k^T + Omega) + lambda R)`` with ``R`` the mean over blocks 5-8 (from 0) of the
  blocks' own cross-correlation attention ``softmax(s q_l k_l^T)`` (per head, the same
  forward), ``tau = 2``, ``lambda = 0.3``; no residual, no feed-forward.
  yvhangyang/ResCLIP, ``clip/model.py`` L317-330 (the intermediate maps and their mean over
  ``range(5, 9)``), L590-592 (those maps: the vanilla softmax), L473-494 (``k k^T`` plus
  ``Omega``, softmax, then the RCS mix), L356-360 (``wo_resi``: ``x = custom_attn(...)``);
  ``resclip_segmentor.py`` L24 (``arch='wo_resi'``, ``gaussian_std=5.``);
  ``configs/cfg_voc21.py`` L10 (``attn_rcs_weights=[2.0, 0.3]``; ADE20K and Context60 use
  the same, the other sets ``lambda`` 0.2-0.6). Its semantic feedback refinement (SFR,
  L334-346), which reweights the ``k k^T`` logits by a first segmentation against the data
  set's class names, is not part of this source (a feature source sees no text, hence the
  name); given a fixed class set it is :mod:`otviz.towers.resclip_sfr`
  (``feedback`` here; :meth:`otviz.towers.base.ImageTower.encode_with_classes`). A tower of
  fewer than 10 blocks cannot give it.

* SC-CLIP (Bai et al., 2024, ``scclip``): the last block's attention ``A = (softmax(3 (M -
  mean M)) + softmax(s k k^T)) / 2`` with ``M`` block 8's patch similarities, on anomaly-
  resolved, similarity-aggregated patch tokens, plus a fused pass of blocks 3-9
  (:mod:`otviz.towers.scclip`, where the authors' lines are cited).

(MaskCLIP's identity attention without the residual and feed-forward is ClearCLIP's
``model_type='MaskCLIP'`` under its ``ignore_residual=True`` ablation, ``transformer.py``
L604-609, not MaskCLIP's own path; otviz does not offer it.)

The block's attention branch on every path is ``out_proj(A v)`` through the block's own
layer scale; the block's output is that branch alone, or, where the path keeps them,
``x + branch`` followed by the block's feed-forward with its residual
(:func:`rewritten_block`); the tower's final norm and projection then read it as they
read the last block.
Receptive field: the token grid and the stated token geometry are the same on every path;
tests/towers/test_token_geometry_families.py measures each token's centre on the paths of
the last block alone (MaskCLIP, SCLIP, ClearCLIP, NACLIP) on two-block towers. MaskCLIP's
token reads only its own input token in the last block's attention, NACLIP's (and ResCLIP's
first term) adds a bias toward the neighbourhood, the others mix the whole image as the last
block does. ResCLIP's and SC-CLIP's centres are not measured (they need 10 and 11 blocks):
ResCLIP's intermediate attention and SC-CLIP's similarity aggregation mix tokens of similar
content wherever they lie, so a token's centre may move toward its look-alikes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from otviz.towers.resclip_sfr import Feedback
from otviz.towers.scclip import DEPTH as SCCLIP_DEPTH
from otviz.towers.scclip import self_adjusting_attention

#: NACLIP's Gaussian standard deviation, in patches (the paper's and the authors' default).
NACLIP_SIGMA = 5.0
#: The paths that keep the last block's residual and feed-forward (MaskCLIP, SCLIP).
KEEPS_RESIDUAL = frozenset({"maskclip", "sclip"})
#: ResCLIP's RCS: the blocks (from 0) whose cross-correlation attention ``R`` averages, the
#: scale ``tau`` and the weight ``lambda`` of ``R`` (the authors' code and VOC / ADE configs).
RESCLIP_LAYERS = (5, 6, 7, 8)
RESCLIP_TAU, RESCLIP_LAMBDA = 2.0, 0.3
#: The paths that read intermediate blocks, and the fewest blocks they need.
READS_INTERMEDIATE = {"resclip-rcs": max(RESCLIP_LAYERS) + 2, "scclip": SCCLIP_DEPTH}


def fits(kind: str, depth: int) -> bool:
    """Whether a tower of ``depth`` blocks has the intermediate blocks the path ``kind``
    reads (every path but ResCLIP's reads the last block alone)."""
    return depth >= READS_INTERMEDIATE.get(kind, 0)


def softmax_attention(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """``[B, heads, T, T]`` a block's own attention ``softmax(s q k^T)``."""
    return torch.softmax(scale * q @ k.transpose(-1, -2), dim=-1)


def rewritten_block(kind: str, x: Tensor, branch: Tensor,
                    feed_forward: Callable[[Tensor], Tensor]) -> Tensor:
    """The last block's output on the path ``kind`` for its input tokens ``x`` and its
    rewritten attention branch: ``branch`` alone, or ``z + feed_forward(z)`` with
    ``z = x + branch`` where the path keeps the residual and feed-forward
    (:data:`KEEPS_RESIDUAL`; ``feed_forward`` the block's own, norm and layer scale
    included)."""
    if kind not in KEEPS_RESIDUAL:
        return branch
    z = x + branch
    return z + feed_forward(z)


def neighbourhood_bias(grid: tuple[int, int], prefix: int, sigma: float = NACLIP_SIGMA,
                       ) -> Tensor:
    """``[T, T]`` NACLIP's neighbourhood term ``Omega``: ``exp(-|pos_p - pos_p'|^2 / (2 sigma^2))``
    between patches at grid positions ``pos`` (row-major, after ``prefix`` prefix tokens),
    zero in the prefix tokens' rows and columns."""
    h, w = grid
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], dim=-1).double()
    gauss = torch.exp(-torch.cdist(pos, pos) ** 2 / (2 * sigma**2))
    omega = torch.zeros(prefix + h * w, prefix + h * w, dtype=torch.float64)
    omega[prefix:, prefix:] = gauss
    return omega


def dense_attention(kind: str, q: Tensor, k: Tensor, scale: float, grid: tuple[int, int],
                    cross: Tensor | None = None, feedback: Feedback | None = None) -> Tensor:
    """``[B, heads, T, T]`` the path's ``A`` (module docstring) for per-head ``q, k``
    ``[B, heads, T, d]``; the patches are the last ``h * w`` tokens of ``T``; ``cross`` the
    mean intermediate attention ``R`` that ResCLIP's RCS reads, or SC-CLIP's block-8
    similarities ``M`` ``[B, T, T]`` (``None`` for the others); ``feedback`` ResCLIP's SFR
    on ``resclip-rcs``'s ``s k k^T`` before ``Omega`` and the softmax
    (:meth:`otviz.towers.resclip_sfr.Feedback.refined_logits`). MaskCLIP's
    ``A = I`` is not built here: each family reads its value path (open_clip:
    :func:`otviz.towers.vit.value_path`; timm: the block under a self-only mask)."""
    if feedback is not None and kind != "resclip-rcs":
        raise ValueError(f"ResCLIP's feedback refines resclip-rcs, not {kind!r}")
    if kind == "sclip":
        a = (torch.softmax(scale * q @ q.transpose(-1, -2), dim=-1)
             + torch.softmax(scale * k @ k.transpose(-1, -2), dim=-1))
    elif kind == "clearclip":
        a = torch.softmax(scale * q @ q.transpose(-1, -2), dim=-1)
    elif kind in ("naclip", "resclip-rcs"):
        omega = neighbourhood_bias(grid, q.shape[-2] - grid[0] * grid[1]).to(k)
        logits = scale * k @ k.transpose(-1, -2)
        if feedback is not None:
            logits = feedback.refined_logits(logits)
        a = torch.softmax(logits + omega, dim=-1)
        if kind == "resclip-rcs":
            a = RESCLIP_TAU * ((1 - RESCLIP_LAMBDA) * a + RESCLIP_LAMBDA * cross)
    elif kind == "scclip":
        a = self_adjusting_attention(k, cross, scale)
    else:
        raise ValueError(f"no dense path {kind!r}")
    return a
