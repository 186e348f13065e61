"""Griffe extension (mkdocs.yml): the docstrings' Sphinx roles (``:class:`Backbone```,
``:func:`~otviz.ot.sinkhorn```, ``:mod:`.base```, ...) become cross-references of the API
page, so the site shows a link where the target is documented there and inline code
otherwise, never the raw role.

A role's target is resolved as Python would resolve the name in the docstring's scope (the
object, then its class and module, following imports: :meth:`griffe.Object.resolve`); a
leading ``~`` shows only the last part of the path, leading dots are not shown. The role
becomes an optional autorefs reference (``<autoref optional>``): mkdocs-autorefs turns it
into a link to the target's anchor when some page renders the target, and leaves the code
unlinked, without a warning, when none does.
"""

from __future__ import annotations

import re
from contextlib import suppress
from html import escape

from griffe import Extension, GriffeLoader, Module, NameResolutionError, Object

#: A Python-domain role: ``:class:`X```, ``:py:func:`~a.b```, ...
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj|const):`(?P<target>[^`\n]+)`")


def identifier(scope: Object, target: str) -> str:
    """The full dotted path that ``target`` (``~`` removed) names in ``scope``: its first
    part resolved there, the rest appended; as written when it does not resolve."""
    first, _, rest = target.lstrip(".").partition(".")
    with suppress(NameResolutionError):
        first = scope.resolve(first)
    return f"{first}.{rest}" if rest else first


def reference(scope: Object, match: re.Match[str]) -> str:
    """The optional autorefs reference replacing one role of ``scope``'s docstring."""
    target = match["target"]
    shown = target.lstrip("~").lstrip(".")  # as Sphinx shows it
    path = identifier(scope, target.lstrip("~"))
    if target.startswith("~"):
        shown = shown.rpartition(".")[2]
    return f'<autoref identifier="{escape(path)}" optional><code>{escape(shown)}</code></autoref>'


def _rewrite(obj: Object) -> None:
    if obj.docstring is not None:
        obj.docstring.value = ROLE.sub(lambda m: reference(obj, m), obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:  # an alias's docstring is its target's, rewritten there
            _rewrite(member)


class SphinxRoles(Extension):
    """Rewrites every docstring of a package once it is loaded (names resolve only then)."""

    def on_package(self, *, pkg: Module, loader: GriffeLoader, **kwargs: object) -> None:
        _rewrite(pkg)
