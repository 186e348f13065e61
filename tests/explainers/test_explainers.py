"""The explainers against references: Grad-CAM against the grad-cam library's own output and
the Grad-CAM formula by autograd, LeGrad against finite differences of the similarity with
respect to each attention map, MaskCLIP against its closed-form value projection; all on
small random-init open_clip models of each tower family (no weights can be downloaded)."""

from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from open_clip.model import CLIPTextCfg, CLIPVisionCfg
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.image import scale_cam_image

from otviz.explainers import EXPLAINERS, ExplainerUnsupportedError, explainer_names, get_explainer
from otviz.explainers.base import PhraseExplainer, min_max, register_explainer
from otviz.explainers.gradcam import GradCamExplainer, ImageEmbedding, SimilarityTarget
from otviz.explainers.legrad import LeGradExplainer
from otviz.explainers.maskclip import MaskClipExplainer
from otviz.explainers.relevance import CheferExplainer
from otviz.patch_grid.tokens import TokenGeometry
from otviz.towers import image_tower
from otviz.towers.vit import VitTower

TEXT = CLIPTextCfg(context_length=8, vocab_size=64, width=32, heads=2, layers=1)


def _model(vision: CLIPVisionCfg, seed: int = 0, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return open_clip.CLIP(16, vision, TEXT).to(dtype).eval()


def _vit(image_size: int = 32, layers: int = 2, pool: str = "tok", dtype=torch.float32):
    return _model(CLIPVisionCfg(layers=layers, width=32, head_width=16, patch_size=8,
                                image_size=image_size, pool_type=pool), dtype=dtype)


TOWERS = {
    "vit": lambda: (_vit(), 32),
    "vit-avg": lambda: (_vit(pool="avg"), 32),
    "modified-resnet": lambda: (_model(CLIPVisionCfg(layers=(1, 1, 1, 1), width=8,
                                                     head_width=8, image_size=64)), 64),
    "timm-convnext": lambda: (_model(CLIPVisionCfg(timm_model_name="convnext_atto",
                                                   timm_pool="avg", timm_proj="linear",
                                                   image_size=32)), 32),
}


def _inputs(size: int, b: int = 2, dtype=torch.float32, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(b, 3, size, size, generator=g).to(dtype)
    text = F.normalize(torch.randn(b, 16, generator=g), dim=-1).to(dtype)
    return pixels, text


@pytest.mark.parametrize("tower", sorted(TOWERS))
def test_gradcam_equals_the_libraries_own_output(tower):
    model, size = TOWERS[tower]()
    pixels, text = _inputs(size)
    ours = GradCamExplainer(model).explain(pixels, text).numpy()
    target = image_tower(model).cam_target()
    library = GradCAM(ImageEmbedding(model), [target.layer], target.reshape)
    theirs = library(pixels, [SimilarityTarget(t) for t in text])  # upsampled to the pixels
    assert theirs.shape == (2, size, size)
    # the library: min-max, resize to the pixels, min-max again (its layer aggregation)
    assert np.allclose(scale_cam_image(scale_cam_image(ours, (size, size))), theirs, atol=1e-5)
    assert ours.min() >= 0 and ours.max() <= 1 + 1e-6


@pytest.mark.parametrize("tower", ["vit", "modified-resnet"])
def test_gradcam_is_the_gradient_weighted_activation_map(tower):
    """Selvaraju et al. Eq. 1-2 by autograd: ReLU(sum_c mean_ij(ds/dA_cij) A_c), min-max."""
    model, size = TOWERS[tower]()
    pixels, text = _inputs(size)
    target = image_tower(model).cam_target()
    seen = []
    handle = target.layer.register_forward_hook(lambda m, i, o: seen.append(o))
    s = (F.normalize(model.encode_image(pixels), dim=-1) * text).sum()
    handle.remove()
    act = seen[0]
    (grad,) = torch.autograd.grad(s, act)
    if target.reshape is not None:
        act, grad = target.reshape(act), target.reshape(grad)
    cam = (grad.mean(dim=(2, 3), keepdim=True) * act).sum(1).clamp_min(0)
    expected = min_max(cam.detach())
    ours = GradCamExplainer(model).explain(pixels, text)
    assert torch.allclose(ours, expected, atol=1e-5)


def test_vit_blocks_reproduce_the_towers_forward():
    model = _vit(layers=3)
    pixels, _ = _inputs(32)
    reader = VitTower(model.visual).attention_reader()
    trace = reader.trace(pixels)
    tokens, maps = trace.tokens, trace.maps
    assert len(tokens) == 4 and len(maps) == 3
    assert torch.allclose(reader.readout(tokens[-1]),
                          model.encode_image(pixels), atol=1e-5)
    assert torch.allclose(maps[0].sum(-1), torch.ones(2, 2, 17), atol=1e-6)  # row-stochastic


def _perturbed_similarity(model, pixels, text, layer: int, delta: torch.Tensor) -> torch.Tensor:
    """``s^layer`` (LeGrad's per-layer similarity) with ``delta`` added to that layer's
    attention map: an attention forward written out here, independent of otviz's."""
    visual = model.visual
    x = visual._embeds(pixels)
    for k, block in enumerate(visual.transformer.resblocks[: layer + 1]):
        mha = block.attn
        b, t, d = x.shape
        h = mha.num_heads
        q, kk, v = F.linear(block.ln_1(x), mha.in_proj_weight, mha.in_proj_bias).split(d, -1)
        q, kk, v = (z.view(b, t, h, -1).permute(0, 2, 1, 3) for z in (q, kk, v))
        a = torch.softmax(torch.einsum("bhid,bhjd->bhij", q, kk) / (d / h) ** 0.5, -1)
        if k == layer:
            a = a + delta
        o = torch.einsum("bhij,bhjd->bihd", a, v).reshape(b, t, d)
        x = x + mha.out_proj(o)
        x = x + block.mlp(block.ln_2(x))
    emb = F.normalize(visual.ln_post(x.mean(1)) @ visual.proj, dim=-1)
    return (emb * text).sum(-1)


def test_legrad_is_the_relu_gradient_wrt_each_attention_map_averaged():
    """E = min-max(sum_l mean_{heads, queries} ReLU(ds^l / dA^l)), the gradient by central
    finite differences on a 2-layer ViT with a 2 x 2 patch grid (float64)."""
    model = _vit(image_size=16, layers=2, dtype=torch.float64)
    pixels, text = _inputs(16, dtype=torch.float64)
    b, h, t, eps = 2, 2, 5, 1e-6
    total = torch.zeros(b, t, dtype=torch.float64)
    with torch.no_grad():
        for layer in range(2):
            grad = torch.zeros(b, h, t, t, dtype=torch.float64)
            for idx in np.ndindex(h, t, t):
                delta = torch.zeros(b, h, t, t, dtype=torch.float64)
                delta[(slice(None), *idx)] = eps
                up = _perturbed_similarity(model, pixels, text, layer, delta)
                down = _perturbed_similarity(model, pixels, text, layer, -delta)
                grad[(slice(None), *idx)] = (up - down) / (2 * eps)
            total += grad.clamp_min(0).mean(dim=(1, 2))
    expected = min_max(total[:, 1:]).reshape(b, 2, 2)
    ours = LeGradExplainer(model).explain(pixels, text)
    assert torch.allclose(ours, expected, atol=1e-6)
    last_only = LeGradExplainer(model, first_layer=1).layer_maps(pixels, text)
    assert last_only.shape == (1, b, 4)
    with pytest.raises(ValueError, match="not a layer"):
        LeGradExplainer(model, first_layer=2).explain(pixels, text)


def test_maskclip_is_the_closed_form_value_projection():
    model = _vit(layers=2)
    pixels, text = _inputs(32)
    visual = model.visual
    first, last = visual.transformer.resblocks
    with torch.no_grad():
        x = first(visual._embeds(pixels))  # open_clip's own block
        d = x.shape[-1]
        w_v, b_v = last.attn.in_proj_weight[2 * d :], last.attn.in_proj_bias[2 * d :]
        w_o, b_o = last.attn.out_proj.weight, last.attn.out_proj.bias
        z = x + (last.ln_1(x) @ w_v.T + b_v) @ w_o.T + b_o  # MaskCLIP vit.py L96-104
        z = z + last.mlp(last.ln_2(z))
        f = visual.ln_post(z) @ visual.proj
        expected = torch.einsum("bne,be->bn", F.normalize(f[:, 1:], dim=-1), text)
    ours = MaskClipExplainer(model).explain(pixels, text)
    assert torch.allclose(ours.reshape(2, -1), expected, atol=1e-5)


@pytest.mark.parametrize(("name", "tower"), [("legrad", "modified-resnet"),
                                             ("chefer", "modified-resnet"),
                                             ("maskclip", "timm-convnext")])
def test_attention_explainers_refuse_towers_they_cannot_read(name, tower):
    model, size = TOWERS[tower]()
    explainer = get_explainer(name, model)
    with pytest.raises(ExplainerUnsupportedError, match="ViT"):
        explainer.check()
    with pytest.raises(ExplainerUnsupportedError, match="ViT"):
        explainer.explain(*_inputs(size))


def test_maps_resample_to_the_requested_grid():
    model = _vit()
    pixels, text = _inputs(32)
    explainer = MaskClipExplainer(model)
    own = explainer.explain(pixels, text)
    same = TokenGeometry.cell_centred((4, 4), (32, 32))
    assert torch.equal(explainer.maps(pixels, text, same), own.reshape(2, -1))
    # an even 2 x 2 split: each token's cell holds 2 x 2 of the explainer's cells (area mean)
    coarse = explainer.maps(pixels, text, TokenGeometry.cell_centred((2, 2), (32, 32)))
    assert torch.allclose(coarse, F.avg_pool2d(own[:, None], 2).reshape(2, -1), atol=1e-6)
    # tokens centred 3.5 px up-left of their cells (a conv stem at stride 16, origin 4.5):
    # token 0's cell is x, y in [0, 12.5): the pixels whose centres lie there, 0..11, hold
    # the explainer's cell 0 (pixels 0..7) and half its cell 1 (pixels 8..11) per axis
    stem = TokenGeometry((2, 2), (32, 32), (16.0, 16.0), (4.5, 4.5))
    shifted = explainer.maps(pixels, text, stem)
    w = torch.tensor([8.0, 4.0]) / 12.0
    expected = (w[:, None] * w[None, :] * own[:, :2, :2]).sum((-1, -2))
    assert torch.allclose(shifted[:, 0], expected, atol=1e-6)


def test_registry_names_and_refuses_duplicates():
    assert explainer_names("all") == tuple(EXPLAINERS) == ("gradcam", "legrad", "maskclip",
                                                             "chefer")
    assert explainer_names("") == ()
    with pytest.raises(ValueError, match="known: gradcam"):
        explainer_names("gradcam,nope")
    with pytest.raises(KeyError, match="known"):
        get_explainer("nope", _vit())

    class Twin(PhraseExplainer):
        name, label, source = "gradcam", "twin", "test"

        def explain(self, pixels, text):
            return pixels

    with pytest.raises(ValueError, match="explainer 'gradcam' is registered twice"):
        register_explainer(Twin)
    assert EXPLAINERS["gradcam"] is GradCamExplainer


@pytest.mark.parametrize("pool", ["tok", "avg"])
def test_chefer_relevance_is_the_product_of_gradient_weighted_attention(pool):
    """Eq. 5-6: R = (I + Abar^2)(I + Abar^1), Abar^l = mean_h ReLU(ds/dA^l * A^l), with s the
    final similarity; the map is the pooled token's row (class token, or the patch rows'
    mean for a mean-pooled tower) over the patches."""
    model = _vit(layers=2, pool=pool)
    pixels, text = _inputs(32)
    leaf = pixels.clone().requires_grad_(True)
    reader = VitTower(model.visual).attention_reader()
    trace = reader.trace(leaf)
    tokens, maps = trace.tokens, trace.maps
    s = (F.normalize(reader.readout(tokens[-1]), dim=-1) * text).sum()
    grads = torch.autograd.grad(s, maps)
    eye = torch.eye(17)
    bars = [(g * a).clamp_min(0).mean(1).detach() for a, g in zip(maps, grads, strict=True)]
    r = (eye + bars[1]) @ (eye + bars[0])
    row = r[:, 0, 1:] if pool == "tok" else r[:, 1:, 1:].mean(1)
    ours = CheferExplainer(model).explain(pixels, text)
    assert torch.allclose(ours.reshape(2, -1), min_max(row), atol=1e-5)
    assert torch.allclose(CheferExplainer(model).relevance(pixels, text)[0], r, atol=1e-5)


def test_gradcam_never_sees_a_forward_of_the_shared_model():
    """The library's hooks sit on Grad-CAM's private copy of the model: a forward of the
    shared model in the middle of a call (another server thread's Align click, here run from
    a pre-hook on the copy's forward) leaves the map unchanged."""
    from otviz.explainers.private import private_model

    model, size = TOWERS["vit"]()
    pixels, text = _inputs(size)
    clean = GradCamExplainer(model).explain(pixels, text)
    intruded = []

    def intrude(module, args):
        with torch.no_grad():
            model.encode_image(torch.randn_like(args[0]))
        intruded.append(True)

    handle = private_model(model).visual.register_forward_pre_hook(intrude)
    try:
        assert torch.equal(GradCamExplainer(model).explain(pixels, text), clean)
        assert intruded
    finally:
        handle.remove()
