"""Command-line flags generated from configuration dataclasses, so the CLI, the app and the
Python API share one definition of every knob."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def _flag_type(tp: Any) -> type | None:
    """The argparse ``type`` of a field annotation (``X | None`` -> ``X``); ``None`` for
    structured fields (lists, dicts, nested configs), which are set from Python."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        tp = args[0]
    return tp if tp in (int, float, str) else None


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add ``--field-name`` for every field of dataclass ``cls`` (defaults from the class)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif (flag_type := _flag_type(tp)) is not None:
            parser.add_argument(flag, type=flag_type, default=default, help=f"(default: {default})")


def dataclass_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Build ``cls`` from the parsed flags added by :func:`add_dataclass_flags`."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if hasattr(args, f.name) and getattr(args, f.name) is not None
    }
    return cls(**values)
