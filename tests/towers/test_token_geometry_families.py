"""Each tower family's stated token geometry (:attr:`otviz.towers.base.ImageTower.geometry`,
derived from strides, kernels and paddings by :func:`otviz.towers.geometry.trace_geometry`)
against an empirical one: where each token's gradient with respect to the pixels lies.

The empirical centre of token ``n`` is the centroid of ``|d <token_n, r> / d pixel|`` (summed
over colour channels, averaged over two random inputs, one random direction ``r`` of the
token's features), found by a mean shift: start at the naive cell centre (an even split of
the input), take the centroid of the gradient inside a window one stride either side, move
there, repeat. The window matters for towers whose tokens attend globally (ViTs, EVA, the
hybrid ViTamin, FastViT's last stage, Swin's last stage on a 7 x 7 grid): a token's
gradient then reaches every pixel, but its own patch (through the residual path) dominates
its neighbourhood, and the mean shift finds that. For open_clip's ViTs (the shipped tiny
CLIP, ViT-B-32, CoCa) the gradient is measured on the module that places the tokens
(``_spatial_path()``: the patch embedding, or otviz's convolutional stem), since their
positional embeddings fix the input size and the transformer only mixes tokens.

Convolutional towers are measured on a larger input than their native 64 px (2 x 2 tokens,
all on the border, whose windows the frame clips) so that interior tokens exist, with the
stated stride and origin laid on that grid: the derivation does not depend on the input
size for these towers. Only interior tokens are compared (a border token's receptive field
is cut by the zero padding, which pulls its gradient inwards).

Every feature source keeps these centres (the contract of :mod:`otviz.towers.dense`): each
dense last-block path and an intermediate layer, on the whole tower of an open_clip ViT and a
timm ViT, measured the same way (NACLIP's neighbourhood bias and ClearCLIP's dropped residual
change how far a token's gradient spreads, not where it is centred).

Tolerance: the mean offset over the interior tokens (the systematic placement error the
geometry would make) within ``max(1 px, stride / 8)`` per axis, and the median token within
``stride / 4``. Random weights make each token's gradient lopsided: by under a pixel for
the stems and patch embeddings, by up to 15 px for single tokens of FastViT (7 x 7
depthwise kernels and an attention stage at stride 32), whose mean still lands 0.3 / 1.9 px
from the stated centre and 15.8 / 17.4 px from the naive one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import Tensor

from otviz.backbone import Backbone
from otviz.patch_grid.tokens import TokenGeometry
from otviz.towers.base import ImageTower
from otviz.towers.sources import parse_feature_source
from tests.towers.conftest import shrunk_backbone


@dataclass(frozen=True)
class Case:
    """One family: how to build it, the input edge to measure on (``None``: native) and
    which module's tokens are measured (``"tower"`` or ``"spatial"``)."""

    build: str
    size: int | None = None
    measure: str = "tower"
    source: str = "last"


FAMILIES: dict[str, Case] = {
    "tiny-clip-conv-stem": Case("tiny-conv", measure="spatial"),
    "tiny-clip-patch": Case("tiny-patch", measure="spatial"),
    "open_clip-vit": Case("ViT-B-32", measure="spatial"),
    "open_clip-coca": Case("coca_ViT-B-32", measure="spatial"),
    "open_clip-modified-resnet": Case("RN50", size=160),
    "timm-vit": Case("ViT-B-16-SigLIP"),
    "timm-eva": Case("EVA02-B-16"),
    "timm-convnext": Case("convnext_base", size=192),
    "timm-fastvit": Case("MobileCLIP2-S0", size=192),
    "timm-swin": Case("swin_base_patch4_window7_224"),
    "timm-hybrid-vitamin": Case("ViTamin-S"),
}


def _tiny(tmp: Path, stem: str) -> Backbone:
    from otviz.tiny_clip.model import create_tiny_clip, save_tiny_clip, tiny_clip_config

    cfg = tiny_clip_config(embed_dim=32, vision_width=32, vision_layers=1, vision_heads=2,
                           text_width=32, text_layers=1, text_heads=2, vision_stem=stem)
    save_tiny_clip(tmp / stem, create_tiny_clip(cfg, seed=0), cfg, {})
    return Backbone.from_checkpoint(tmp / stem)


def _tokens(tower: ImageTower, measure: str, source: str = "last",
            ) -> Callable[[Tensor], Tensor]:
    """``pixels [1, 3, H, W] -> [gh, gw, C]`` tokens of the measured module (the tower's
    feature ``source`` when not ``last``)."""
    if source != "last":
        chosen = parse_feature_source(source)
        return lambda x: tower.encode(x, chosen)[0][0].reshape(*tower.grid, -1)
    if measure == "spatial":
        module, _ = tower._spatial_path()
        return lambda x: module(x)[0].permute(1, 2, 0)
    visual = tower.visual

    def tokens(x: Tensor) -> Tensor:
        if hasattr(visual, "trunk") or hasattr(visual, "attnpool"):  # any input size
            out = visual.forward_intermediates(x, indices=1, intermediates_only=True)
            spatial = out["image_intermediates"][-1]
            final_conv = getattr(getattr(visual, "trunk", None), "final_conv", None)
            if final_conv is not None:  # FastViT, as TimmTower reads it
                spatial = final_conv(spatial)
            return spatial[0].permute(1, 2, 0)
        return tower.encode(x)[0][0].reshape(*tower.grid, -1)  # a ViT at its native size

    return tokens


def gradient_maps(tokens: Callable[[Tensor], Tensor], size: tuple[int, int],
                  seed: int = 0, inputs: int = 2) -> Tensor:
    """``[gh, gw, H, W]`` mean over ``inputs`` random inputs of ``|d <token, r> / d pixel|``
    summed over the colour channels, for one random direction ``r``."""
    gen = torch.Generator().manual_seed(seed)
    width, height = size
    total: Tensor | None = None
    for _ in range(inputs):
        x = torch.randn(1, 3, height, width, generator=gen, requires_grad=True)
        out = tokens(x)
        r = torch.randn(out.shape[-1], generator=gen)
        maps = torch.stack([
            torch.stack([torch.autograd.grad((out[i, j] * r).sum(), x, retain_graph=True)[0][0]
                         .abs().sum(0) for j in range(out.shape[1])])
            for i in range(out.shape[0])])
        total = maps if total is None else total + maps
    return total / inputs


def mean_shift_centres(maps: Tensor, start: Tensor, half: tuple[float, float],
                       steps: int = 20) -> Tensor:
    """``[N, 2]`` ``(x, y)``: each map's centroid inside a window of ``half`` pixels either
    side of the current centre, moved there until it rests (from ``start`` ``[N, 2]``)."""
    n, height, width = maps.shape
    xs = torch.arange(width, dtype=torch.float64) + 0.5
    ys = torch.arange(height, dtype=torch.float64) + 0.5
    m = maps.double()
    centre = start.clone()
    for _ in range(steps):
        inside_x = (xs[None] - centre[:, :1]).abs() <= half[0]
        inside_y = (ys[None] - centre[:, 1:]).abs() <= half[1]
        w = m * inside_y[:, :, None] * inside_x[:, None, :]
        mass = w.sum((1, 2))
        new = torch.stack([(w.sum(1) * xs).sum(1) / mass, (w.sum(2) * ys).sum(1) / mass], 1)
        if torch.allclose(new, centre, atol=1e-3):
            return new
        centre = new
    return centre


@dataclass
class Measured:
    stated: TokenGeometry
    empirical: Tensor  # [N, 2] on the interior tokens
    interior: Tensor  # [N] token indices


def measure(name: str, tmp: Path, hf_dir: Path, case: Case | None = None) -> Measured:
    case = case or FAMILIES[name]
    torch.manual_seed(0)
    if case.build == "shipped":
        from otviz.tiny_clip.model import DEFAULT_CHECKPOINT

        backbone = Backbone.from_checkpoint(DEFAULT_CHECKPOINT)
    elif case.build.startswith("tiny-"):
        backbone = _tiny(tmp, case.build.removeprefix("tiny-"))
    else:
        backbone = shrunk_backbone(case.build, hf_dir)
    tower = backbone.image_tower
    tower.visual.eval()
    native = tower.geometry
    size = native.size if case.size is None else (case.size, case.size)
    maps = gradient_maps(_tokens(tower, case.measure, case.source), size)
    grid = (maps.shape[0], maps.shape[1])
    stated = TokenGeometry(grid, size, native.stride, native.origin)
    gh, gw = grid
    interior = torch.tensor([i * gw + j for i in range(1, gh - 1) for j in range(1, gw - 1)])
    naive = TokenGeometry.cell_centred(grid, size).centres()[interior]
    half = (native.stride[0], native.stride[1])
    found = mean_shift_centres(maps.reshape(gh * gw, *maps.shape[2:])[interior], naive, half)
    return Measured(stated, found, interior)


@pytest.fixture(scope="module")
def measured(tmp_path_factory, hf_dir) -> Callable[[str], Measured]:
    cache: dict[str, Measured] = {}
    tmp = tmp_path_factory.mktemp("tiny")

    def get(name: str) -> Measured:
        if name not in cache:
            torch.set_num_threads(1)
            cache[name] = measure(name, tmp, hf_dir)
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_stated_centres_are_where_the_gradient_is(measured, name):
    assert_centred(measured(name), name)


def assert_centred(m: Measured, name: str) -> None:
    """The tolerance of the module docstring on the interior tokens."""
    offset = m.empirical - m.stated.centres()[m.interior]
    stride = torch.tensor(m.stated.stride, dtype=torch.float64)
    assert len(m.interior) >= 4
    mean = offset.mean(0).abs()
    assert (mean <= torch.clamp(stride / 8, min=1.0)).all(), (name, offset.mean(0).tolist())
    median = offset.abs().median(0).values
    assert (median <= stride / 4).all(), (name, median.tolist())


@pytest.mark.parametrize(("name", "beyond"), [("tiny-clip-conv-stem", 2.0),
                                              ("timm-fastvit", 8.0)])
def test_off_centre_towers_are_measurably_off_the_cell_centre(measured, name, beyond):
    """The negative control: otviz's convolutional stem (stated: 3.5 px up-left of the cell
    centre at stride 8) and FastViT (15.5 px up-left at stride 32: every stride-2 layer is
    a centred 3 x 3 or 7 x 7 convolution) do not look at their cells' centres; the
    gradient agrees, more than ``beyond`` px up-left of the naive centre on each axis."""
    m = measured(name)
    naive = TokenGeometry.cell_centred(m.stated.grid, m.stated.size).centres()[m.interior]
    assert m.stated.origin == (0.5, 0.5)
    assert ((m.empirical - naive).mean(0) < -beyond).all()


#: Also measured by the table below (``python -m tests.towers.test_token_geometry_families``):
#: the shipped tiny CLIP's trained weights, on its stem and through the whole tower.
SHIPPED = {"shipped tiny CLIP, stem": Case("shipped", measure="spatial"),
           "shipped tiny CLIP, whole tower": Case("shipped")}


def main() -> None:
    """Print each family's stated stride and origin and the measured mean offsets (the
    table of docs/backbones.md's "Token geometry")."""
    import tempfile

    torch.set_num_threads(1)
    print("| family | input | grid | stride | origin (stated) | measured - stated "
          "(mean, px) | measured - cell centre (mean, px) |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        cases = {**{k: FAMILIES[k] for k in FAMILIES}, **SHIPPED}
        for name, case in cases.items():
            m = measure(name, Path(tmp), Path(tmp), case)
            naive = TokenGeometry.cell_centred(m.stated.grid, m.stated.size).centres()
            off = (m.empirical - m.stated.centres()[m.interior]).mean(0).tolist()
            cell = (m.empirical - naive[m.interior]).mean(0).tolist()
            print(f"| {name} | {m.stated.size[0]} px | {m.stated.grid[0]} x {m.stated.grid[1]} "
                  f"| {m.stated.stride[0]:g} | {m.stated.origin[0]:g} | "
                  f"{off[0]:+.2f}, {off[1]:+.2f} | {cell[0]:+.2f}, {cell[1]:+.2f} |")


if __name__ == "__main__":
    main()


@pytest.mark.parametrize("source", ["maskclip", "sclip", "clearclip", "naclip", "layer:0"])
@pytest.mark.parametrize("build", ["ViT-B-32", "ViT-B-16-SigLIP"])
def test_every_feature_source_keeps_the_stated_centres(tmp_path, hf_dir, build, source):
    assert_centred(measure(build, tmp_path, hf_dir, Case(build, source=source)), source)


def test_another_threads_forward_meanwhile_leaves_the_traced_geometry_alone():
    """A forward of the same tower on another thread (at twice the size) while the hooks are
    on is not recorded: recorded, its second convolution's 32 -> 16 step would be read as the
    first step of the 32 px trace."""
    import threading

    from otviz.towers.geometry import trace_geometry

    tower = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, stride=2, padding=1),
                                torch.nn.Conv2d(4, 4, 2, stride=2))

    def grid(pixels):
        return tuple(tower(pixels).shape[-2:])

    def meanwhile(pixels):
        other = threading.Thread(target=lambda: tower(torch.zeros(1, 3, 64, 64)))
        other.start()
        other.join()
        return grid(pixels)

    with torch.no_grad():
        alone = trace_geometry(tower, grid, (32, 32))
        crowded = trace_geometry(tower, meanwhile, (32, 32))
    assert crowded == alone
    assert alone.centres()[0].tolist() == [1.5, 1.5]  # 2 (2 o + 0.5) + 0.5 at o = 0
