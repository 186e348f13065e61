"""The package's layers point one way (ARCHITECTURE.md): every ``otviz`` import, at module
level or inside a function, goes from a module to one of the same or a lower layer, the
import graph has no cycle, the text layer knows nothing of the synthetic world, and what
loads heads, datasets or runs evaluations never imports the training code, except the
modules whose job is to run training.

Every import counts, under an ``if __name__ == "__main__":`` guard too: the package's one
script entry is ``otviz/__main__.py`` (``python -m otviz``, ``torchrun -m otviz``), in the
command line's layer, so no library module runs a command (which made ``otviz.cli`` and
``otviz.train`` import each other).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "otviz"

#: Lowest first: a module may import modules of its own layer or of a layer before it
#: (the first dotted part after ``otviz``: a subpackage or a top-level module).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "assets", "knobs", "registry", "field_docs", "worker_processes", "process_group"),
    ("boundary",),
    ("ot", "patch_grid"),
    ("methods",),
    ("text",),
    ("world",),
    ("checkpoints",),
    ("tiny_clip", "towers", "backbone", "backbone_spec"),
    ("data", "suite", "ood", "bench", "explainers"),
    ("explain",),
    ("train",),
    ("eval",),
    ("viz",),
    ("report",),
    ("ui",),
    ("cli", "__main__"),
)

#: Layers that load heads and datasets or evaluate them: no ``otviz.train`` imports...
NO_TRAINING = ("ui", "eval", "suite", "explain", "report")
#: ...except in the modules whose job is to run training.
RUN_TRAINING = frozenset(
    {
        "otviz.ui.train_tab",  # the Train view
        "otviz.ui.train_jobs",  # its background training jobs
        "otviz.ui.train_form",  # its form, generated from the training config
        "otviz.ui.train_policy",  # what a run may do on this server, as training configs
        "otviz.eval.ablation",  # trains the ConceptOT variants it compares
        "otviz.eval.otclip_table",  # pre-trains one tiny CLIP per OT-CLIP loss
    }
)
def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Dotted names of the ``otviz`` modules (or module attributes) ``tree`` imports."""
    found: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, *([base] if base else [])])
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
        stack.extend(ast.iter_child_nodes(node))
    return {name for name in found if name == "otviz" or name.startswith("otviz.")}


def import_graph() -> dict[str, set[str]]:
    """Module -> the ``otviz`` modules it imports (``from m import x`` counts as ``m.x`` when
    that is a module, else as ``m``)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for module, path in files.items():
        targets = set()
        for name in _imported(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            while name not in files:
                name = name.rpartition(".")[0]
            if name != module and name != "otviz":
                targets.add(name)
        graph[module] = targets
    return graph


def layer_of(module: str) -> int:
    top = module.split(".")[1]
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"{module}: no layer in LAYERS; add {top!r} to one")


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, iters = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(sorted(graph.get(nxt, ()))))
    return None


GRAPH = import_graph()


def test_every_module_has_a_layer() -> None:
    for module in GRAPH:
        if module != "otviz":
            layer_of(module)


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{a} -> {b}"
        for a, targets in GRAPH.items() if a != "otviz"
        for b in targets
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "imports into a higher layer:\n" + "\n".join(sorted(upward))


def test_no_import_cycles() -> None:
    assert _cycle(GRAPH) is None, " -> ".join(_cycle(GRAPH) or [])


def test_text_knows_nothing_of_the_world() -> None:
    leaks = [f"{a} -> {b}" for a, targets in GRAPH.items() if a.startswith("otviz.text")
             for b in targets if b.startswith("otviz.world")]
    assert not leaks, leaks


def test_loading_and_evaluating_never_imports_training() -> None:
    leaks = [
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        if a != "otviz" and a.split(".")[1] in NO_TRAINING and a not in RUN_TRAINING
        for b in targets
        if b.startswith("otviz.train")
    ]
    assert not leaks, "\n".join(sorted(leaks))


def test_the_graph_sees_imports_inside_functions() -> None:
    # the otviz.cli commands import what they run inside their main functions only
    assert "otviz.train.pretrain" in GRAPH["otviz.cli.pretrain"]
    assert "otviz.explain" in GRAPH["otviz.cli.explain"]


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_training_modules_load_without_the_command_line(preloaded_python) -> None:
    """Importing the training engines loads no ``otviz.cli`` module (checked in an
    interpreter where nothing of otviz was imported first: :mod:`tests.preloaded`)."""
    code = ("import sys, otviz.train.loop, otviz.train.pretrain\n"
            "print(sorted(m for m in sys.modules if m.startswith('otviz.cli')))")
    done = preloaded_python.run(code, ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_docs_layout_names_every_folder_and_module_of_the_package():
    """docs/layout.md is the map of the package: every subpackage and top-level module of
    ``otviz`` has its line there, and every ``otviz/...`` entry it lists exists."""
    layout = (ROOT / "docs" / "layout.md").read_text()
    listed = set(re.findall(r"^(otviz/[\w.]+/?)", layout, flags=re.MULTILINE))
    present = {
        f"otviz/{p.name}/" if p.is_dir() else f"otviz/{p.name}"
        for p in PACKAGE.iterdir()
        if (p / "__init__.py").exists() or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert present - listed == set(), "add these to docs/layout.md"
    assert listed - present == set(), "docs/layout.md lists what is gone"
