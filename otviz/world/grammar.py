"""Captions and their gold constituency trees, realised from a :class:`Meaning`.

Grammar (every caption is lower case, no final period)::

    S      -> [there is] COORD
    COORD  -> CONJ | CONJ and CONJ | CONJ , CONJ , ... , CONJ and CONJ
    CONJ   -> NP | NP PP
    PP     -> above NP | below NP | to the left of NP | to the right of NP
    NP     -> a|an [small | large] COLOUR SHAPE

Tree conventions (Penn-Treebank tags; the bracketing is a function of the words alone, so a
deterministic parser can reproduce it):

* Leaves are pre-terminals: ``DT`` (a, an, the), ``JJ`` (sizes and colours), ``NN`` (shapes,
  and left/right), ``IN`` (above, below, of), ``TO`` (to), ``CC`` (and), ``,`` (comma),
  ``EX`` (there), ``VBZ`` (is).
* A base noun phrase is flat: ``(NP (DT a) (JJ small) (JJ red) (NN circle))``. These are
  the only noun phrases that name an object; each gives one :class:`Phrase`.
* A relation is a flat ``PP`` whose last child is the landmark's base NP; a multi-word
  preposition is not split: ``(PP (TO to) (DT the) (NN left) (IN of) (NP ...))`` and
  ``(PP (IN above) (NP ...))``. The PP attaches to the base NP right before it, under a new
  NP: ``(NP (NP a red circle) (PP ...))``. A PP never contains a conjunction.
* Coordination is flat and only at the top: ``(NP CONJ (, ,) CONJ (CC and) CONJ)`` where each
  CONJ is a base NP or an NP+PP as above; a single conjunct is not wrapped again.
* The root is ``S``: ``(S NP)`` or, in the existential form, ``(S (EX there) (VBZ is) NP)``.

Example: "a small red circle to the left of a blue star and a green ring" is
``(S (NP (NP (NP (DT a) (JJ small) (JJ red) (NN circle)) (PP (TO to) (DT the) (NN left)
(IN of) (NP (DT a) (JJ blue) (NN star)))) (CC and) (NP (DT a) (JJ green) (NN ring))))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from otviz.text.tree import Tree
from otviz.text.words import article
from otviz.world.types import Description, Meaning

RELATION_WORDS: dict[str, tuple[tuple[str, str], ...]] = {
    "left_of": (("TO", "to"), ("DT", "the"), ("NN", "left"), ("IN", "of")),
    "right_of": (("TO", "to"), ("DT", "the"), ("NN", "right"), ("IN", "of")),
    "above": (("IN", "above"),),
    "below": (("IN", "below"),),
}


@dataclass(frozen=True)
class Realisation:
    """A caption's words, its gold tree and the word span of each description's NP (in
    :meth:`Meaning.descriptions` order)."""

    words: list[str]
    tree: Tree
    spans: list[tuple[int, int]]

    @property
    def caption(self) -> str:
        return caption_text(self.words)


def caption_text(words: list[str]) -> str:
    """Join words with spaces, a comma sticking to the word before it."""
    return " ".join(words).replace(" ,", ",")


@lru_cache(maxsize=1 << 14)
def _np_leaves(colour: str, shape: str, size: str | None) -> tuple[tuple[str, str], ...]:
    """``(tag, word)`` of the base NP naming a description."""
    words = (("JJ", colour), ("NN", shape)) if size is None else (
        ("JJ", size), ("JJ", colour), ("NN", shape))
    return (("DT", article(size or colour)), *words)


@lru_cache(maxsize=1 << 14)
def _np_words(colour: str, shape: str, size: str | None) -> tuple[str, ...]:
    """The words of :func:`_np_leaves`."""
    return tuple(word for _, word in _np_leaves(colour, shape, size))


@lru_cache(maxsize=1 << 16)
def _leaf(tag: str, word: str, index: int) -> Tree:
    """The (immutable, shared) leaf of ``word`` at position ``index``."""
    return Tree(tag, index, index + 1, word=word)


@lru_cache(maxsize=1 << 16)
def _base_np_tree(colour: str, shape: str, size: str | None, start: int) -> Tree:
    """The (immutable, shared) base NP tree of a description starting at word ``start``."""
    leaves = _np_leaves(colour, shape, size)
    kids = tuple(_leaf(tag, word, start + k) for k, (tag, word) in enumerate(leaves))
    return Tree("NP", start, start + len(kids), kids)


class _Builder:
    """Collects words, and the tree nodes over them unless ``trees`` is False (for the
    cheaper caption-only realisation of negatives; nodes are then None). Leaves and base
    NPs are memoised per position: trees are immutable, so samples share them."""

    def __init__(self, trees: bool) -> None:
        self.trees = trees
        self.words: list[str] = []
        self.spans: list[tuple[int, int]] = []

    def leaf(self, tag: str, word: str) -> Tree | None:
        self.words.append(word)
        return _leaf(tag, word, len(self.words) - 1) if self.trees else None

    def node(self, label: str, start: int, children: list[Tree | None]) -> Tree | None:
        return Tree(label, start, len(self.words), tuple(children)) if self.trees else None

    def base_np(self, d: Description) -> Tree | None:
        start = len(self.words)
        self.words += _np_words(d.colour, d.shape, d.size)
        self.spans.append((start, len(self.words)))
        return _base_np_tree(d.colour, d.shape, d.size, start) if self.trees else None

    def sentence(self, meaning: Meaning) -> Tree | None:
        root = [self.leaf("EX", "there"), self.leaf("VBZ", "is")] if meaning.there_is else []
        start = len(self.words)
        conjuncts: list[Tree | None] = []
        n = len(meaning.clauses)
        for k, clause in enumerate(meaning.clauses):
            if k > 0:
                conjuncts.append(self.leaf("CC", "and") if k == n - 1 else self.leaf(",", ","))
            np_start = len(self.words)
            subject = self.base_np(clause.subject)
            if clause.relation is None or clause.landmark is None:
                conjuncts.append(subject)
                continue
            pp_start = len(self.words)
            pp = [self.leaf(tag, w) for tag, w in RELATION_WORDS[clause.relation]]
            pp.append(self.base_np(clause.landmark))
            conjuncts.append(self.node("NP", np_start, [subject, self.node("PP", pp_start, pp)]))
        top = conjuncts[0] if n == 1 else self.node("NP", start, conjuncts)
        return self.node("S", 0, [*root, top])


def realise(meaning: Meaning) -> Realisation:
    """Words, gold tree and NP spans of the caption expressing ``meaning``."""
    b = _Builder(trees=True)
    tree = b.sentence(meaning)
    assert tree is not None
    return Realisation(b.words, tree, b.spans)


def caption_of(meaning: Meaning) -> str:
    """The caption expressing ``meaning`` (same as ``realise(meaning).caption``, faster)."""
    b = _Builder(trees=False)
    b.sentence(meaning)
    return caption_text(b.words)
