"""Command-line flags generated from configuration dataclasses, so the CLI, the app and the
Python API share one definition of every knob.

A field's flag takes everything from the field: its type and default, its rule from the
annotation (:mod:`otviz.knobs`: ``Count`` refuses 0 and negatives, ``MethodName`` lists the
methods as choices) and its help from the comment written beside it (with any comment-only
lines just below). A comment rule ``# ---- title`` starts a group of flags in ``--help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from otviz.errors import UserInputError
from otviz.field_docs import FieldDoc, field_docs, field_rules
from otviz.knobs import (
    CLASS_SET_SOURCE,
    FEATURE_SOURCE_NAMES,
    AtLeast,
    ListOf,
    OneOf,
    SourceForm,
    feature_source_parts,
)

T = TypeVar("T")

#: How ``--help`` names a number flag's value (a text flag's is its name).
METAVARS: dict[type, str] = {int: "N", float: "X"}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """A flag's help ends with its default (an empty string shown as ``""``), unless the
    help already names it, there is none, or the flag is a switch that is off by default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default is None or (action.nargs == 0
                                                            and action.default is False):
            return text
        if action.default == "" and action.option_strings:
            return f'{text} (default: "")'
        return super()._get_help_string(action)


class CommandParser(argparse.ArgumentParser):
    """A parser whose usage errors are one line on stderr (``otviz train: error: argument
    --method: invalid choice: ...``) and exit status 2, not the usage block first: a
    command with fifty flags would bury the line that matters."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser(prog: str, description: str, **kwargs: Any) -> CommandParser:
    """An ``otviz`` command's parser: one-line usage errors, the shared help format."""
    return CommandParser(prog=prog, description=description, formatter_class=HelpFormatter,
                         **kwargs)


def at_least(kind: type, low: int | float) -> Callable[[str], Any]:
    """An argparse ``type`` reading ``kind`` and refusing values below ``low``."""

    def read(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {_kind_name(kind)}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
        return value

    read.__name__ = kind.__name__
    return read


def comma_list(rule: ListOf) -> Callable[[str], str]:
    """An argparse ``type`` checking each item of a comma list against ``rule`` (the text
    is kept as typed: the config field holds the list as a string)."""

    def read(text: str) -> str:
        if text.strip() in rule.also:
            return text
        unknown = [n for n in (t.strip() for t in text.split(",")) if n and n not in rule.names]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(map(repr, unknown))}; choose from {', '.join(rule.names)}")
        return text

    read.__name__ = "comma list"
    return read


def feature_source_text(text: str, classes: bool = False) -> str:
    """An argparse ``type`` checking a feature source's text (:class:`SourceForm`, its
    ``classes``: ``resclip`` admitted); the canonical text is kept."""
    try:
        kind, layer = feature_source_parts(text, classes)
    except UserInputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return kind if layer is None else f"{kind}:{layer}"


def _kind_name(kind: type) -> str:
    return {int: "an integer", float: "a number"}.get(kind, kind.__name__)


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type,
                        also: dict[str, tuple[str, ...]] | None = None) -> None:
    """Add ``--field-name`` for every ``int``/``float``/``str``/``bool`` field of dataclass
    ``cls`` (structured fields are set from Python). ``also`` adds choices to a field's
    (``{"method": ("all",)}``)."""
    rules = field_rules(cls)
    docs = field_docs(cls)
    groups: dict[str, argparse._ActionsContainer] = {}
    for f in dataclasses.fields(cls):
        tp, rule = rules[f.name]
        if tp not in (int, float, str, bool):
            continue
        doc = docs.get(f.name, FieldDoc("", ""))
        text = doc.help.replace("%", "%%")  # argparse expands %
        if doc.section and doc.section not in groups:
            groups[doc.section] = parser.add_argument_group(doc.section)
        target = groups.get(doc.section, parser)
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        if tp is bool:
            target.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=text)
            continue
        kw: dict[str, Any] = {"type": tp, "default": default, "help": text,
                              "metavar": METAVARS.get(tp)}
        if isinstance(rule, AtLeast):
            kw["type"] = at_least(tp, rule.low)
        elif isinstance(rule, OneOf):
            kw["choices"] = (*rule.names, *(also or {}).get(f.name, ()))
            kw["metavar"] = None  # argparse shows the choices
        elif isinstance(rule, SourceForm):
            kw["type"] = partial(feature_source_text, classes=rule.classes)
            kw["metavar"] = "|".join(
                (*FEATURE_SOURCE_NAMES, CLASS_SET_SOURCE) if rule.classes else FEATURE_SOURCE_NAMES)
        elif isinstance(rule, ListOf):
            kw["type"] = comma_list(rule)
            kw["metavar"] = "A,B,..."
            kw["help"] += f" (from: {', '.join((*rule.names, *rule.also))})"
        target.add_argument(flag, **kw)


def dataclass_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Build ``cls`` from the parsed flags added by :func:`add_dataclass_flags`."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if hasattr(args, f.name) and getattr(args, f.name) is not None
    }
    return cls(**values)
