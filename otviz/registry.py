"""The package's registries (methods, explainers, tower adapters): a table
filled by registration decorators that refuses a key taken twice (:class:`Registry`), and the
names a registry's modules declare, read from their sources without importing them
(:func:`declared_classes`), so the command line lists a registry's names without loading
torch. Importable without torch.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def _named(thing: Any) -> str:
    """A class or function by its dotted path; anything else by its repr."""
    qualname = getattr(thing, "__qualname__", None)
    return f"{thing.__module__}.{qualname}" if qualname else repr(thing)


class Registry(dict[K, V]):
    """``key -> entry`` in registration order. :meth:`add` (and the decorator :meth:`under`)
    refuse a key that is already taken: a second entry under one key is an error that names
    both, not a silent replacement of the first.

    Args:
        what: what an entry is, for the error ("method", "explainer", ...).
    """

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def add(self, key: K, entry: V) -> V:
        """Put ``entry`` under ``key`` and return it; ``ValueError`` when ``key`` is taken."""
        if key in self:
            raise ValueError(f"{self.what} {getattr(key, '__name__', repr(key))} is registered "
                             f"twice: {_named(self[key])} and {_named(entry)}")
        self[key] = entry
        return entry

    def under(self, key: K) -> Callable[[V], V]:
        """Decorator putting what it decorates under ``key`` (:meth:`add`)."""
        return lambda entry: self.add(key, entry)


def _literals(node: ast.ClassDef) -> dict[str, Any]:
    """The class body's ``name = <literal>`` (or annotated) assignments."""
    found: dict[str, Any] = {}
    for stmt in node.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:
                continue  # not a literal: not a fact this reader can know
    return found


def _decorated_by(node: ast.ClassDef, decorator: str) -> bool:
    return any(
        (isinstance(d, ast.Name) and d.id == decorator)
        or (isinstance(d, ast.Attribute) and d.attr == decorator)
        for d in node.decorator_list
    )


def declared_classes(folder: Path, decorator: str) -> list[dict[str, Any]]:
    """The literal class attributes of every class decorated with ``@decorator`` in the
    modules of ``folder``, read with :mod:`ast` (nothing is imported). Modules come by file
    name and classes in source order: the order a package that imports its modules by name
    (``pkgutil.iter_modules``) registers them in, unless one of them imports another's
    registered class, which registers that one first. An attribute a class does not set is
    taken from its nearest base class (first base first) defined in one of those modules, as
    Python's attribute lookup would for single inheritance."""
    classes: dict[str, tuple[ast.ClassDef, dict[str, Any]]] = {}
    chosen: list[str] = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (node, _literals(node))
                if _decorated_by(node, decorator):
                    chosen.append(node.name)

    def facts(name: str) -> dict[str, Any]:
        node, own = classes[name]
        merged: dict[str, Any] = {}
        for base in reversed(node.bases):
            if isinstance(base, ast.Name) and base.id in classes:
                merged.update(facts(base.id))
        return merged | own

    return [facts(name) for name in chosen]
