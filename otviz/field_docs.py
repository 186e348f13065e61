"""What a configuration dataclass says about each of its fields, read once for every
front end: the help (the comment written beside the field, with any comment-only lines
just below it), the group it belongs to (the title of the last ``# ---- title`` rule above
it) and its rule (the :mod:`otviz.knobs` annotation: ``AtLeast``, ``OneOf``, ``ListOf``).

The command line (:func:`otviz.cli.args.add_dataclass_flags`) turns them into flags and
``--help``; the app's Train form (:mod:`otviz.ui.train_form`) into labelled components with
the same help. Importable without torch.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import threading
import tokenize
import types
import typing
from typing import Any

from otviz.knobs import AtLeast, ListOf, OneOf, SourceForm

Rule = AtLeast | OneOf | ListOf | SourceForm


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """A field's help (its comment, as written) and the group it is listed under (``""``:
    none)."""

    help: str
    section: str


def _is_rule(comment: str) -> bool:
    return comment.lstrip("# ").startswith("---")


#: CPython 3.11's ``ast.parse`` is not thread-safe: two server threads parsing at once fail
#: with "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905), as the
#: Train tab's form did under concurrent requests. A class's docs are parsed once, under
#: this lock, and kept.
_PARSE_LOCK = threading.Lock()


def field_docs(cls: type) -> dict[str, FieldDoc]:
    """Each field of dataclass ``cls``: the comment on its line plus the comment-only lines
    right below it, and the title of the last ``# ---- title`` rule above it. Empty when the
    source cannot be read. Read once per class (:data:`_PARSE_LOCK`); a fresh dict each call."""
    with _PARSE_LOCK:
        docs = _parsed_field_docs(cls)
    return dict(docs)


@functools.cache
def _parsed_field_docs(cls: type) -> dict[str, FieldDoc]:
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
        docs[name] = FieldDoc(" ".join(p.lstrip("#").strip() for p in parts if p), section)
    return docs


def field_rule(tp: Any) -> tuple[Any, Rule | None]:
    """``(base type, rule)`` of an annotation: ``Annotated[int, AtLeast(1)]`` ->
    ``(int, AtLeast(1))``, ``X | None`` -> ``(X, None)``."""
    rule = None
    if typing.get_origin(tp) is typing.Annotated:
        tp, *extras = typing.get_args(tp)
        rule = next((e for e in extras if isinstance(e, Rule)), None)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        tp = args[0]
    return tp, rule


def field_rules(cls: type) -> dict[str, tuple[Any, Rule | None]]:
    """:func:`field_rule` of every field of dataclass ``cls``."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: field_rule(hints[f.name]) for f in dataclasses.fields(cls)}
