"""A tower family's facts live on its adapter in otviz/towers (issue 53.1): no module outside
otviz/towers asks ``isinstance`` / ``issubclass`` of an open_clip or timm module class (read
from the sources with ``ast``, imports resolved), and the per-family tables that did
(``CAM_TARGETS``, ``TOWER_BLOCKS``) are gone."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from torch import nn

PACKAGE = Path(__file__).resolve().parents[2] / "otviz"
LIBRARIES = ("open_clip", "timm")


def _library_classes(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted path of every name a module binds from open_clip or timm
    (``from open_clip.x import Y``, ``import timm``, ``import open_clip.x as oc``)."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    bound[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0])
    return bound


def _dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    """The library path ``node`` names (``Name`` or an ``Attribute`` chain on a bound name)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in bound:
        return ".".join([bound[node.id], *reversed(parts)])
    return None


def _resolve(path: str) -> object:
    """The object at a dotted library path (module attributes after the longest module)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def module_class_checks(source: str) -> list[str]:
    """``"line: path"`` of every ``isinstance`` / ``issubclass`` on an open_clip or timm
    ``nn.Module`` class in ``source``."""
    tree = ast.parse(source)
    bound = _library_classes(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
            continue
        kinds = node.args[1]
        for kind in kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]:
            path = _dotted(kind, bound)
            obj = _resolve(path) if path else None
            if isinstance(obj, type) and issubclass(obj, nn.Module):
                found.append(f"{node.lineno}: {path}")
    return found


def test_the_scan_finds_a_check_on_a_tower_class():
    planted = ("import open_clip\nfrom timm.models.eva import Eva as E\n"
               "from open_clip.tokenizer import SimpleTokenizer\n"
               "isinstance(v, open_clip.transformer.VisionTransformer)\n"
               "isinstance(v, (int, E))\nisinstance(t, SimpleTokenizer)\n")
    assert module_class_checks(planted) == [
        "4: open_clip.transformer.VisionTransformer", "5: timm.models.eva.Eva"]


def test_no_module_outside_the_towers_checks_a_tower_class():
    found = {str(path.relative_to(PACKAGE.parent)): hits
             for path in sorted(PACKAGE.rglob("*.py"))
             if PACKAGE / "towers" not in path.parents
             and (hits := module_class_checks(path.read_text(encoding="utf-8")))}
    assert found == {}


def test_the_per_family_tables_are_gone():
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "CAM_TARGETS" not in text and "TOWER_BLOCKS" not in text, path


#: The families of tests/towers/conftest.py whose tower has no attention to read.
CONVOLUTIONAL = {"resnet", "timm-convnext", "timm-fastvit-mobileclip2"}


def test_every_family_answers_its_facts(family):
    """Each real family's adapter names modules of its own tower for Grad-CAM and MPRT, and a
    transformer's attention reader re-runs the tower's own forward (its readout of the last
    tokens is the model's image embedding, up to CoCa's unit scaling); a convolutional tower
    refuses the reader with the reason."""
    import torch

    from otviz.towers.facts import FamilyUnsupportedError

    name, backbone = family
    tower, visual = backbone.image_tower, backbone.model.visual
    own = {id(m) for m in visual.modules()}
    blocks = tower.randomisation_blocks()
    assert len(blocks) >= 2 and all(id(b) in own for b in blocks)
    assert id(tower.cam_target().layer) in own
    if name in CONVOLUTIONAL:
        try:
            tower.attention_reader()
        except FamilyUnsupportedError as e:
            assert "attention" in str(e)
        else:
            raise AssertionError(f"{name}: a convolutional tower gave an attention reader")
        return
    reader = tower.attention_reader()
    pixels = torch.randn(2, 3, *tower.image_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trace = reader.trace(pixels)
        ours, theirs = (torch.nn.functional.normalize(e, dim=-1) for e in (  # CoCa's: unit
            reader.readout(trace.tokens[-1]), backbone.model.encode_image(pixels)))
        assert torch.allclose(ours, theirs, atol=1e-5)
    assert len(trace.maps) == len(blocks) and reader.grid == backbone.grid
