"""Command-line flags generated from configuration dataclasses, so the CLI, the app and the
Python API share one definition of every knob.

A field's flag takes everything from the field: its type and default, its rule from the
annotation (:mod:`otviz.knobs`: ``Count`` refuses 0 and negatives, ``MethodName`` lists the
methods as choices) and its help from the comment written beside it (with any comment-only
lines just below). A comment rule ``# ---- title`` starts a group of flags in ``--help``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from otviz.knobs import AtLeast, ListOf, OneOf

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


def _kind_name(kind: type) -> str:
    return {int: "an integer", float: "a number"}.get(kind, kind.__name__)


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """A field's help (its comment) and the group it is listed under (``""``: none)."""

    help: str
    section: str


def _is_rule(comment: str) -> bool:
    return comment.lstrip("# ").startswith("---")


def field_docs(cls: type) -> dict[str, FieldDoc]:
    """Each field of dataclass ``cls``: the comment on its line plus the comment-only lines
    right below it, and the title of the last ``# ---- title`` rule above it. Empty when the
    source cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments = {tok.start[0]: tok.string for tok in
                tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    lines = source.splitlines()
    body = typing.cast(ast.ClassDef, ast.parse(source).body[0]).body
    fields = [(n.target.id, n.lineno, n.end_lineno or n.lineno) for n in body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    docs, section = {}, ""
    for i, (name, start, end) in enumerate(fields):
        rules = [comments[n] for n in range(fields[i - 1][2] + 1 if i else 1, start)
                 if n in comments and _is_rule(comments[n])]
        if rules:
            section = rules[-1].lstrip("# ").lstrip("-").strip()
        parts = [comments.get(end, "")]
        n = end + 1
        while n in comments and lines[n - 1].strip().startswith("#") and not _is_rule(
                comments[n]):
            parts.append(comments[n])
            n += 1
        text = " ".join(p.lstrip("#").strip() for p in parts if p)
        docs[name] = FieldDoc(text.replace("%", "%%"), section)  # argparse expands %
    return docs


def _rule(tp: Any) -> tuple[Any, AtLeast | OneOf | ListOf | None]:
    """``(base type, rule)`` of an annotation: ``Annotated[int, AtLeast(1)]`` ->
    ``(int, AtLeast(1))``, ``X | None`` -> ``(X, None)``."""
    rule = None
    if typing.get_origin(tp) is typing.Annotated:
        tp, *extras = typing.get_args(tp)
        rule = next((e for e in extras if isinstance(e, (AtLeast, OneOf, ListOf))), None)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        tp = args[0]
    return tp, rule


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type,
                        also: dict[str, tuple[str, ...]] | None = None) -> None:
    """Add ``--field-name`` for every ``int``/``float``/``str``/``bool`` field of dataclass
    ``cls`` (structured fields are set from Python). ``also`` adds choices to a field's
    (``{"method": ("all",)}``)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = field_docs(cls)
    groups: dict[str, argparse._ActionsContainer] = {}
    for f in dataclasses.fields(cls):
        tp, rule = _rule(hints[f.name])
        if tp not in (int, float, str, bool):
            continue
        doc = docs.get(f.name, FieldDoc("", ""))
        if doc.section and doc.section not in groups:
            groups[doc.section] = parser.add_argument_group(doc.section)
        target = groups.get(doc.section, parser)
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        if tp is bool:
            target.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=doc.help)
            continue
        kw: dict[str, Any] = {"type": tp, "default": default, "help": doc.help,
                              "metavar": METAVARS.get(tp)}
        if isinstance(rule, AtLeast):
            kw["type"] = at_least(tp, rule.low)
        elif isinstance(rule, OneOf):
            kw["choices"] = (*rule.names, *(also or {}).get(f.name, ()))
            kw["metavar"] = None  # argparse shows the choices
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
