"""The feature sources read the model's current parameters: after an in-place change of the
last block, ``load_state_dict`` or ``.double()``, every source of a timm tower and of an
open_clip ViT equals the same source of a fresh backbone built on the changed weights; and
``otviz/towers`` keeps no copy of a model, no hook and no lock."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import otviz.towers
from otviz.towers import image_tower
from otviz.towers.sources import FeatureSource
from tests.towers.conftest import shrunk_backbone

#: (architecture, the sources it gives besides ``last``): a timm ViT (SigLIP), a timm EVA
#: (rotary: ``maskclip`` only), an open_clip ViT.
TOWERS = {
    "ViT-B-16-SigLIP": ("layer:0", "maskclip", "sclip", "clearclip", "naclip"),
    "EVA02-B-16": ("layer:0", "maskclip"),
    "ViT-B-32": ("layer:0", "maskclip", "sclip", "clearclip", "naclip"),
}


def encode_all(model: nn.Module, sources: tuple[str, ...], pixels: torch.Tensor,
               ) -> dict[str, torch.Tensor]:
    tower = image_tower(model)
    with torch.no_grad():
        return {s: tower.encode(pixels, FeatureSource(*_parts(s)))[0] for s in ("last", *sources)}


def _parts(source: str) -> tuple[str, int | None]:
    kind, _, layer = source.partition(":")
    return kind, int(layer) if layer else None


def pixels_for(model: nn.Module, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    size = image_tower(model).image_size
    return torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(5)).to(dtype)


def fresh_on(model: nn.Module, arch: str, hf_dir: Path) -> nn.Module:
    """A new backbone of ``arch`` (other random weights) loaded with ``model``'s weights."""
    fresh = shrunk_backbone(arch, hf_dir, seed=11).model.to(next(model.parameters()).dtype)
    fresh.load_state_dict(model.state_dict())
    return fresh.eval()


def reinitialise(block: nn.Module, seed: int) -> None:
    """Every parameter of ``block`` redrawn in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.2)


def last_block(model: nn.Module) -> nn.Module:
    visual = model.visual
    trunk = getattr(visual, "trunk", None)
    return trunk.blocks[-1] if trunk is not None else visual.transformer.resblocks[-1]


@pytest.mark.parametrize("arch", sorted(TOWERS))
def test_an_in_place_change_of_the_last_block_reaches_every_source(arch, tmp_path):
    model = shrunk_backbone(arch, tmp_path, seed=3).model.eval()
    sources = TOWERS[arch]
    assert set(sources) <= set(image_tower(model).sources()) | {"layer:0"}
    pixels = pixels_for(model)
    before = encode_all(model, sources, pixels)  # first use: nothing may be frozen here
    reinitialise(last_block(model), seed=7)
    after = encode_all(model, sources, pixels)
    expected = encode_all(fresh_on(model, arch, tmp_path), sources, pixels)
    for source in ("last", *sources):
        assert torch.allclose(after[source], expected[source], atol=1e-6, rtol=0), source
        if source != "layer:0":  # block 0 is not the changed one
            assert not torch.allclose(after[source], before[source], atol=1e-3), source


@pytest.mark.parametrize("arch", ["ViT-B-16-SigLIP", "ViT-B-32"])
def test_load_state_dict_reaches_every_source(arch, tmp_path):
    model = shrunk_backbone(arch, tmp_path, seed=3).model.eval()
    other = shrunk_backbone(arch, tmp_path, seed=4).model.eval()
    sources = TOWERS[arch]
    pixels = pixels_for(model)
    encode_all(model, sources, pixels)
    model.load_state_dict(other.state_dict())
    after, expected = encode_all(model, sources, pixels), encode_all(other, sources, pixels)
    for source in ("last", *sources):
        assert torch.allclose(after[source], expected[source], atol=1e-6, rtol=0), source


@pytest.mark.parametrize("arch", sorted(TOWERS))
def test_double_after_first_use_gives_float64_sources_equal_to_a_fresh_double_model(
        arch, tmp_path):
    model = shrunk_backbone(arch, tmp_path, seed=3).model.eval()
    sources = TOWERS[arch]
    encode_all(model, sources, pixels_for(model))
    model.double()
    pixels = pixels_for(model, torch.float64)
    after = encode_all(model, sources, pixels)
    expected = encode_all(fresh_on(model, arch, tmp_path), sources, pixels)
    for source in ("last", *sources):
        assert after[source].dtype == torch.float64, source
        assert torch.allclose(after[source], expected[source], atol=1e-10, rtol=0), source


#: The lines of ``otviz/towers`` that may match, and why: a config dict's copy, and the
#: token-geometry probe that hooks the spatial layers for the length of its one forward
#: (removed in its ``finally``; no feature source runs it), recording the calling thread's
#: forward only (the thread's id: no lock).
ALLOWED = {"shrunken.py": ("cfg = copy.deepcopy(cfg)",),
           "geometry.py": ("handles = [m.register_forward_hook(hook)", "import threading",
                           "caller = threading.get_ident()",
                           "if (threading.get_ident() == caller")}


def test_the_towers_package_keeps_no_model_copy_hook_or_lock():
    """No deep copy of a model, no lasting hook and no process-wide lock in
    ``otviz/towers``' source (the two allowed lines are named above)."""
    package = Path(otviz.towers.__file__).parent
    banned = re.compile(r"deepcopy|copy\.copy|register_\w*hook|threading|Lock\(|weakref")
    offenders = [f"{path.name}: {line.strip()}" for path in sorted(package.glob("*.py"))
                 for line in path.read_text().splitlines()
                 if banned.search(line)
                 and not any(a in line for a in ALLOWED.get(path.name, ()))]
    assert offenders == []


@pytest.mark.parametrize("arch", ["ViT-B-16-SigLIP", "EVA02-B-16"])
def test_a_dense_encode_leaves_no_module_behind_and_no_hook_on_the_model(arch, tmp_path):
    """After dense encodes no new module of the trunk's class lives (no copy was made) and
    the model carries no hook."""
    model = shrunk_backbone(arch, tmp_path, seed=3).model.eval()
    trunk_class = type(model.visual.trunk)

    def trunks() -> int:
        gc.collect()
        return sum(isinstance(o, trunk_class) for o in gc.get_objects())

    count = trunks()
    encode_all(model, TOWERS[arch], pixels_for(model))
    assert trunks() == count
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_the_intermediate_block_paths_follow_an_in_place_change_of_a_middle_block():
    """``resclip-rcs`` (blocks 5-8's attention) and ``scclip`` (blocks 3-9's tokens) on a
    12-block timm ViT: after block 6 is redrawn in place, each equals the same source of a
    fresh model loaded with the changed weights, and differs from before."""
    from open_clip.timm_model import TimmModel

    def deep(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        model = nn.Module()
        model.visual = TimmModel("vit_tiny_patch16_224", 32, image_size=224, pool="avg")
        return model.eval()

    model, sources = deep(1), ("resclip-rcs", "scclip")
    pixels = pixels_for(model)[:1]
    before = encode_all(model, sources, pixels)
    reinitialise(model.visual.trunk.blocks[6], seed=8)
    fresh = deep(2)
    fresh.load_state_dict(model.state_dict())
    after, expected = encode_all(model, sources, pixels), encode_all(fresh, sources, pixels)
    for source in sources:
        assert torch.allclose(after[source], expected[source], atol=1e-6, rtol=0), source
        assert not torch.allclose(after[source], before[source], atol=1e-3), source
