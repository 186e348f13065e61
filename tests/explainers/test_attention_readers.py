"""The attention readers of the transformer tower families (each adapter's
``attention_reader``, otviz/towers/vit.py and timm_tower.py), on
shrunken random-init stand-ins in float64: the traced forward is the tower's own (its
readout of the last tokens is the model's image embedding), the traced maps are the
attention the forward uses (finite differences of the similarity through a perturbed map
equal the gradient the explainers read), the pooler's attention reproduces the pooler, and
MaskCLIP's value path has its closed form. The shared model is never hooked or switched,
and no copy of it is made for the traces (they re-run the live weights)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from otviz.explainers import private
from otviz.explainers.base import min_max
from otviz.explainers.legrad import LeGradExplainer
from otviz.explainers.maskclip import MaskClipExplainer
from otviz.towers import image_tower
from otviz.towers.timm_tower import TimmTower, latent_pool_attention
from otviz.towers.vit import block_attention_map
from tests.towers.conftest import shrunk_backbone

#: family -> open_clip architecture whose shrunken stand-in is read.
FAMILIES = {
    "vit-cls": "ViT-B-32",
    "vit-avg": "ViT-L-14-CLIPA",
    "coca": "coca_ViT-B-32",
    "timm-siglip-map": "ViT-B-16-SigLIP",
    "timm-eva02": "EVA02-B-16",
    "timm-vitamin": "ViTamin-S",
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request, tmp_path_factory):
    torch.set_num_threads(1)
    backbone = shrunk_backbone(FAMILIES[request.param], tmp_path_factory.mktemp("hf"), seed=1)
    return backbone.model.double().eval()


def _inputs(model, b: int = 2, seed: int = 0):
    size = _size(model)
    with torch.no_grad():
        dim = model.encode_image(torch.zeros(1, 3, *size, dtype=torch.float64)).shape[-1]
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(b, 3, *size, generator=g, dtype=torch.float64)
    text = F.normalize(torch.randn(b, dim, generator=g, dtype=torch.float64), dim=-1)
    return pixels, text


def _size(model) -> tuple[int, int]:
    size = model.visual.image_size
    return (size, size) if isinstance(size, int) else tuple(size)


def _hook_count(module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def test_the_trace_is_the_towers_own_forward(model):
    reader = image_tower(model).attention_reader()
    pixels, _ = _inputs(model)
    with torch.no_grad():
        trace = reader.trace(pixels)
        embedding = F.normalize(model.encode_image(pixels), dim=-1)  # CoCa's is unit already
        assert torch.allclose(F.normalize(reader.readout(trace.tokens[-1]), dim=-1), embedding,
                              atol=1e-10)
    assert len(trace.tokens) == len(trace.maps) + 1 >= 3
    t = trace.tokens[-1].shape[1]
    assert t >= reader.grid[0] * reader.grid[1]
    for a in trace.maps:
        assert a.shape[0] == 2 and a.shape[-2:] == (t, t)
        assert torch.allclose(a.sum(-1), torch.ones_like(a[..., 0]), atol=1e-12)


def test_the_shared_model_is_never_hooked_or_switched(model):
    fused = [getattr(m, "fused_attn", None) for m in model.modules()]
    pixels, text = _inputs(model)
    LeGradExplainer(model).explain(pixels, text)
    MaskClipExplainer(model).explain(pixels, text)
    assert _hook_count(model) == 0
    assert [getattr(m, "fused_attn", None) for m in model.modules()] == fused
    assert model not in private._PRIVATE  # the traces made no copy


def _similarity_with(model, reader, pixels, text, layer: int, delta) -> torch.Tensor:
    """``s^layer`` ``[C * B]`` of ``C`` perturbations at once: ``delta`` ``[C * B, heads, T,
    T]`` added to the attention map of block ``layer``, through the tower's own modules (a
    hook on timm's ``attn_drop`` for timm trunks, open_clip's blocks re-run with the map
    written out for its ViT). What comes before block ``layer`` runs once on the ``B``
    images; the block's input is repeated ``C`` times."""
    copies = delta.shape[0] // pixels.shape[0]

    def widen(x: torch.Tensor) -> torch.Tensor:
        return x.repeat(copies, *[1] * (x.dim() - 1))

    if hasattr(model.visual, "trunk"):
        trunk = model.visual.trunk
        block = trunk.blocks[layer]
        attn = block.attn
        hooks = [block.register_forward_pre_hook(lambda _m, args: (widen(args[0]), *args[1:])),
                 attn.attn_drop.register_forward_hook(lambda _m, _a, out: out + delta)]
        outs = []
        hooks.append(block.register_forward_hook(lambda _m, _a, out: outs.append(out)))
        attn.fused_attn, fused = False, attn.fused_attn
        try:
            trunk.forward_features(pixels)
        finally:
            attn.fused_attn = fused
            for hook in hooks:
                hook.remove()
        z = outs[0]
    else:
        visual = model.visual
        z = visual._embeds(pixels)
        for k, block in enumerate(visual.transformer.resblocks[: layer + 1]):
            z = widen(z) if k == layer else z
            a = block_attention_map(block, z)
            a = a + delta if k == layer else a
            mha, (b, t, d) = block.attn, z.shape
            v = F.linear(block.ln_1(z), mha.in_proj_weight, mha.in_proj_bias)[..., 2 * d :]
            v = v.reshape(b, t, mha.num_heads, -1).transpose(1, 2)
            z = z + block.ls_1(mha.out_proj((a @ v).transpose(1, 2).reshape(b, t, d)))
            z = z + block.ls_2(block.mlp(block.ln_2(z)))
    emb = F.normalize(reader.layer_readout(z), dim=-1)
    return (emb * widen(text)).sum(-1)


def test_legrad_reads_the_gradient_of_the_maps_the_forward_uses(model):
    """LeGrad's per-layer signal against central finite differences of ``s^l`` through a
    perturbation of the tower's own attention (40 sampled entries per layer, float64), and
    its map = min-max of the sum of the signals over the patches."""
    reader = image_tower(model).attention_reader()
    pixels, text = _inputs(model)
    with torch.enable_grad():
        trace = reader.trace(pixels.clone().requires_grad_(True))
        grads = []
        for layer in range(len(trace.maps)):
            emb = F.normalize(reader.layer_readout(trace.tokens[layer + 1]), dim=-1)
            grads.append(torch.autograd.grad((emb * text).sum(), trace.maps[layer],
                                             retain_graph=True)[0])
    rng = np.random.default_rng(0)
    eps, n_probes, b = 1e-6, 40, pixels.shape[0]
    with torch.no_grad():
        for layer, grad in enumerate(grads):
            probes = [tuple(int(rng.integers(n)) for n in grad.shape[1:])
                      for _ in range(n_probes)]
            # every +eps and -eps perturbation of the layer in one batched forward
            delta = grad.new_zeros((2, n_probes, *grad.shape))
            for k, idx in enumerate(probes):
                delta[(0, k, slice(None), *idx)] = eps
                delta[(1, k, slice(None), *idx)] = -eps
            up, down = _similarity_with(model, reader, pixels, text, layer,
                                        delta.flatten(0, 2)).reshape(2, n_probes, b)
            for k, idx in enumerate(probes):
                assert torch.allclose((up[k] - down[k]) / (2 * eps), grad[(slice(None), *idx)],
                                      atol=1e-7, rtol=1e-5), (layer, idx)
    n = reader.grid[0] * reader.grid[1]
    signal = sum(g.clamp_min(0).mean(dim=(1, 2))[:, -n:] for g in grads)
    ours = LeGradExplainer(model).explain(pixels, text)
    assert torch.allclose(ours.reshape(2, -1), min_max(signal), atol=1e-9)


def test_the_latent_pool_attention_reproduces_the_pooler(tmp_path):
    """SigLIP's ``map`` pooling: the attention Chefer's pooled row mixes by, recomputed, gives
    the pooler's own output when applied to its values."""
    model = shrunk_backbone("ViT-B-16-SigLIP", tmp_path, seed=2).model.double().eval()
    pool = model.visual.trunk.attn_pool
    x = torch.randn(2, 16, pool.kv.in_features, dtype=torch.float64)
    with torch.no_grad():
        a = latent_pool_attention(pool, x)
        b, t, c = x.shape
        v = pool.kv(x).reshape(b, t, 2, pool.num_heads, pool.head_dim).permute(2, 0, 3, 1, 4)[1]
        out = pool.proj((a @ v).transpose(1, 2).reshape(b, pool.latent_len, c))
        if pool.mlp is not None:
            out = out + pool.mlp(pool.norm(out))
        out = out[:, 0] if pool.pool == "token" else out.mean(1)
        assert torch.allclose(out, pool(x), atol=1e-10)
    assert torch.allclose(a.sum(-1), torch.ones_like(a[..., 0]), atol=1e-12)


def test_maskclip_on_siglip_is_the_closed_form_value_path(tmp_path):
    """``f_i = head(norm(z_i + ls2(mlp(norm2(z_i)))))`` with ``z_i = x_i + ls1(proj(W_v
    norm1(x_i) + b_v))`` per patch for timm's ViT blocks: the last block's value and output
    projections written out from its weights, its residual and feed-forward kept (MaskCLIP's
    ``vit.py`` L96-104)."""
    model = shrunk_backbone("ViT-B-16-SigLIP", tmp_path, seed=3).model.double().eval()
    reader = image_tower(model).attention_reader()
    pixels, text = _inputs(model)
    trunk = model.visual.trunk
    last = trunk.blocks[-1]
    with torch.no_grad():
        x = reader.trace(pixels).tokens[-2]  # what enters the last block
        d = x.shape[-1]
        w_v, b_v = last.attn.qkv.weight[2 * d :], last.attn.qkv.bias[2 * d :]
        z = x + last.ls1(last.attn.proj(last.attn.norm(last.norm1(x) @ w_v.T + b_v)))
        z = z + last.ls2(last.mlp(last.norm2(z)))
        f = TimmTower(model.visual).project(trunk.norm(z))
        expected = torch.einsum("bne,be->bn", F.normalize(f, dim=-1), text)
    ours = MaskClipExplainer(model).explain(pixels, text)
    assert torch.allclose(ours.reshape(2, -1), expected, atol=1e-10)


def test_maskclip_on_coca_goes_through_the_poolers_value_path(tmp_path):
    """CoCa: the last block's value path with its residual and feed-forward, then the
    attention pooler's own value and output projections (its one-key answer), ``ln_post``
    and ``proj``."""
    model = shrunk_backbone("coca_ViT-B-32", tmp_path, seed=4).model.double().eval()
    reader = image_tower(model).attention_reader()
    pixels, text = _inputs(model)
    visual = model.visual
    last, pool = visual.transformer.resblocks[-1], visual.attn_pool
    with torch.no_grad():
        x = reader.trace(pixels).tokens[-2]
        d = x.shape[-1]
        w_v, b_v = last.attn.in_proj_weight[2 * d :], last.attn.in_proj_bias[2 * d :]
        z = x + last.ls_1(last.attn.out_proj(last.ln_1(x) @ w_v.T + b_v))
        branch = (z + last.ls_2(last.mlp(last.ln_2(z))))[:, 1:]
        e = pool.attn.embed_dim
        pw = pool.attn.in_proj_weight[2 * e :] if pool.attn._qkv_same_embed_dim \
            else pool.attn.v_proj_weight
        pooled = pool.attn.out_proj(pool.ln_k(branch) @ pw.T + pool.attn.in_proj_bias[2 * e :])
        f = visual.ln_post(pooled) @ visual.proj
        expected = torch.einsum("bne,be->bn", F.normalize(f, dim=-1), text)
    ours = MaskClipExplainer(model).explain(pixels, text)
    assert torch.allclose(ours.reshape(2, -1), expected, atol=1e-10)


def test_the_hooked_explainers_follow_the_live_weights(tmp_path):
    """Grad-CAM, LeGrad and MaskCLIP on a timm tower after an in-place change of the last
    block, then after a ``.double()``, both after their first call: each map equals the same
    explainer's on a fresh model loaded with the changed weights (the explainers' private
    copy is refreshed from the live model at every call)."""
    from otviz.explainers.gradcam import GradCamExplainer

    model = shrunk_backbone("ViT-B-16-SigLIP", tmp_path, seed=3).model.double().eval()
    pixels, text = _inputs(model)
    explainers = (GradCamExplainer, LeGradExplainer, MaskClipExplainer)
    model.float()
    for explainer in explainers:
        explainer(model).explain(pixels.float(), text.float())  # the copy is made here
    with torch.no_grad():
        for p in model.visual.trunk.blocks[-1].parameters():
            p.mul_(-1.5).add_(0.1)
    for dtype in (torch.float32, torch.float64):
        model.to(dtype)
        fresh = shrunk_backbone("ViT-B-16-SigLIP", tmp_path, seed=9).model.to(dtype).eval()
        fresh.load_state_dict(model.state_dict())
        for explainer in explainers:
            ours = explainer(model).explain(pixels.to(dtype), text.to(dtype))
            expected = explainer(fresh).explain(pixels.to(dtype), text.to(dtype))
            assert torch.allclose(ours.double(), expected.double(), atol=1e-5), (
                explainer.name, dtype)
