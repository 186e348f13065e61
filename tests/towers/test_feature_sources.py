"""The feature sources (otviz/towers/sources.py, dense.py) against plain references written
here from the papers' equations, with explicit q / k / v matmuls on the blocks' weights: on a
random open_clip ViT-B/16 (full size) and a random timm ViT through open_clip (SigLIP's
family, shrunken); ``layer:K`` against the block's tokens through the tower's own final norm
and projection; larger inputs against open_clip's own resized model."""

from __future__ import annotations

import re

import open_clip
import pytest
import torch
import torch.nn.functional as F

from otviz.errors import UserInputError
from otviz.knobs import FEATURE_SOURCE_NAMES
from otviz.towers import image_tower
from otviz.towers.sources import FeatureSource, parse_feature_source
from otviz.towers.timm_tower import TimmTower
from otviz.towers.vit import VitTower, value_path
from tests.towers.conftest import shrunk_backbone

DENSE = ("maskclip", "sclip", "clearclip", "naclip")  # every ViT of two blocks or more
RESCLIP = "resclip-rcs"  # a ViT of ten blocks or more
SIGMA = 5.0  # NACLIP's Gaussian standard deviation (patches)
RCS_LAYERS, TAU, LAMBDA = (5, 6, 7, 8), 2.0, 0.3  # ResCLIP's RCS (authors' code, VOC config)


@pytest.fixture(scope="module")
def vit_b16(vit_b16_f64):
    """A random ViT-B/16 in float64, an input, and its blocks' tokens (model's own forward)."""
    model, pixels = vit_b16_f64
    with torch.no_grad():
        blocks = open_clip_blocks(model.visual, pixels)
    return model, pixels, blocks


@pytest.fixture(scope="module")
def timm_vit(tmp_path_factory):
    torch.set_num_threads(1)
    backbone = shrunk_backbone("ViT-B-16-SigLIP", tmp_path_factory.mktemp("hf"), seed=3)
    model = backbone.model.double().eval()
    size = image_tower(model).image_size
    pixels = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(2)).double()
    return model, pixels


# ----------------------------------------------------------------- the references
def gaussian_omega(grid: tuple[int, int], prefix: int) -> torch.Tensor:
    """NACLIP's Omega as the authors build it: a (2h-1) x (2w-1) Gaussian window
    of ``exp(-d^2 / (2 sigma^2))`` laid on each patch's one-hot map by a 'same' convolution;
    zero rows and columns for the prefix tokens."""
    h, w = grid
    dy = torch.arange(-(h - 1), h, dtype=torch.float64)
    dx = torch.arange(-(w - 1), w, dtype=torch.float64)
    window = torch.exp(-(dy[:, None] ** 2 + dx[None, :] ** 2) / (2 * SIGMA**2))
    one_hot = torch.eye(h * w, dtype=torch.float64).reshape(h * w, 1, h, w)
    spread = F.conv2d(one_hot, window[None, None], padding=(h - 1, w - 1)).reshape(h * w, h * w)
    omega = torch.zeros(prefix + h * w, prefix + h * w, dtype=torch.float64)
    omega[prefix:, prefix:] = spread
    return omega


def mixing(kind: str, q, k, scale: float, grid, prefix: int, cross=None) -> torch.Tensor:
    """``A`` of each paper: MaskCLIP I; SCLIP softmax(s qq^T) + softmax(s kk^T); ClearCLIP
    softmax(s qq^T); NACLIP softmax(s kk^T + Omega); ResCLIP's RCS tau ((1 - lambda)
    softmax(s kk^T + Omega) + lambda R), ``R`` = ``cross``."""
    if kind == "maskclip":
        return torch.eye(q.shape[-2], dtype=q.dtype).expand(*q.shape[:-2], -1, -1)
    qq = torch.softmax(scale * torch.einsum("bhtd,bhsd->bhts", q, q), dim=-1)
    kk = scale * torch.einsum("bhtd,bhsd->bhts", k, k)
    if kind == "sclip":
        return qq + torch.softmax(kk, dim=-1)
    if kind == "clearclip":
        return qq
    neighbourhood = torch.softmax(kk + gaussian_omega(grid, prefix), dim=-1)
    if kind == RESCLIP:
        return TAU * ((1 - LAMBDA) * neighbourhood + LAMBDA * cross)
    return neighbourhood


def cross_correlation(qk_of_block, inputs: list[torch.Tensor], scale: float) -> torch.Tensor:
    """ResCLIP's ``R``: the mean over blocks 5-8 of ``softmax(s q_l k_l^T)``, each block's
    own attention on the tokens entering it (``inputs[l]``); ``qk_of_block(l, x)`` gives
    that block's per-head ``q, k``."""
    maps = []
    for layer in RCS_LAYERS:
        q, k = qk_of_block(layer, inputs[layer])
        maps.append(torch.softmax(scale * torch.einsum("bhtd,bhsd->bhts", q, k), dim=-1))
    return sum(maps) / len(maps)


def heads(z: torch.Tensor, n: int) -> torch.Tensor:
    b, t, d = z.shape
    return z.reshape(b, t, n, d // n).permute(0, 2, 1, 3)


def merge(z: torch.Tensor) -> torch.Tensor:
    b, n, t, d = z.shape
    return z.permute(0, 2, 1, 3).reshape(b, t, n * d)


def open_clip_qk(visual, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    block = visual.transformer.resblocks[layer]
    d, n = x.shape[-1], block.attn.num_heads
    y = F.layer_norm(x, (d,), block.ln_1.weight, block.ln_1.bias, block.ln_1.eps)
    w, b = block.attn.in_proj_weight, block.attn.in_proj_bias
    return tuple(heads(y @ w[i * d:(i + 1) * d].T + b[i * d:(i + 1) * d], n) for i in range(2))


def open_clip_reference(kind: str, visual, x: torch.Tensor, cross=None) -> torch.Tensor:
    """``[B, N, E]`` the last block rewritten as ``kind`` on the tokens ``x`` entering it,
    then ``ln_post`` and ``proj`` (MaskCLIP and SCLIP keep the residual and the
    feed-forward)."""
    block = visual.transformer.resblocks[-1]
    attn = block.attn
    d, n = x.shape[-1], attn.num_heads
    y = F.layer_norm(x, (d,), block.ln_1.weight, block.ln_1.bias, block.ln_1.eps)
    w, b = attn.in_proj_weight, attn.in_proj_bias
    q, k, v = (heads(y @ w[i * d:(i + 1) * d].T + b[i * d:(i + 1) * d], n) for i in range(3))
    grid = tuple(visual.grid_size)
    a = mixing(kind, q, k, (d // n) ** -0.5, grid, 1, cross)
    out = merge(a @ v) @ attn.out_proj.weight.T + attn.out_proj.bias
    if kind in ("maskclip", "sclip"):
        z = x + out
        z2 = F.layer_norm(z, (d,), block.ln_2.weight, block.ln_2.bias, block.ln_2.eps)
        hidden = F.gelu(z2 @ block.mlp.c_fc.weight.T + block.mlp.c_fc.bias)
        out = z + hidden @ block.mlp.c_proj.weight.T + block.mlp.c_proj.bias
    ln = visual.ln_post
    return F.layer_norm(out, (d,), ln.weight, ln.bias, ln.eps)[:, 1:] @ visual.proj


def maskclip_authors_reference(visual, x: torch.Tensor) -> torch.Tensor:
    """``[B, N, E]`` MaskCLIP's ViT path as the authors' code computes it, written out on the
    tokens ``x`` entering the last block (chongzhou96/MaskCLIP,
    ``mmseg/models/backbones/vit.py`` L96-104: ``in_proj`` then ``out_proj`` on each of q, k,
    v with no attention, ``v += x``, ``v = ffn(norm2(v), identity=v)``; L434-437 the final
    norm; ``decode_heads/maskclip_head.py`` L80 the projection)."""
    block = visual.transformer.resblocks[-1]
    d = x.shape[-1]
    y = F.layer_norm(x, (d,), block.ln_1.weight, block.ln_1.bias, block.ln_1.eps)
    y = F.linear(y, block.attn.in_proj_weight, block.attn.in_proj_bias)
    v = F.linear(y[..., 2 * d:], block.attn.out_proj.weight, block.attn.out_proj.bias) + x
    z = F.layer_norm(v, (d,), block.ln_2.weight, block.ln_2.bias, block.ln_2.eps)
    v = v + F.linear(F.gelu(F.linear(z, block.mlp.c_fc.weight, block.mlp.c_fc.bias)),
                     block.mlp.c_proj.weight, block.mlp.c_proj.bias)
    ln = visual.ln_post
    return F.layer_norm(v, (d,), ln.weight, ln.bias, ln.eps)[:, 1:] @ visual.proj


def open_clip_blocks(visual, pixels: torch.Tensor) -> list[torch.Tensor]:
    """The first block's input and every block's output, by the model's own modules."""
    x = visual._embeds(pixels)
    out = [x]
    for block in visual.transformer.resblocks:
        x = block(x)
        out.append(x)
    return out


def timm_blocks(trunk, pixels: torch.Tensor) -> list[torch.Tensor]:
    x = trunk.norm_pre(trunk.patch_drop(trunk._pos_embed(trunk.patch_embed(pixels))))
    out = [x]
    for block in trunk.blocks:
        x = block(x)
        out.append(x)
    return out


def timm_qk(trunk, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    block = trunk.blocks[layer]
    d, n = x.shape[-1], block.attn.num_heads
    qkv = block.norm1(x) @ block.attn.qkv.weight.T + block.attn.qkv.bias
    return heads(qkv[..., :d], n), heads(qkv[..., d:2 * d], n)


def timm_reference(kind: str, visual, x: torch.Tensor, cross=None) -> torch.Tensor:
    """The same for a timm ViT block (``norm1``, fused ``qkv``, ``proj``, layer scales),
    then the trunk's final norm and the tower's per-position head."""
    trunk = visual.trunk
    block = trunk.blocks[-1]
    attn = block.attn
    assert isinstance(attn.q_norm, torch.nn.Identity) and isinstance(attn.norm, torch.nn.Identity)
    d, n = x.shape[-1], attn.num_heads
    y = block.norm1(x)
    qkv = y @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = (heads(z, n) for z in qkv.split(d, dim=-1))
    grid = tuple(trunk.patch_embed.grid_size)
    prefix = x.shape[1] - grid[0] * grid[1]
    a = mixing(kind, q, k, (d // n) ** -0.5, grid, prefix, cross)
    out = block.ls1(merge(a @ v) @ attn.proj.weight.T + attn.proj.bias)
    if kind in ("maskclip", "sclip"):
        z = x + out
        out = z + block.ls2(block.mlp(block.norm2(z)))
    return TimmTower(visual).project(trunk.norm(out)[:, prefix:])


def lof_outliers(tokens: torch.Tensor, k: int = 30, share: float = 0.05) -> set[int]:
    """SC-CLIP's anomalies, point by point: the local outlier factor over squared distances
    (each point's reachability its own k-distance, as the authors' code), above its 95th
    percentile."""
    d = torch.cdist(tokens, tokens) ** 2
    order = [sorted(range(len(tokens)), key=lambda j, i=i: (d[i, j].item(), j != i))[1:k + 1]
             for i in range(len(tokens))]
    kdist = torch.stack([d[i, order[i][-1]] for i in range(len(tokens))])
    lrd = k / kdist
    lof = torch.stack([lrd[order[i]].mean() / lrd[i] for i in range(len(tokens))])
    cut = torch.quantile(lof.float(), 1 - share).to(lof)
    return {i for i in range(len(tokens)) if lof[i] > cut}


def fill_outliers(tokens: torch.Tensor, outliers: set[int], grid) -> torch.Tensor:
    """Each outlier replaced by the mean of its non-outlier 8-neighbours on the grid."""
    h, w = grid
    out = tokens.clone()
    for i in outliers:
        r, c = divmod(i, w)
        near = [(r + dr) * w + c + dc for dr in (-1, 0, 1) for dc in (-1, 0, 1)
                if (dr or dc) and 0 <= r + dr < h and 0 <= c + dc < w
                and (r + dr) * w + c + dc not in outliers]
        if near:
            out[i] = tokens[near].mean(0)
    return out


def scclip_reference(outputs: list[torch.Tensor], grid, attend) -> torch.Tensor:
    """``[1, N, D]`` SC-CLIP's last-block output for one image written out from its
    equations: ``outputs`` every block's output but the last's ``[1, 1 + N, D]``;
    ``attend(z, A_mid)`` the last block's branch with ``A = (A_mid + softmax(s kk^T)) / 2``."""
    def cos(z):
        z = z / z.norm(dim=-1, keepdim=True)
        return z @ z.T

    def mix(z, m):
        m = torch.where(m >= 0.4, m, torch.zeros_like(m))
        return (m / (m.sum(-1, keepdim=True) + 1e-6)) @ z

    entering = outputs[-1][0]
    outliers = lof_outliers(entering[1:])
    m_pre = cos(fill_outliers(outputs[8][0, 1:], outliers, grid))
    centred = 3 * (m_pre - m_pre.mean())
    a_mid = torch.softmax(torch.where(centred >= 0, centred, float("-inf")), dim=-1)
    m_post = cos(outputs[3][0, 1:])
    x = mix(fill_outliers(entering[1:], outliers, grid), m_pre)
    x = mix(attend(x, a_mid) + 0.3 * entering[:1], m_post)
    fused = sum(outputs[i][0] for i in range(3, 10))
    y = mix(attend(fused[1:], a_mid) + 0.3 * fused[:1], m_post)
    return (x + y)[None]


def self_adjusted(q_k_v, a_mid, scale):
    q, k, v = q_k_v
    a = (a_mid + torch.softmax(scale * torch.einsum("bhtd,bhsd->bhts", k, k), dim=-1)) / 2
    return merge(a @ v)


# ----------------------------------------------------------------- the tests
@pytest.mark.slow
@pytest.mark.parametrize("kind", [*DENSE, RESCLIP])
def test_each_dense_path_on_open_clip_vit_b16_is_its_papers_equations(vit_b16, kind):
    model, pixels, blocks = vit_b16
    tower = VitTower(model.visual)
    with torch.no_grad():
        scale = (model.visual.transformer.width // model.visual.transformer.resblocks[0]
                 .attn.num_heads) ** -0.5
        cross = cross_correlation(lambda layer, x: open_clip_qk(model.visual, layer, x),
                                  blocks, scale) if kind == RESCLIP else None
        expected = open_clip_reference(kind, model.visual, blocks[-2], cross)
        patches, pooled = tower.encode(pixels, FeatureSource(kind))
        ours = tower.project(patches)
        readout = model.visual.ln_post(blocks[-1][:, 0]) @ model.visual.proj
    assert torch.allclose(pooled, readout, atol=1e-10)  # the model's own image embedding
    assert ours.shape == (1, 196, 512)
    assert torch.allclose(ours, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_maskclip_is_the_authors_vit_path_not_clearclips_residual_free_ablation(vit_b16):
    """``maskclip`` equals MaskCLIP's ViT path written out from the authors' code (residual
    and feed-forward kept), and not the residual-free identity attention (ClearCLIP's
    ``ignore_residual=True`` ablation: ``ln_post(out_proj(v_proj(ln_1 x))) @ proj``)."""
    model, pixels, blocks = vit_b16
    visual = model.visual
    tower = VitTower(visual)
    with torch.no_grad():
        ours = tower.project(tower.encode(pixels, FeatureSource("maskclip"))[0])
        expected = maskclip_authors_reference(visual, blocks[-2])
        last = visual.transformer.resblocks[-1]
        ablation = visual.ln_post(value_path(last.attn, last.ln_1(blocks[-2])))[:, 1:] @ visual.proj
    assert torch.allclose(ours, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(ours, ablation, atol=1e-2, rtol=0)


@pytest.mark.parametrize("kind", DENSE)
def test_each_dense_path_on_a_timm_vit_is_its_papers_equations(timm_vit, kind):
    model, pixels = timm_vit
    tower = image_tower(model)
    with torch.no_grad():
        x = timm_blocks(model.visual.trunk, pixels)[-2]
        expected = timm_reference(kind, model.visual, x)
        ours = tower.project(tower.encode(pixels, FeatureSource(kind))[0])
    assert torch.allclose(ours, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", [*DENSE, RESCLIP])
def test_each_dense_path_on_a_12_block_timm_vit_is_its_papers_equations(deep_timm_vit, kind):
    model, pixels = deep_timm_vit
    trunk = model.visual.trunk
    tower = image_tower(model)
    with torch.no_grad():
        blocks = timm_blocks(trunk, pixels)
        cross = cross_correlation(lambda layer, x: timm_qk(trunk, layer, x), blocks,
                                  trunk.blocks[0].attn.head_dim ** -0.5
                                  ) if kind == RESCLIP else None
        expected = timm_reference(kind, model.visual, blocks[-2], cross)
        ours = tower.project(tower.encode(pixels, FeatureSource(kind))[0])
    assert torch.allclose(ours, expected, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_scclip_on_open_clip_vit_b16_is_its_equations(vit_b16):
    model, pixels, blocks = vit_b16
    visual = model.visual
    last = visual.transformer.resblocks[-1]
    d, n = visual.transformer.width, last.attn.num_heads

    def attend(z, a_mid):
        y = F.layer_norm(z[None], (d,), last.ln_1.weight, last.ln_1.bias, last.ln_1.eps)
        w, b = last.attn.in_proj_weight, last.attn.in_proj_bias
        qkv = [heads(y @ w[i * d:(i + 1) * d].T + b[i * d:(i + 1) * d], n) for i in range(3)]
        out = self_adjusted(qkv, a_mid, (d // n) ** -0.5)
        return (out @ last.attn.out_proj.weight.T + last.attn.out_proj.bias)[0]

    with torch.no_grad():
        out = scclip_reference(blocks[1:-1], tuple(visual.grid_size), attend)
        ln = visual.ln_post
        expected = F.layer_norm(out, (d,), ln.weight, ln.bias, ln.eps) @ visual.proj
        tower = VitTower(visual)
        ours = tower.project(tower.encode(pixels, FeatureSource("scclip"))[0])
    assert torch.allclose(ours, expected, atol=1e-5, rtol=0)


def test_scclip_on_a_12_block_timm_vit_is_its_equations(deep_timm_vit):
    model, pixels = deep_timm_vit
    trunk = model.visual.trunk
    last = trunk.blocks[-1]
    n = last.attn.num_heads

    def attend(z, a_mid):
        qkv = last.norm1(z[None]) @ last.attn.qkv.weight.T + last.attn.qkv.bias
        out = self_adjusted([heads(t, n) for t in qkv.chunk(3, dim=-1)], a_mid,
                            last.attn.head_dim ** -0.5)
        return last.ls1(out @ last.attn.proj.weight.T + last.attn.proj.bias)[0]

    with torch.no_grad():
        blocks = timm_blocks(trunk, pixels)
        out = scclip_reference(blocks[1:-1], tuple(trunk.patch_embed.grid_size), attend)
        expected = TimmTower(model.visual).project(trunk.norm(out))
        tower = image_tower(model)
        ours = tower.project(tower.encode(pixels, FeatureSource("scclip"))[0])
    assert torch.allclose(ours, expected, atol=1e-5, rtol=0)


def test_scclip_is_refused_where_it_does_not_fit(timm_vit, tmp_path):
    """Two blocks (it reads blocks 3-9), and a trunk with no class token (SigLIP: it adds
    0.3 of the class token): refused with the reason or the sources the tower has."""
    model, pixels = timm_vit
    with pytest.raises(UserInputError, match=re.escape(
            "cannot give scclip (scclip reads intermediate blocks and needs 11 blocks; this "
            "tower has 2)")):
        image_tower(model).encode(pixels, FeatureSource("scclip"))
    assert model.visual.trunk.num_prefix_tokens == 0


def test_naclips_neighbourhood_matches_the_authors_window():
    """Omega of otviz (grid distances) equals the authors' construction (a convolved
    window), prefix rows and columns zero."""
    from otviz.towers.dense import neighbourhood_bias

    assert torch.allclose(neighbourhood_bias((5, 7), 1), gaussian_omega((5, 7), 1), atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("layer", [0, -3])
def test_layer_k_is_the_blocks_tokens_through_the_towers_norm_and_projection(vit_b16, layer):
    model, pixels, blocks = vit_b16
    visual, tower = model.visual, VitTower(model.visual)
    with torch.no_grad():
        tokens = blocks[1:][layer]
        expected = visual.ln_post(tokens)[:, 1:] @ visual.proj
        ours = tower.project(tower.encode(pixels, parse_feature_source(f"layer:{layer}"))[0])
    assert torch.allclose(ours, expected, atol=1e-8)


def test_layer_k_on_a_timm_vit_reads_the_trunks_final_norm(timm_vit):
    model, pixels = timm_vit
    tower = image_tower(model)
    trunk = model.visual.trunk
    with torch.no_grad():
        tokens = timm_blocks(trunk, pixels)[1]
        prefix = tokens.shape[1] - tower.grid[0] * tower.grid[1]
        expected = trunk.norm(tokens)[:, prefix:]
        ours = tower.encode(pixels, FeatureSource("layer", 0))[0]
    assert torch.allclose(ours, expected, atol=1e-10)


@pytest.mark.slow
def test_the_last_layer_and_last_are_the_same_and_the_default_is_untouched(vit_b16):
    model, pixels, _ = vit_b16
    tower = VitTower(model.visual)
    with torch.no_grad():
        last, pooled = tower.encode(pixels)
        out = model.visual.forward_intermediates(pixels, indices=1, output_fmt="NLC")
        layer, _ = tower.encode(pixels, FeatureSource("layer", -1))
    assert torch.equal(last, model.visual.ln_post(out["image_intermediates"][-1]))
    assert torch.equal(pooled, out["image_features"])
    assert torch.allclose(layer, last, atol=1e-10)


@pytest.mark.slow
def test_448_px_gives_a_28_by_28_grid_equal_to_open_clips_resized_model():
    """ViT-B/16 at 448 px: 28 x 28 tokens, the same features as open_clip's own model built
    at 448 px with the 224 px weights and its position embeddings resized
    (``open_clip.model.resize_pos_embed``, bicubic); the geometry follows."""
    from open_clip.model import resize_pos_embed

    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-16", pretrained=None).eval()
    big = open_clip.create_model("ViT-B-16", pretrained=None, force_image_size=448)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    resize_pos_embed(state, big)
    big.load_state_dict(state)
    big.eval()
    tower = VitTower(model.visual).at_size(448)
    pixels = torch.randn(1, 3, 448, 448, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        patches, pooled = tower.encode(pixels)
        out = big.visual.forward_intermediates(pixels, indices=1, output_fmt="NLC")
    assert tower.grid == (28, 28) and patches.shape[1] == 784
    assert torch.allclose(pooled, out["image_features"], atol=1e-5)
    assert torch.allclose(patches, big.visual.ln_post(out["image_intermediates"][-1]), atol=1e-5)
    geometry = tower.geometry
    assert geometry.grid == (28, 28)
    assert torch.allclose(geometry.centres(), VitTower(big.visual).geometry.centres())


def test_sources_are_parsed_and_refused_with_the_accepted_forms():
    assert str(parse_feature_source(" Layer:-2 ")) == "layer:-2"
    assert parse_feature_source("naclip") == FeatureSource("naclip")
    assert {str(parse_feature_source(n.replace("K", "3"))) for n in FEATURE_SOURCE_NAMES} == {
        "last", "layer:3", *DENSE, RESCLIP, "scclip", "proxy"}
    for bad in ("layer", "layer:x", "layer:1.5", "dino", ""):
        with pytest.raises(UserInputError) as e:
            parse_feature_source(bad)
        assert all(form in str(e.value) for form in FEATURE_SOURCE_NAMES)


def test_a_tower_refuses_what_it_cannot_give_naming_what_it_has(tmp_path, timm_vit):
    resnet = shrunk_backbone("RN50", tmp_path, seed=0)
    with pytest.raises(UserInputError, match="cannot give sclip; it gives last, maskclip"):
        resnet.with_features("sclip")
    with pytest.raises(UserInputError, match="cannot give layer:2; it gives last, maskclip"):
        resnet.with_features("layer:2")
    with pytest.raises(UserInputError, match="native 64 x 64 px only"):
        resnet.with_features("last", 128)
    model, pixels = timm_vit
    tower = image_tower(model)
    assert tower.sources() == ("last", "layer:K", *DENSE)
    with pytest.raises(UserInputError, match=re.escape(
            "cannot give resclip-rcs (resclip-rcs reads intermediate blocks and needs 10 "
            "blocks; this tower has 2); it gives last, layer:K, maskclip, sclip, clearclip, "
            "naclip")):
        tower.encode(pixels, FeatureSource(RESCLIP))  # two blocks: no blocks 5-8 to read
    with pytest.raises(UserInputError, match="outside .* 2 blocks; K runs from 0 to 1"):
        tower.encode(pixels, FeatureSource("layer", 2))
    eva = shrunk_backbone("EVA02-B-16", tmp_path, seed=0)
    with pytest.raises(UserInputError, match="cannot give clearclip; it gives last, layer:K, "
                                             "maskclip"):
        eva.with_features("clearclip")
