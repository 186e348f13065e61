"""The registries' table refuses a key taken twice, and the facts a registry's modules
declare are read from their sources as importing them registers them: checked against a real
import of a package written here."""

from __future__ import annotations

import importlib
import textwrap
from pathlib import Path

import pytest

from otviz.registry import Registry, declared_classes


def test_a_key_taken_twice_is_refused_and_the_first_entry_kept() -> None:
    table: Registry[str, type] = Registry("widget")

    @table.under("a")
    class First:
        pass

    class Second:
        pass

    assert table.add("b", Second) is Second and list(table) == ["a", "b"]
    with pytest.raises(ValueError, match=r"widget 'a' is registered twice: .*First and .*Second"):
        table.add("a", Second)
    with pytest.raises(ValueError, match="widget 'b' is registered twice"):
        table.under("b")(First)
    assert table == {"a": First, "b": Second}


def test_a_class_key_is_named_by_its_name() -> None:
    table: Registry[type, str] = Registry("target of")
    table.add(int, "x")
    with pytest.raises(ValueError, match="target of int is registered twice: 'x' and 'y'"):
        table.add(int, "y")


PACKAGE = {
    "__init__.py": """
        import importlib
        import pkgutil

        from otviz.registry import Registry

        TABLE = Registry("thing")


        def register(cls):
            return TABLE.add(cls.name, cls)


        for _module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{_module.name}")
        """,
    "base.py": """
        class Base:
            name: str = ""
            order: int = 100
            size = 2 ** 3  # not a literal: not read
        """,
    "zeta.py": """
        from . import register
        from .base import Base


        @register
        class Late(Base):
            name = "late"
            order = 5


        class Helper(Base):  # not registered
            name = "helper"
        """,
    "alpha.py": """
        from . import register
        from .base import Base
        from .zeta import Late


        @register
        class First(Base):
            name = "first"


        @register
        class Child(Late):  # inherits order 5
            name = "child"


        @register
        class Second(Base):
            name = "second"
            order = 1
        """,
}


def test_declared_classes_match_what_importing_the_package_registers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "declared_pkg"
    folder.mkdir()
    for file, source in PACKAGE.items():
        (folder / file).write_text(textwrap.dedent(source))
    declared = declared_classes(folder, "register")
    assert declared == [
        {"name": "first", "order": 100},
        {"name": "child", "order": 5},
        {"name": "second", "order": 1},
        {"name": "late", "order": 5},
    ]
    monkeypatch.syspath_prepend(str(tmp_path))
    table = importlib.import_module("declared_pkg").TABLE
    assert {c.name: c.order for c in table.values()} == {c["name"]: c["order"] for c in declared}
    # alpha imports zeta's registered class, so zeta's registers first: the one case where
    # the sources' order is not the registration order (no module of otviz.methods does it)
    assert list(table) == ["late", "first", "child", "second"]
