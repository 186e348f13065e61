"""The dense last-block paths, as their papers rewrite the last transformer block: the
token mixing (which attention replaces ``softmax(q k^T / sqrt(d))``) and which of the
block's other terms stay. Shared by every transformer tower family (:mod:`.vit`,
:mod:`.timm_tower`); each family supplies its own ``q, k, v`` and its block's terms.

With ``q, k, v`` ``[B, heads, T, d]`` the per-head queries, keys and values of the last
block (after its first norm), ``s = d^-1/2`` the block's own attention scale:

* MaskCLIP (Zhou et al., ECCV 2022, Sec. 3.2): ``A = I`` (each token reads its own value);
  no residual, no feed-forward.
* SCLIP (Wang et al., 2023, its correlative self-attention):
  ``A = softmax(s q q^T) + softmax(s k k^T)``; the block's residual and feed-forward kept
  (as the authors' code runs it).
* ClearCLIP (Lan et al., ECCV 2024, its q-q attention): ``A = softmax(s q q^T)``; no residual,
  no feed-forward.
* NACLIP (Hajimiri et al., WACV 2025, neighbourhood attention in its "reduced"
  architecture):
  ``A = softmax(s k k^T + Omega)`` with ``Omega[p, p'] = exp(-|pos_p - pos_p'|^2 /
  (2 sigma^2))`` a Gaussian of the two patches' grid distance (sigma = 5 patches, the
  authors' default; zero for prefix tokens); no residual, no feed-forward.

The equations are the papers'; which terms each keeps (residual, feed-forward, scale, the
Gaussian added to the logits) was checked against the authors' code.

The block's output on every path is ``out_proj(A v)`` through the block's own layer scale
(its attention-branch terms), plus the residual and feed-forward where the path keeps them;
the tower's final norm and projection then read it as they read the last block.
Receptive field: every path keeps each token centred on its grid cell (the token grid and
the token geometry are unchanged; tests/towers/test_token_geometry_families.py measures
it). MaskCLIP's token reads only its own input token in the last block, NACLIP's adds a
bias toward the neighbourhood, the others mix the whole image as the last block does.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: NACLIP's Gaussian standard deviation, in patches (the paper's and the authors' default).
NACLIP_SIGMA = 5.0
#: The paths that keep the last block's residual and feed-forward (SCLIP).
KEEPS_RESIDUAL = frozenset({"sclip"})
#: The paths whose mixing reads ``q`` or ``k`` (all but MaskCLIP's identity).
READS_QUERIES_OR_KEYS = frozenset({"sclip", "clearclip", "naclip"})


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
                    ) -> Tensor:
    """``[B, heads, T, T]`` the path's ``A`` (module docstring) for per-head ``q, k``
    ``[B, heads, T, d]``; the patches are the last ``h * w`` tokens of ``T``."""
    if kind == "maskclip":
        eye = torch.eye(q.shape[-2], dtype=q.dtype, device=q.device)
        return eye.expand(*q.shape[:-2], -1, -1)
    if kind == "sclip":
        a = (torch.softmax(scale * q @ q.transpose(-1, -2), dim=-1)
             + torch.softmax(scale * k @ k.transpose(-1, -2), dim=-1))
    elif kind == "clearclip":
        a = torch.softmax(scale * q @ q.transpose(-1, -2), dim=-1)
    elif kind == "naclip":
        omega = neighbourhood_bias(grid, q.shape[-2] - grid[0] * grid[1]).to(k)
        a = torch.softmax(scale * k @ k.transpose(-1, -2) + omega, dim=-1)
    else:
        raise ValueError(f"no dense path {kind!r}")
    return a
