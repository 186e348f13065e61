"""ResCLIP's semantic feedback refinement, SFR (Yang et al., CVPR 2025, arXiv 2411.15851,
its SFR module; the terms below read off the authors' code), as pure functions of a first
segmentation against a fixed class set.

ResCLIP runs its RCS last block (:mod:`otviz.towers.dense`, ``resclip-rcs``) once, segments
the image against the data set's class names, and runs the last block again with its
``k k^T`` logits pulled toward "these two patches were labelled alike". With ``S`` the
refinement matrix (:func:`feedback_matrix`), ``s`` the block's scale, ``Omega`` NACLIP's
neighbourhood term and ``R`` RCS's intermediate attention, the refined attention is

    ``A = tau_rcs ((1 - lambda_rcs) softmax(tau_sfr ((1 - lambda_sfr) s k k^T
    + lambda_sfr S / max S) + Omega) + lambda_rcs R)``

(yvhangyang/ResCLIP, ``clip/model.py`` L473-494 for the ``resclip`` strategy; the SFR
weights ``attn_sfr_weights = [tau_sfr, lambda_sfr]``, ``[2.2, 0.7]`` in
``configs/cfg_voc21.py`` L11). ``S`` is built, as ``clip/model.py`` L334-346 calls it, from:

1. the first pass's patch features against the class embeddings: cosine logits, resized
   bilinearly to the image (``align_corners=False``), ``softmax(40 logits)`` over the
   classes, each pixel's argmax, class 0 where the top probability is below ``temp_thd``,
   then each patch's most frequent pixel label (``create_logit_temp`` L242-291,
   ``create_patch_matrix`` L106-127): :func:`patch_classes`;
2. ``S[i, j] = 1`` where patches ``i`` and ``j`` share a label; with ``delete_same_entity``
   such a pair whose straight line leaves the label is damped by ``exp(-c / c_max)``, ``c``
   the pair's Chebyshev distance (``check_path`` L131-149, L182-212); each row smoothed by
   a 1-D Gaussian over the row-major patch index (kernel ``min(N, 6 sigma + 1)`` made odd,
   zero padding) and divided by its sum plus 1e-8 (L214-235): :func:`feedback_matrix`.

Where otviz differs from that code: the authors' first segmentation is refined by PAMR (10
steps, dilations 8 and 16, L278-282) before the argmax; PAMR is not implemented here (not
done yet), so otviz's first labels are the plain argmax. The authors cast ``S / max S`` to
float16 (L478); otviz keeps the tower's dtype (float64 checks stay exact). ``max S`` is
taken per image (the authors run one image a batch). The path check samples, as
``check_path`` does, ``c + 1`` points spaced ``1 / c_max`` of the segment from ``i`` toward
``j`` (so a short pair's check covers the first ``c / c_max`` of its segment), in float32
as there.

As a reading, the class set is a frozen value, :class:`ClassSet` (embeddings, settings, a
digest that keys the features' identity), given to ``Backbone.with_features("resclip",
classes=...)``; ``otviz eval --dataset KIND:DIR --tables segmentation --features resclip``
builds it from the set's class names (:func:`otviz.eval.dataset_segmentation.class_set_reading`).

With ``lambda_sfr = 0`` and ``tau_sfr = 1`` the refined attention is ``resclip-rcs``'s
exactly; with one class every patch shares the label and ``S`` no longer depends on the
image, but the refined attention is still not ``resclip-rcs``'s (``tau_sfr`` scales the
logits and the smoothed rows are not constant at the grid's ends).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch
from torch import Tensor
from torch.nn import functional as F

from otviz.errors import UserInputError
from otviz.towers.sources import FeatureSource

#: The source both passes of ResCLIP run (SFR refines its last block the second time).
RCS = FeatureSource("resclip-rcs")
#: ResCLIP's ``logit_scale`` of its first segmentation (``resclip_segmentor.py`` L25).
FIRST_PASS_LOGIT_SCALE = 40.0


@dataclass(frozen=True)
class SfrSettings:
    """SFR's knobs, defaults from the authors' PASCAL VOC 21 config
    (``configs/cfg_voc21.py`` L8-11; ``resclip_segmentor.py`` L24 for ``sigma``):
    ``tau`` and ``weight`` are ``attn_sfr_weights`` (``tau_sfr``, ``lambda_sfr``),
    ``threshold`` ``temp_thd`` (a pixel below it takes class 0), ``sigma`` the row
    smoothing's ``gaussian_std`` in patches, ``same_entity`` ``delete_same_entity``. The
    other sets' configs: ADE20K 2.1 / 0.7 / 0.25, Context60 1.8 / 0.7 / 0.30, COCO-Object
    1.8 / 0.7 / 0.11."""

    tau: float = 2.2
    weight: float = 0.7
    threshold: float = 0.5
    sigma: float = 5.0
    same_entity: bool = True

    def __post_init__(self) -> None:
        for name in ("tau", "weight", "threshold", "sigma"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                    value):
                raise UserInputError(f"resclip {name}: {value!r} is not a finite number")
        if self.tau <= 0 or self.sigma <= 0:
            raise UserInputError("resclip tau and sigma: both must be positive")
        if not (0 <= self.weight <= 1 and 0 <= self.threshold <= 1):
            raise UserInputError("resclip weight and threshold: both must lie in [0, 1]")
        if not isinstance(self.same_entity, bool):
            raise UserInputError(f"resclip same_entity: {self.same_entity!r} is not True / False")


def patch_classes(features: Tensor, classes: Tensor, grid: tuple[int, int],
                  size: tuple[int, int], threshold: float) -> Tensor:
    """``[B, h, w]`` each patch's label (an index into ``classes``) from the first pass's
    projected patch features ``[B, h * w, E]`` and the class embeddings ``[C, E]``, at an
    image of ``size`` pixels (module docstring, step 1; PAMR not applied). Ties between
    labels in a patch go to the smallest index."""
    b, (h, w) = features.shape[0], grid
    logits = F.normalize(features, dim=-1) @ F.normalize(classes, dim=-1).T  # [B, N, C]
    logits = logits.transpose(1, 2).reshape(b, -1, h, w)
    logits = F.interpolate(logits, size=size, mode="bilinear", align_corners=False)
    probs = torch.softmax(FIRST_PASS_LOGIT_SCALE * logits, dim=1)
    top, label = probs.max(dim=1)
    label = torch.where(top < threshold, torch.zeros_like(label), label)
    ph, pw = size[0] // h, size[1] // w
    cells = label[:, :h * ph, :w * pw].reshape(b, h, ph, w, pw).transpose(2, 3)
    cells = cells.reshape(b, h * w, -1)
    counts = torch.zeros(b, h * w, classes.shape[0], dtype=torch.long, device=label.device)
    counts.scatter_add_(-1, cells, torch.ones_like(cells))
    return counts.argmax(-1).reshape(b, h, w)


def _straight_paths(labels: Tensor) -> tuple[Tensor, Tensor]:
    """``(inside [N, N] bool, steps [N, N])`` for one image's ``[h, w]`` labels: whether the
    points ``check_path`` samples from patch ``i`` toward patch ``j`` all carry ``i``'s label,
    and the pair's Chebyshev distance (module docstring, step 2)."""
    h, w = labels.shape
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos = torch.stack([rows.flatten(), cols.flatten()], dim=-1).to(labels.device)  # [N, 2]
    start, end = pos[:, None, :].float(), pos[None, :, :].float()
    steps = (pos[:, None, :] - pos[None, :, :]).abs().amax(-1)
    most = int(steps.max())
    flat, first = labels.flatten(), labels.flatten()[:, None]
    inside = torch.ones_like(steps, dtype=torch.bool)
    for m, t in enumerate(torch.linspace(0, 1, most + 1).tolist()):
        point = (start * (1 - t) + end * t).round().long()
        same = flat[point[..., 0] * w + point[..., 1]] == first
        inside &= same | (steps < m)
    return inside, steps


def feedback_matrix(labels: Tensor, sigma: float = 5.0, same_entity: bool = True) -> Tensor:
    """``[B, N, N]`` SFR's ``S`` between the ``N = h * w`` patches (row-major) from their
    labels ``[B, h, w]`` (module docstring, step 2; ``clip/model.py`` L152-235, the class
    token's zero row and column left to :func:`refined_logits`)."""
    b, h, w = labels.shape
    n = h * w
    size = min(n, int(6 * sigma + 1))
    size += 1 - size % 2
    offsets = torch.arange(size, dtype=torch.float64) - size // 2
    kernel = torch.exp(-offsets**2 / (2 * sigma**2))
    kernel = (kernel / kernel.sum()).to(device=labels.device)
    out = []
    for image in labels:
        flat = image.flatten()
        same = (flat[:, None] == flat[None, :]).double()
        if same_entity:
            inside, steps = _straight_paths(image)
            decay = torch.exp(-steps.double() / max(int(steps.max()), 1))
            same = torch.where(inside, same, same * decay)
        smooth = F.conv1d(same[:, None, :], kernel.view(1, 1, -1), padding=size // 2)[:, 0]
        out.append(smooth / (smooth.sum(-1, keepdim=True) + 1e-8))
    return torch.stack(out)


@dataclass(frozen=True)
class Feedback:
    """SFR's refinement of one batch: ``matrix`` ``[B, N, N]`` (:func:`feedback_matrix`)
    and the weights ``tau`` (``tau_sfr``) and ``weight`` (``lambda_sfr``)."""

    matrix: Tensor
    tau: float
    weight: float

    def refined_logits(self, logits: Tensor) -> Tensor:
        """``tau ((1 - weight) logits + weight S / max S)`` for the last block's ``s k k^T``
        ``[B, heads, T, T]``, the patches the last ``N`` tokens (``S`` zero in the prefix
        tokens' rows and columns; ``clip/model.py`` L474-486; Omega is added after)."""
        n = self.matrix.shape[-1]
        s = self.matrix / self.matrix.amax(dim=(-2, -1), keepdim=True)
        full = torch.zeros(*logits.shape[:1], *logits.shape[-2:], dtype=logits.dtype,
                           device=logits.device)
        full[:, -n:, -n:] = s.to(logits)
        return self.tau * ((1 - self.weight) * logits + self.weight * full[:, None])


class RcsTower(Protocol):
    """What :func:`encode_with_classes` reads of an image tower
    (:class:`otviz.towers.base.ImageTower`; ``resclip_patches`` on the open_clip and timm
    ViT families, the towers that give ``resclip-rcs``)."""

    @property
    def grid(self) -> tuple[int, int]: ...

    @property
    def embed_dim(self) -> int: ...

    def check_source(self, source: FeatureSource) -> FeatureSource: ...

    def project(self, patches: Tensor) -> Tensor: ...

    def resclip_patches(self, pixels: Tensor, feedback: Feedback | None) -> Tensor: ...


def check_classes(classes: object, dim: int) -> Tensor:
    """``classes`` as a ``[C, dim]`` tensor of finite class embeddings, ``C >= 1``;
    :class:`UserInputError` naming the class set otherwise."""
    if not isinstance(classes, Tensor) or classes.ndim != 2 or classes.shape[0] < 1 or (
            classes.shape[1] != dim):
        got = tuple(classes.shape) if isinstance(classes, Tensor) else type(classes).__name__
        raise UserInputError(
            f"resclip classes: expected one {dim}-d text embedding a class ([C, {dim}], C >= 1), "
            f"got {got}")
    if not classes.is_floating_point() or not torch.isfinite(classes).all():
        raise UserInputError("resclip classes: the class embeddings must be finite floats")
    return classes


def encode_with_classes(tower: RcsTower, pixels: Tensor, classes: Tensor,
                        settings: SfrSettings | None = None) -> Tensor:
    """``[B, N, width]`` ResCLIP (RCS and SFR) patch tokens of ``pixels`` for the fixed class
    set ``classes`` ``[C, E]`` (text embeddings in the tower's joint space): the ``resclip-rcs``
    pass, then :func:`refined_patches`. The tower runs twice (the authors' code runs blocks
    1-11 once). :class:`UserInputError` for a tower that cannot give ``resclip-rcs`` (the
    reason named) and for a malformed class set."""
    tower.check_source(RCS)
    classes = check_classes(classes, tower.embed_dim)
    return refined_patches(tower, pixels, tower.resclip_patches(pixels, None), classes,
                           settings or SfrSettings())


def refined_patches(tower: RcsTower, pixels: Tensor, first: Tensor, classes: Tensor,
                    settings: SfrSettings) -> Tensor:
    """``[B, N, width]`` the last block run again with SFR's refinement, from the first
    (``resclip-rcs``) pass's width patches ``first``: :func:`patch_classes` on their
    projections, :func:`feedback_matrix`, :meth:`Feedback.refined_logits`
    (``clip/model.py`` L334-360)."""
    projected = tower.project(first)
    labels = patch_classes(projected, classes.to(projected), tower.grid,
                           tuple(pixels.shape[-2:]), settings.threshold)
    matrix = feedback_matrix(labels, settings.sigma, settings.same_entity)
    return tower.resclip_patches(pixels, Feedback(matrix, settings.tau, settings.weight))


class EncodingTower(RcsTower, Protocol):
    """An :class:`RcsTower` that also encodes a source with its pooled embedding
    (:meth:`otviz.towers.base.ImageTower.encode`)."""

    def encode(self, pixels: Tensor, source: FeatureSource) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class ClassSet:
    """ResCLIP's fixed class set as part of a reading (``features resclip``,
    :meth:`otviz.backbone.Backbone.with_features` ``classes=``): the class embeddings
    ``[C, E]``, the SFR ``settings`` and ``digest``, a BLAKE2 hash of both (what the
    feature cache and the shard files are keyed on, :meth:`identity`). Build with
    :meth:`of`; two class sets are equal when their digests are."""

    embeddings: Tensor = field(compare=False, repr=False)
    settings: SfrSettings
    digest: str

    @classmethod
    def of(cls, embeddings: object, settings: SfrSettings | None = None) -> ClassSet:
        """The class set of ``embeddings`` (checked as :func:`check_classes` does, any
        width; a detached float64 CPU copy is kept, so later changes to the tensor passed
        never reach it)."""
        dim = embeddings.shape[-1] if isinstance(embeddings, Tensor) and embeddings.ndim else 0
        kept = check_classes(embeddings, dim).detach().to("cpu", torch.float64).clone()
        settings = settings or SfrSettings()
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{tuple(kept.shape)}\0{settings!r}\n".encode())
        h.update(kept.contiguous().numpy().tobytes())
        return cls(kept, settings, h.hexdigest())

    def identity(self) -> dict[str, object]:
        """What a feature identity records of this class set: its size, digest, settings."""
        return {"count": int(self.embeddings.shape[0]), "digest": self.digest,
                "sfr": asdict(self.settings)}

    def encode(self, tower: EncodingTower, pixels: Tensor) -> tuple[Tensor, Tensor]:
        """``(patches [B, N, width], pooled [B, E])``: ResCLIP's RCS + SFR patches of
        ``pixels`` for this class set and the tower's pooled embedding (the first pass is
        ``resclip-rcs`` through :meth:`encode`, so the pooled embedding comes with it);
        equal to :func:`encode_with_classes`."""
        first, pooled = tower.encode(pixels, RCS)
        classes = check_classes(self.embeddings, tower.embed_dim)
        return refined_patches(tower, pixels, first, classes, self.settings), pooled
