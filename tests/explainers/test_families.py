"""Every explainer on a Backbone of each open_clip tower family (shrunken random-init
stand-ins, offline), through the calls the app makes: the Align grid's panels
(:func:`otviz.ui.explainer_panels.explainer_maps` on an encoded pair), the grounding table's
rows and the Browse table. A map is finite and on the patch grid (Grad-CAM's equal to the
grad-cam library's own output on that backbone, MaskCLIP's on a ResNet to the attention
pool's value path in closed form); an explainer that cannot read the tower gives its
"not available for <family> towers" note, never an error or a blank."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pytorch_grad_cam import GradCAM
from pytorch_grad_cam.utils.image import scale_cam_image

from otviz.eval import alignment_tables as A
from otviz.eval import browse as B
from otviz.eval.world_set import EvalSet
from otviz.explain import Explainer
from otviz.explainers import EXPLAINERS, phrase_embeddings
from otviz.explainers.gradcam import ImageEmbedding, SimilarityTarget
from otviz.patch_grid.tokens import TokenGeometry
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite
from otviz.ui.browse_tab import browse_view
from otviz.ui.explainer_panels import explainer_maps, explainer_panels
from otviz.viz.panels import compose_heatmaps
from tests.towers.conftest import shrunk_backbone

#: family -> (open_clip architecture, the explainers that read its tower): the table of
#: docs/explainers.md.
FAMILIES: dict[str, tuple[str, set[str]]] = {
    "vit": ("ViT-B-32", {"gradcam", "legrad", "maskclip", "chefer"}),
    "resnet": ("RN50", {"gradcam", "maskclip"}),
    "timm-convnext": ("convnext_base", {"gradcam"}),
    "timm-siglip": ("ViT-B-16-SigLIP", {"gradcam", "legrad", "maskclip", "chefer"}),
    "coca": ("coca_ViT-B-32", {"gradcam", "legrad", "maskclip", "chefer"}),
    "timm-eva02": ("EVA02-B-16", {"gradcam", "legrad", "maskclip", "chefer"}),
}
CAPTION = "a small red circle to the left of a blue square"
PHRASE = "a blue square"


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """``(family, backbone)``, seeded (seed 1: a random-init ResNet's Grad-CAM is not flat)."""
    torch.set_num_threads(1)
    hf_dir = tmp_path_factory.mktemp("hf")
    return request.param, shrunk_backbone(FAMILIES[request.param][0], hf_dir, seed=1)


def _image(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (48, 56, 3), dtype=np.uint8)


def _gradcam_library(backbone, image: np.ndarray, phrase: str) -> np.ndarray:
    """The grad-cam library's own Grad-CAM of the pair, upsampled to the pixels."""
    pixels = backbone.image_tensor([image])
    text = phrase_embeddings(backbone, [phrase])
    target = backbone.image_tower.cam_target()
    with torch.enable_grad():
        cam = GradCAM(ImageEmbedding(backbone.model), [target.layer], target.reshape)
        maps = cam(pixels.requires_grad_(True), [SimilarityTarget(t) for t in text])
    backbone.model.zero_grad(set_to_none=True)
    return maps


def test_the_align_panels_on_every_family(family):
    name, backbone = family
    available = FAMILIES[name][1]
    encoded = Explainer(backbone).encode(_image(), CAPTION)
    maps = explainer_maps(backbone, encoded, PHRASE)
    assert list(maps) == list(EXPLAINERS)
    for explainer, heat in maps.items():
        if explainer not in available:
            assert heat == (f"{EXPLAINERS[explainer].label}: not available for "
                            f"{backbone.image_tower.family} towers")
            continue
        assert isinstance(heat, np.ndarray) and heat.shape == encoded.grid
        assert np.isfinite(heat).all(), explainer
    ours = maps["gradcam"]
    assert np.ptp(ours) > 0  # a map to compare, not a flat one
    theirs = _gradcam_library(backbone, encoded.image, PHRASE)
    side = theirs.shape[1:]
    np.testing.assert_allclose(scale_cam_image(scale_cam_image(ours[None], side[::-1])),
                               theirs, atol=1e-5)
    titles = [t for t, _ in explainer_panels(maps)]
    assert titles == [EXPLAINERS[n].label + ("" if n not in available else
                                             " (explainer, own scale)") for n in EXPLAINERS]


def test_maskclip_on_a_resnet_is_the_attention_pools_value_path(tmp_path):
    """MaskCLIP Sec. 3.2 on a ResNet: cos(c_proj(v_proj(x_i)), t) over the last stage's
    positions ``x_i``, written out from the tower's modules."""
    backbone = shrunk_backbone("RN50", tmp_path, seed=1)
    visual = backbone.model.visual
    encoded = Explainer(backbone).encode(_image(1), CAPTION)
    heat = explainer_maps(backbone, encoded, PHRASE)["maskclip"]
    pixels = backbone.image_tensor([encoded.image])
    with torch.no_grad():
        x = visual.stem(pixels)
        for stage in (visual.layer1, visual.layer2, visual.layer3, visual.layer4):
            x = stage(x)
        x = x.flatten(2).transpose(1, 2)
        pool = visual.attnpool
        f = F.normalize(pool.c_proj(pool.v_proj(x)), dim=-1)
    t = phrase_embeddings(backbone, [PHRASE])
    np.testing.assert_allclose(heat.reshape(-1), (f[0] @ t[0]).numpy(), atol=1e-6)


def test_the_grounding_rows_and_browse_on_every_family(family, tmp_path):
    name, backbone = family
    available = FAMILIES[name][1]
    suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS[:20], ("filip",))
    data = EvalSet.build(backbone, 2, "test", 0, str(tmp_path / "cache"))
    table = A.grounding_table(suite, data, chunk=2, baselines=False,
                              explainers=tuple(EXPLAINERS))
    rows = {r["name"]: r for r in table.rows if r.get("explainer")}
    assert list(rows) == list(EXPLAINERS)
    for explainer, row in rows.items():
        if explainer in available:
            assert row["method"] == EXPLAINERS[explainer].label
            assert 0 <= row["pointing"] <= 1 and np.isfinite(row["mean_iou"])
        else:
            assert "not available for" in row["method"] and "pointing" not in row
    sizes = torch.tensor([[80, 80]]).expand(data.n_images, 2)
    browse = B.browse_table(suite, data, B.world_queries(data), sizes,
                            lambda j: data.samples[j].image, methods=("filip",),
                            explainers=tuple(EXPLAINERS))
    assert browse.methods == ("filip", *(e for e in EXPLAINERS if e in available))
    assert set(browse.unavailable) == set(EXPLAINERS) - available
    assert torch.isfinite(browse.heatmaps).all()
    view = browse_view(browse, ["filip", *EXPLAINERS], "filip", "gradcam")
    assert view.image is not None
    for note in browse.unavailable.values():
        assert note in view.status


def test_a_note_panel_shows_its_text_not_a_map():
    image = _image(2)
    heat = np.linspace(0, 1, 4).reshape(2, 2)
    geometry = TokenGeometry.cell_centred((2, 2), (image.shape[1], image.shape[0]))
    plain = compose_heatmaps(image, [heat, heat], ["a", "b"], geometry=geometry,
                             shared_scale=False)
    noted = compose_heatmaps(image, [heat, np.zeros((2, 2))], ["a", "b"], geometry=geometry,
                             shared_scale=False, notes=[None, "b: not available for X towers"])
    blank = compose_heatmaps(image, [heat, np.zeros((2, 2))], ["a", "b"], geometry=geometry,
                             shared_scale=False, notes=[None, " "])
    half = plain.shape[1] // 2
    np.testing.assert_array_equal(noted[:, :half], plain[:, :half])
    assert not np.array_equal(noted[:, half:], blank[:, half:])  # the note is drawn
