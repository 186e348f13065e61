"""ResCLIP's semantic feedback refinement (otviz/towers/resclip_sfr.py) against a reference
written here step by step from the authors' code (yvhangyang/ResCLIP ``clip/model.py``
L106-127 the patch labels, L131-235 the refinement matrix, L473-494 the refined attention),
with explicit loops for the labels, the path check and the row smoothing and explicit
q / k / v matmuls for the last block: on a random open_clip ViT-B/16 and a random 12-block
timm ViT, in float64."""

from __future__ import annotations

from collections import Counter

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F

from otviz.errors import UserInputError
from otviz.towers import image_tower
from otviz.towers.resclip_sfr import (
    ClassSet,
    SfrSettings,
    encode_with_classes,
    feedback_matrix,
)
from otviz.towers.sources import FeatureSource, parse_feature_source
from otviz.towers.timm_tower import TimmTower
from otviz.towers.vit import VitTower
from tests.towers.conftest import shrunk_backbone
from tests.towers.test_feature_sources import (
    LAMBDA,
    TAU,
    cross_correlation,
    gaussian_omega,
    heads,
    merge,
    open_clip_blocks,
    open_clip_qk,
    open_clip_reference,
    timm_blocks,
    timm_qk,
    timm_reference,
)

RCS = "resclip-rcs"
PICKED = (0, 37, 90, 150, 195)  # patches whose first-pass features serve as the classes


# ----------------------------------------------------------------- the reference
def reference_labels(features, classes, grid, size, threshold) -> list[list[int]]:
    """Each patch's label: cosine logits resized bilinearly to the image, softmax(40 x) over
    the classes, each pixel's argmax (0 below ``threshold``), then the patch's most frequent
    pixel label counted pixel by pixel (ties: the smallest)."""
    h, w = grid
    f = features[0] / features[0].norm(dim=-1, keepdim=True)
    c = classes / classes.norm(dim=-1, keepdim=True)
    logits = (f @ c.T).T.reshape(1, -1, h, w)
    probs = torch.softmax(40 * F.interpolate(logits, size=size, mode="bilinear",
                                             align_corners=False)[0], dim=0)
    top, label = probs.max(dim=0)
    label[top < threshold] = 0
    ph, pw = size[0] // h, size[1] // w
    out = []
    for r in range(h):
        row = []
        for col in range(w):
            counts = Counter(label[r * ph:(r + 1) * ph, col * pw:(col + 1) * pw].flatten().tolist())
            most = max(counts.values())
            row.append(min(lab for lab, n in counts.items() if n == most))
        out.append(row)
    return out


def reference_feedback(labels: list[list[int]], sigma: float, same_entity: bool):
    """``S`` pair by pair: 1 for a shared label; a pair whose sampled points from ``i`` (the
    first ``c + 1`` of ``c_max + 1`` evenly spaced in [0, 1], float32, rounded) leave ``i``'s
    label damped by ``exp(-c / c_max)``; rows smoothed by the 1-D Gaussian term by term, then
    divided by their sum plus 1e-8."""
    h, w = len(labels), len(labels[0])
    n = h * w
    pos = [(i // w, i % w) for i in range(n)]
    lab = [labels[r][c] for r, c in pos]
    steps = [[max(abs(pos[i][0] - pos[j][0]), abs(pos[i][1] - pos[j][1])) for j in range(n)]
             for i in range(n)]
    most = max(max(row) for row in steps)
    ts = [np.float32(t) for t in torch.linspace(0, 1, most + 1).tolist()]
    one = np.float32(1)
    s = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            if lab[i] != lab[j]:
                continue
            s[i, j] = 1.0
            if not same_entity:
                continue
            for m in range(steps[i][j] + 1):
                t = ts[m]
                r = int(np.round(np.float32(pos[i][0]) * (one - t) + np.float32(pos[j][0]) * t))
                c = int(np.round(np.float32(pos[i][1]) * (one - t) + np.float32(pos[j][1]) * t))
                if labels[r][c] != lab[i]:
                    s[i, j] = float(np.exp(-steps[i][j] / most))
                    break
    size = min(n, int(6 * sigma + 1))
    size = size if size % 2 else size + 1
    kernel = [np.exp(-((u - size // 2) ** 2) / (2 * sigma**2)) for u in range(size)]
    kernel = [k / sum(kernel) for k in kernel]
    smooth = torch.zeros(n, n, dtype=torch.float64)
    for u, weight in enumerate(kernel):
        shift = u - size // 2  # out[j] += kernel[u] * row[j + shift]
        lo, hi = max(0, -shift), min(n, n - shift)
        smooth[:, lo:hi] += weight * s[:, lo + shift:hi + shift]
    return smooth / (smooth.sum(dim=-1, keepdim=True) + 1e-8)


def refined_mixing(q, k, v, scale, grid, prefix, cross, s, settings: SfrSettings):
    """``merge(A v)`` with ``A = tau_rcs ((1 - l_rcs) softmax(tau_sfr ((1 - l_sfr) s k k^T
    + l_sfr S / max S) + Omega) + l_rcs R)``, ``S`` zero in the prefix rows and columns."""
    t = q.shape[-2]
    full = torch.zeros(t, t, dtype=torch.float64)
    full[prefix:, prefix:] = s / s.max()
    kk = scale * torch.einsum("bhtd,bhsd->bhts", k, k)
    logits = settings.tau * ((1 - settings.weight) * kk + settings.weight * full)
    a = torch.softmax(logits + gaussian_omega(grid, prefix), dim=-1)
    a = TAU * ((1 - LAMBDA) * a + LAMBDA * cross)
    return merge(a @ v)


def open_clip_resclip(visual, pixels, classes, settings):
    """``(labels, S, [1, N, E])`` ResCLIP on open_clip's ViT, written out."""
    blocks = open_clip_blocks(visual, pixels)
    d = visual.transformer.width
    n = visual.transformer.resblocks[0].attn.num_heads
    scale = (d // n) ** -0.5
    cross = cross_correlation(lambda layer, x: open_clip_qk(visual, layer, x), blocks, scale)
    x, grid = blocks[-2], tuple(visual.grid_size)
    first = open_clip_reference(RCS, visual, x, cross)
    labels = reference_labels(first, classes, grid, tuple(pixels.shape[-2:]), settings.threshold)
    s = reference_feedback(labels, settings.sigma, settings.same_entity)
    block = visual.transformer.resblocks[-1]
    y = F.layer_norm(x, (d,), block.ln_1.weight, block.ln_1.bias, block.ln_1.eps)
    wt, b = block.attn.in_proj_weight, block.attn.in_proj_bias
    q, k, v = (heads(y @ wt[i * d:(i + 1) * d].T + b[i * d:(i + 1) * d], n) for i in range(3))
    out = refined_mixing(q, k, v, scale, grid, 1, cross, s, settings)
    out = out @ block.attn.out_proj.weight.T + block.attn.out_proj.bias
    ln = visual.ln_post
    return labels, s, F.layer_norm(out, (d,), ln.weight, ln.bias, ln.eps)[:, 1:] @ visual.proj


def timm_resclip(visual, pixels, classes, settings):
    """The same on a timm ViT (fused ``qkv``, ``proj``, layer scale, the trunk's norm and the
    tower's per-position head)."""
    trunk = visual.trunk
    blocks = timm_blocks(trunk, pixels)
    block = trunk.blocks[-1]
    d, n = blocks[0].shape[-1], block.attn.num_heads
    scale = (d // n) ** -0.5
    cross = cross_correlation(lambda layer, x: timm_qk(trunk, layer, x), blocks, scale)
    x, grid = blocks[-2], tuple(trunk.patch_embed.grid_size)
    prefix = x.shape[1] - grid[0] * grid[1]
    first = timm_reference(RCS, visual, x, cross)
    labels = reference_labels(first, classes, grid, tuple(pixels.shape[-2:]), settings.threshold)
    s = reference_feedback(labels, settings.sigma, settings.same_entity)
    qkv = block.norm1(x) @ block.attn.qkv.weight.T + block.attn.qkv.bias
    q, k, v = (heads(z, n) for z in qkv.split(d, dim=-1))
    out = refined_mixing(q, k, v, scale, grid, prefix, cross, s, settings)
    out = block.ls1(out @ block.attn.proj.weight.T + block.attn.proj.bias)
    return labels, s, TimmTower(visual).project(trunk.norm(out)[:, prefix:])


def picked_classes(tower, pixels) -> torch.Tensor:
    """Classes that split the image: the ``resclip-rcs`` features of a few patches."""
    patches, _ = tower.encode(pixels, FeatureSource(RCS))
    return tower.project(patches)[0, list(PICKED)]


# ----------------------------------------------------------------- the tests
@pytest.mark.slow
@pytest.mark.parametrize("family", ["open_clip ViT-B/16", "timm ViT (12 blocks)"])
def test_resclip_with_a_class_set_is_the_authors_steps(vit_b16_f64, deep_timm_vit, family):
    model, pixels = vit_b16_f64 if family.startswith("open_clip") else deep_timm_vit
    tower = image_tower(model)
    reference = open_clip_resclip if family.startswith("open_clip") else timm_resclip
    settings = SfrSettings(threshold=0.3)
    with torch.no_grad():
        classes = picked_classes(tower, pixels)
        labels, s, expected = reference(model.visual, pixels, classes, settings)
        ours = tower.project(encode_with_classes(tower, pixels, classes, settings))
        ours_s = feedback_matrix(torch.tensor([labels]), settings.sigma, settings.same_entity)
    assert len(set(sum(labels, []))) >= 3  # the first segmentation splits the image ...
    assert not torch.allclose(s, reference_feedback(labels, settings.sigma, False))  # damped
    assert torch.allclose(ours_s[0], s, atol=1e-12, rtol=0)
    assert ours.shape == expected.shape
    assert torch.allclose(ours, expected, atol=1e-5, rtol=0)
    rcs, _ = tower.encode(pixels, FeatureSource(RCS))
    assert (ours - tower.project(rcs)).abs().max() > 1e-3  # ... and the refinement moves it
    with torch.no_grad():  # the reading's class set (Backbone.with_features classes=) alike
        read, read_pooled = ClassSet.of(classes, settings).encode(tower, pixels)
        _, pooled = tower.encode(pixels, FeatureSource(RCS))
    assert torch.equal(tower.project(read), ours) and torch.equal(read_pooled, pooled)


def test_the_path_check_damps_same_label_pairs_split_by_another_label():
    """Two bands of label 0 split by a row of label 1 on a 5 x 5 grid, smoothing of one
    tap (sigma 0.1: 6 sigma + 1 < 2): from patch (0, 0), patch (4, 4) across the split is
    damped by exp(-4 / 4) against patch (1, 4) on its own side, patch (3, 0) by
    exp(-3 / 4), the other label's patches are 0; the whole matrix equals the reference."""
    labels = torch.zeros(1, 5, 5, dtype=torch.long)
    labels[0, 2] = 1
    s = feedback_matrix(labels, sigma=0.1, same_entity=True)[0]
    assert torch.allclose(s, reference_feedback(labels[0].tolist(), 0.1, True), atol=1e-12, rtol=0)
    row = s[0] / s[0, 1 * 5 + 4]  # patch (0, 0)'s entries, undamped ones at 1
    assert torch.isclose(row[4 * 5 + 4], torch.tensor(np.exp(-1.0), dtype=torch.float64))
    assert torch.isclose(row[3 * 5 + 0], torch.tensor(np.exp(-0.75), dtype=torch.float64))
    assert torch.equal(row[2 * 5:3 * 5], torch.zeros(5, dtype=torch.float64))
    kept = feedback_matrix(labels, sigma=0.1, same_entity=False)[0]
    assert torch.isclose(kept[0, 24], kept[0, 9])  # without the check: no damping


@pytest.mark.slow
@pytest.mark.slow
def test_the_refinement_matrix_of_blob_labels_is_the_reference():
    """Four random blobs on a 14 x 14 grid (a smoothed random field's argmax), sigma 5
    and 2, with and without the path check."""
    field = torch.randn(1, 4, 14, 14, generator=torch.Generator().manual_seed(3))
    labels = F.avg_pool2d(field, 5, stride=1, padding=2, count_include_pad=False).argmax(1)
    assert len(labels.unique()) == 4
    for sigma in (5.0, 2.0):
        for check in (True, False):
            ours = feedback_matrix(labels, sigma, check)[0]
            ref = reference_feedback(labels[0].tolist(), sigma, check)
            assert torch.allclose(ours, ref, atol=1e-12, rtol=0)


@pytest.mark.slow
def test_weight_zero_and_tau_one_is_resclip_rcs_exactly(vit_b16_f64, deep_timm_vit):
    for model, pixels in (vit_b16_f64, deep_timm_vit):
        tower = image_tower(model)
        with torch.no_grad():
            classes = picked_classes(tower, pixels)
            ours = encode_with_classes(tower, pixels, classes, SfrSettings(tau=1.0, weight=0.0))
            rcs, _ = tower.encode(pixels, FeatureSource(RCS))
        assert torch.equal(ours, rcs)


@pytest.mark.slow
def test_one_class_gives_an_image_free_feedback_and_ignores_which_class(vit_b16_f64):
    """With one class every patch shares label 0: ``S`` is the same for any image and any
    class embedding (so the features do not depend on the class's text), yet the refined
    attention is not ``resclip-rcs``'s (tau_sfr and the smoothed rows' ends)."""
    model, pixels = vit_b16_f64
    tower = VitTower(model.visual)
    gen = torch.Generator().manual_seed(7)
    one, other = torch.randn(2, 1, tower.embed_dim, generator=gen).double()
    with torch.no_grad():
        a = encode_with_classes(tower, pixels, one)
        b = encode_with_classes(tower, pixels, other)
        rcs, _ = tower.encode(pixels, FeatureSource(RCS))
    assert torch.equal(a, b)
    assert (a - rcs).abs().max() > 1e-3
    uniform = reference_feedback([[0] * 14 for _ in range(14)], 5.0, True)
    assert torch.allclose(feedback_matrix(torch.zeros(1, 14, 14, dtype=torch.long))[0], uniform,
                          atol=1e-12, rtol=0)


def test_towers_without_rcs_and_bad_class_sets_or_settings_are_refused(tmp_path):
    backbone = shrunk_backbone("ViT-B-32", tmp_path, seed=0)  # two blocks: no blocks 5-8
    tower = backbone.image_tower
    pixels = torch.zeros(1, 3, *tower.image_size)
    classes = torch.randn(3, tower.embed_dim)
    with pytest.raises(UserInputError, match="cannot give resclip-rcs .*needs 10 blocks"):
        encode_with_classes(tower, pixels, classes)
    resnet = shrunk_backbone("RN50", tmp_path, seed=0)
    with pytest.raises(UserInputError, match="cannot give resclip-rcs"):
        encode_with_classes(resnet.image_tower, pixels, classes)
    deep = VitTower(open_clip.create_model("ViT-B-16", pretrained=None).visual)
    for bad in (torch.randn(3, 7), torch.randn(512), torch.zeros(0, 512),
                torch.full((2, 512), float("nan")), [[0.0] * 512]):
        with pytest.raises(UserInputError, match="resclip classes"):
            encode_with_classes(deep, torch.zeros(1, 3, 224, 224), bad)
    for where in (parse_feature_source, backbone.with_features):
        with pytest.raises(UserInputError, match="resclip .*needs a fixed class set.*resclip-rcs"):
            where("resclip")
    for knobs in ({"tau": 0.0}, {"weight": 1.5}, {"threshold": -0.1}, {"sigma": float("inf")},
                  {"tau": "2"}, {"same_entity": 1}):
        with pytest.raises(UserInputError, match="resclip"):
            SfrSettings(**knobs)
