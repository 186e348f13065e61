"""Every token-to-pixel placement goes through the token-geometry contract (issue 34).

Where a token looks, the pixels it owns and how its value is drawn over a picture are
:class:`otviz.patch_grid.tokens.TokenGeometry`'s answers, derived per tower by
:mod:`otviz.towers.geometry`. No other module of the package may compute cell centres or
stretch a token grid over pixels on its own: each idiom below is how that was done before
the contract (an even split of the picture, tokens on its cells' centres), and it is wrong
for any tower whose tokens are not centred on an even split (otviz's convolutional stem is
3.5 px off). The source is scanned with comments and strings blanked; the allow-list names
each legitimate use and why.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "otviz"
#: The two modules that own the geometry.
OWNERS = {"patch_grid/tokens.py", "towers/geometry.py"}

#: rule -> (what it catches, pattern on code with comments and strings blanked).
RULES: dict[str, tuple[str, re.Pattern[str]]] = {
    "cell-centre": ("a cell centre (c + 0.5) * cell, or (c + 0.5) / n",
                    re.compile(r"\+\s*0\.5\s*\)\s*[*/]")),
    "grid-divide": ("pixels split evenly by the token grid (width / grid[1], size // gw)",
                    re.compile(r"//?\s*(?:[\w.]*grid\w*\s*\[|g[hw]\b)")),
    "pool-to-grid": ("pixels pooled onto the grid by an adaptive pooling",
                     re.compile(r"adaptive_(?:avg|max)_pool[123]d\s*\(")),
    "interpolate": ("a map resampled by torch's interpolate (cell-aligned corners)",
                    re.compile(r"\binterpolate\s*\(")),
    "pil-stretch": ("a raster stretched by Pillow's resampling",
                    re.compile(r"Resampling\.(?:BILINEAR|BICUBIC|LANCZOS|NEAREST|BOX)|"
                               r"Image\.(?:BILINEAR|BICUBIC|NEAREST)\b")),
}

#: (module, rule, code fragment) -> why it is not a token placement. Keep each entry narrow.
ALLOWED: dict[tuple[str, str, str], str] = {
    # the synthetic world's renderer places its own shapes' pixels, not tokens
    ("world/render.py", "cell-centre", "(np.arange(n) + 0.5) / n"):
        "colour jitter sampled at pixel centres of a shape's own raster",
    ("world/render.py", "cell-centre", "(np.arange(size) + 0.5) / size"):
        "texture lattice of the rendered world, not the token grid",
    # a panel's photo is resized to the panel; the heat is drawn by heat_fields
    ("viz/panels.py", "pil-stretch", "Image.fromarray(image).resize(size, Image.Resampling"):
        "resizes the photo under the heat, which heat_fields draws through the geometry",
    # a real data set's photo is fitted to the model's input before it is encoded
    ("eval/world_set.py", "pil-stretch", "image = image.resize(self.frame, Image.Resampling"):
        "fits the photo itself to the model input (its boxes scaled alike; the geometry is "
        "then taken on the fitted picture)",
    # ProxyCLIP's own step: CLIP's values resized onto the proxy backbone's token grid
    ("towers/proxy.py", "interpolate", "maps = F.interpolate(maps, size=proxy_grid, mode="):
        "resamples CLIP's value grid onto the proxy's token grid, as ProxyCLIP's "
        "transformer.py does; the tokens' geometry is then traced from the proxy's own "
        "patch embedding (ProxyTower._spatial_path)",
    # a segmentation set's sliding window fits the photo itself before it is cut into
    # windows, and the class maps drawn on its pixels go back to the labels' pixels
    ("eval/sliding_window.py", "pil-stretch", "image = image.resize(size, Image.Resampling"):
        "resizes the photo itself to the window's short side (the geometry is then taken on "
        "each cut window)",
    ("eval/sliding_window.py", "interpolate", "return F.interpolate(mean[None], size=(h, w)"):
        "resamples a pixel raster (already drawn through the geometry) to the label mask's "
        "pixels, as mmseg's slide_inference resizes its logits to the label size",
    # an upload larger than the app keeps is shrunk before anything is computed on it
    ("ui/inputs.py", "pil-stretch", "to_rgb(image).resize(new, Image.Resampling.LANCZOS)"):
        "shrinks the uploaded photo itself (the geometry is then taken on the shrunk picture)",
    # ResCLIP's SFR labels its patches as the authors' code does: the patch-class logits
    # resized to the image (bilinear, align_corners False), then a vote per patch's cell
    ("towers/resclip_sfr.py", "interpolate", "logits = F.interpolate(logits, size=size, mode="):
        "reproduces ResCLIP's own first-pass segmentation (clip/model.py, the patch logits "
        "resized to the image before the per-patch vote): a step of the source's definition, "
        "not a placement of tokens for a view or a metric",
    # a ViT run at a larger input resizes its position embeddings to the larger grid
    ("towers/vit.py", "interpolate", "patch = F.interpolate(patch, size=grid, mode="):
        "resizes the position-embedding table to the token grid (the geometry of the larger "
        "grid is traced from the patch embedding itself)",
}

#: Calls that put token values on pixels through the geometry; a function of the package
#: that calls one of them (directly or through another) makes a pixel raster too.
RASTER_CALLS = {"upsample", "paint", "pixel_masks"}


def blank_strings(source: str) -> str:
    """``source`` with every string literal replaced by ``''`` and comments removed, line
    structure kept (so a pattern in a docstring or a comment is not code)."""
    lines = source.splitlines(keepends=True)
    out = [list(line) for line in lines]
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.STRING, tokenize.COMMENT):
            continue
        (r0, c0), (r1, c1) = tok.start, tok.end
        for r in range(r0, r1 + 1):
            start = c0 if r == r0 else 0
            end = c1 if r == r1 else len(out[r - 1]) - (1 if lines[r - 1].endswith("\n") else 0)
            for c in range(start, end):
                out[r - 1][c] = " "
    return "".join("".join(line) for line in out)


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    return None


def raster_functions(trees: dict[str, ast.Module]) -> set[str]:
    """:data:`RASTER_CALLS` and every package function that calls one (to a fixed point)."""
    bodies = {fn.name: {_call_name(c) for c in ast.walk(fn)} - {None}
              for tree in trees.values() for fn in ast.walk(tree)
              if isinstance(fn, ast.FunctionDef)}
    known = set(RASTER_CALLS)
    while True:
        more = {name for name, calls in bodies.items() if calls & known} - known
        if not more:
            return known
        known |= more


def imshow_violations(tree: ast.Module, rasters: set[str]) -> list[tuple[int, str]]:
    """``imshow(x, extent=...)`` where ``x`` is neither the image nor a pixel raster made
    through the geometry (a token grid stretched over the extent, cell-centred)."""
    found = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        made = {t.id for a in ast.walk(fn) if isinstance(a, ast.Assign)
                for t in a.targets if isinstance(t, ast.Name)
                if any(_call_name(c) in rasters for c in ast.walk(a.value))}
        for call in (n for n in ast.walk(fn) if _call_name(n) == "imshow"):
            if not call.args or not any(k.arg == "extent" for k in call.keywords):
                continue
            x = call.args[0]
            ok = (isinstance(x, ast.Name) and (x.id == "image" or x.id in made)) or any(
                _call_name(c) in rasters for c in ast.walk(x))
            if not ok:
                found.append((call.lineno, f"imshow of {ast.unparse(x)} stretched over an extent"))
    return found


def violations(root: Path) -> list[str]:
    """Every place under the package ``root`` that places tokens on pixels on its own."""
    sources = {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.py"))}
    sources = {k: v for k, v in sources.items() if k not in OWNERS}
    trees = {k: ast.parse(v) for k, v in sources.items()}
    rasters = raster_functions(trees)
    found = []
    for name, source in sources.items():
        raw = source.splitlines()
        for number, line in enumerate(blank_strings(source).splitlines(), start=1):
            for rule, (_, pattern) in RULES.items():
                if pattern.search(line) and not any(
                        m == name and r == rule and frag in raw[number - 1]
                        for m, r, frag in ALLOWED):
                    found.append(f"{name}:{number}: {rule}: {raw[number - 1].strip()}")
        found += [f"{name}:{n}: imshow-extent: {what}"
                  for n, what in imshow_violations(trees[name], rasters)]
    return found


def test_no_module_places_tokens_on_pixels_on_its_own():
    found = violations(PACKAGE)
    assert not found, ("token placement outside the geometry contract "
                       "(use TokenGeometry, or allow-list it with a reason):\n"
                       + "\n".join(found))


def test_every_allowed_use_still_exists():
    """An allow-list entry whose code is gone is removed, so the list stays exact."""
    for module, _, fragment in ALLOWED:
        assert fragment in (PACKAGE / module).read_text(), (module, fragment)


#: The drawing code of main at 10fa142 (before this contract reached the views), verbatim:
#: each fragment must be caught.
BEFORE = {
    "viz/regions.py": (
        "def mask_centre(mask, grid, size):\n"
        "    ys, xs = np.nonzero(np.asarray(mask, dtype=bool).reshape(grid))\n"
        "    return (xs.mean() + 0.5) * size[1] / grid[1], (ys.mean() + 0.5) * size[0] / grid[0]\n"
        "def mask_outline(mask, grid, size):\n"
        "    gh, gw = grid\n"
        "    height, width = size\n"
        "    sy, sx = height / gh, width / gw\n"),
    "viz/heatmaps.py": (
        "def draw_heatmap(ax, image, heat):\n"
        "    height, width = image.shape[:2]\n"
        "    ax.imshow(image, extent=(0, width, height, 0), interpolation='nearest')\n"
        "    mappable = ax.imshow(heat, extent=(0, width, height, 0), cmap=cmap, alpha=alpha,\n"
        "                         interpolation='bilinear')\n"),
    "viz/panels.py": (
        "def _blend(grey, heat, vmin, vmax, cmap, alpha):\n"
        "    field = Image.fromarray(np.asarray(heat, dtype=np.float32), mode='F')\n"
        "    level = field.resize(grey.size, Image.Resampling.BILINEAR)\n"),
    "explainers/base.py": (
        "def maps(self, pixels, text, grid):\n"
        "    heat = F.interpolate(heat[:, None], size=grid, mode='area')[:, 0]\n"),
    "eval/trust/metrics.py": (
        "def trust_scores(scorer, pixels, settings):\n"
        "    patch = settings.patch or pixels.shape[-1] // scorer.grid[1]\n"),
    "patch_grid/masks.py": (
        "def patch_means(image, grid):\n"
        "    pooled = torch.nn.functional.adaptive_avg_pool2d(image[None], grid)[0]\n"),
}


@pytest.mark.parametrize("module", sorted(BEFORE))
def test_the_check_catches_the_old_drawing_code(tmp_path, module):
    path = tmp_path / module
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(BEFORE[module])
    assert violations(tmp_path), module
