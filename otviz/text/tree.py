"""Constituency trees over caption words, shared by the world's gold trees and the parsers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Tree:
    """A constituency tree node over words ``[start, end)`` of a caption.

    A leaf is a pre-terminal: ``label`` is its part-of-speech tag, ``word`` its word and
    ``children`` empty.
    """

    label: str
    start: int
    end: int
    children: tuple[Tree, ...] = ()
    word: str | None = None

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def leaves(self) -> list[str]:
        """The words under this node, left to right."""
        if self.is_leaf:
            return [self.word or ""]
        return [w for c in self.children for w in c.leaves()]

    def nodes(self) -> Iterator[Tree]:
        """All nodes in pre-order (this node first)."""
        yield self
        for c in self.children:
            yield from c.nodes()

    def phrases(self, label: str | None = None) -> list[Tree]:
        """Non-leaf nodes (optionally only those with ``label``), in pre-order."""
        return [n for n in self.nodes() if not n.is_leaf and (label is None or n.label == label)]

    def span_text(self) -> str:
        return " ".join(self.leaves())

    def to_bracket(self) -> str:
        """Penn-Treebank style string, e.g. ``(NP (DT a) (JJ red) (NN circle))``."""
        if self.is_leaf:
            return f"({self.label} {self.word})"
        return f"({self.label} " + " ".join(c.to_bracket() for c in self.children) + ")"

    @staticmethod
    def from_bracket(text: str) -> Tree:
        """Parse the output of :meth:`to_bracket` back into a tree (word spans recomputed)."""
        tokens = re.findall(r"\(|\)|[^\s()]+", text)
        pos = 0
        word_index = 0

        def parse() -> Tree:
            nonlocal pos, word_index
            if tokens[pos] != "(":
                raise ValueError(f"expected '(' at token {pos} of {text!r}")
            label = tokens[pos + 1]
            pos += 2
            if tokens[pos] not in "()":
                word = tokens[pos]
                pos += 2  # word and ')'
                word_index += 1
                return Tree(label, word_index - 1, word_index, word=word)
            start = word_index
            children = []
            while tokens[pos] == "(":
                children.append(parse())
            pos += 1  # ')'
            return Tree(label, start, word_index, tuple(children))

        tree = parse()
        if pos != len(tokens):
            raise ValueError(f"trailing tokens in {text!r}")
        return tree
