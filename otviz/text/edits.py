"""Automatic hard-negative edits of a free-text caption, built on its parse tree, in the
SugarCrepe categories the compositional probe uses (ConceptOT Sec. 3; the synthetic world
makes the same categories from meanings in :mod:`otviz.world.negatives`):

* ``swap_att``: the adjectives of two noun phrases exchanged, the one next to the noun
  first ("a small red circle ... a blue star" -> "a small blue circle ... a red star"),
  else the one before it;
* ``swap_obj``: the head nouns of two noun phrases exchanged (same tag, so number agrees);
* ``replace_rel``: a prepositional phrase's relation words replaced by another relation of
  :data:`RELATION_PHRASES` (its converse where it has one: above <-> below, left <-> right,
  on <-> under), the rest of the caption kept;
* ``add_obj``: "and a <colour> <shape>" conjoined, naming a colour-shape pair of the world's
  vocabulary that the caption does not mention.

Edits rewrite the original string through the words' character spans, so everything the
edit does not touch (capitals, punctuation, spacing) stays as typed. An edit that does not
apply (a single noun phrase to swap, no prepositional phrase, ...) is returned skipped,
with a note saying why. Applied to a caption of the synthetic world, every edit is again
a grammatical world caption (:mod:`otviz.world.grammar`): the relations map into the
world's four, the articles follow the new word ("a orange" -> "an orange"), and an added
conjunct joins the list as the world writes it ("A and B" -> "A, B and C").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from otviz.text.parse import parse_caption
from otviz.text.tree import Tree
from otviz.text.words import Word, article

EDIT_CATEGORIES: tuple[str, ...] = ("swap_att", "swap_obj", "replace_rel", "add_obj")

RELATION_PHRASES: tuple[str, ...] = (
    "above", "below", "to the left of", "to the right of", "on", "under", "next to",
)
CONVERSE_RELATION: dict[str, str] = {
    "above": "below",
    "below": "above",
    "to the left of": "to the right of",
    "to the right of": "to the left of",
    "on": "under",
    "under": "on",
}
ADJECTIVE_TAGS = frozenset(("JJ", "JJR", "JJS"))
NOUN_TAGS = frozenset(("NN", "NNS"))


@dataclass(frozen=True)
class CaptionEdit:
    """One automatic edit of a caption.

    Attributes:
        category: the edit's category (one of :data:`EDIT_CATEGORIES`).
        caption: the edited caption, or ``None`` when the edit did not apply.
        note: what was changed, or why the edit was skipped.
    """

    category: str
    caption: str | None
    note: str

    @property
    def applied(self) -> bool:
        return self.caption is not None


class _Rewrite:
    """A caption with word-level replacements and insertions, applied through char spans."""

    def __init__(self, caption: str, words: Sequence[Word]) -> None:
        self.caption = caption
        self.words = list(words)
        self.texts = [w.text for w in words]
        self.inserts: dict[int, str] = {}  # word index -> text put right after that word
        self.joins: set[int] = set()  # word k glued to word k-1 (no space: a comma)

    def set_word(self, k: int, text: str) -> None:
        self.texts[k] = text

    def fix_article(self, np: Tree) -> None:
        """Make ``np``'s leading "a"/"an" agree with the word after it (case kept)."""
        k = np.start
        det = self.texts[k]
        if det.lower() in ("a", "an") and k + 1 < np.end:
            new = article(self.texts[k + 1].lower())
            self.texts[k] = new.capitalize() if det[0].isupper() else new

    def text(self) -> str:
        out, pos = [], 0
        for k, w in enumerate(self.words):
            gap = self.caption[pos : w.start]
            out.append("" if k in self.joins else gap)
            out.append(self.texts[k])
            out.append(self.inserts.get(k, ""))
            pos = w.end
        out.append(self.caption[pos:])
        return "".join(out)


def base_noun_phrases(tree: Tree) -> list[Tree]:
    """Noun phrases made of words only (no nested phrase) that have a noun, in word order."""
    return [
        n for n in tree.phrases("NP")
        if all(c.is_leaf for c in n.children) and any(c.label in NOUN_TAGS for c in n.children)
    ]


def _head_noun(np: Tree) -> Tree:
    return [c for c in np.children if c.label in NOUN_TAGS][-1]


def _adjectives(np: Tree) -> list[Tree]:
    """The adjectives before the head noun, nearest to the noun first."""
    head = _head_noun(np)
    return [c for c in np.children if c.label in ADJECTIVE_TAGS and c.end <= head.start][::-1]


def _np_text(np: Tree) -> str:
    return f"'{np.span_text()}'"


def _np_pairs(nps: list[Tree], differ: Callable[[Tree, Tree], bool]) -> list[tuple[Tree, Tree]]:
    """Pairs of noun phrases in word order, those that ``differ`` first (a swap between
    them changes which words go together, not just their order)."""
    pairs = [(a, b) for i, a in enumerate(nps) for b in nps[i + 1 :]]
    return sorted(pairs, key=lambda p: not differ(*p))


def _swap(
    category: str, caption: str, words: Sequence[Word], a: Tree, b: Tree, x: Tree, y: Tree
) -> CaptionEdit:
    """Exchange leaves ``x`` (in noun phrase ``a``) and ``y`` (in ``b``)."""
    rw = _Rewrite(caption, words)
    rw.set_word(x.start, y.word or "")
    rw.set_word(y.start, x.word or "")
    rw.fix_article(a)
    rw.fix_article(b)
    note = f"swapped '{x.word}' and '{y.word}' between {_np_text(a)} and {_np_text(b)}"
    return CaptionEdit(category, rw.text(), note)


def _same_word(x: Tree, y: Tree) -> bool:
    return (x.word or "").lower() == (y.word or "").lower()


def swap_att(caption: str, tree: Tree, words: Sequence[Word]) -> CaptionEdit:
    """Exchange one adjective slot (nearest the noun first) between two noun phrases whose
    adjectives there differ; phrases with different nouns first ("a blue heart and a cyan
    heart" -> "a cyan heart and a blue heart" says nearly the same)."""
    nps = base_noun_phrases(tree)
    slots = max((len(_adjectives(n)) for n in nps), default=0)
    pairs = _np_pairs(nps, lambda a, b: not _same_word(_head_noun(a), _head_noun(b)))
    for slot in range(slots):
        for a, b in pairs:
            adj_a, adj_b = _adjectives(a), _adjectives(b)
            if slot < min(len(adj_a), len(adj_b)) and not _same_word(adj_a[slot], adj_b[slot]):
                return _swap("swap_att", caption, words, a, b, adj_a[slot], adj_b[slot])
    return CaptionEdit(
        "swap_att", None, "skipped: needs two noun phrases with different adjectives"
    )


def swap_obj(caption: str, tree: Tree, words: Sequence[Word]) -> CaptionEdit:
    """Exchange the head nouns of two noun phrases whose nouns differ and share a tag
    (singular with singular, plural with plural); phrases whose adjectives next to the
    noun differ first."""

    def nearest_adjective(np: Tree) -> str:
        adjectives = _adjectives(np)
        return (adjectives[0].word or "").lower() if adjectives else ""

    nps = base_noun_phrases(tree)
    for a, b in _np_pairs(nps, lambda a, b: nearest_adjective(a) != nearest_adjective(b)):
        x, y = _head_noun(a), _head_noun(b)
        if x.label == y.label and not _same_word(x, y):
            return _swap("swap_obj", caption, words, a, b, x, y)
    return CaptionEdit(
        "swap_obj", None, "skipped: needs two noun phrases with different nouns"
    )


def _relation(pp: Tree) -> tuple[list[Tree], str]:
    """The relation words of a prepositional phrase (the words before its object)."""
    lead = []
    for c in pp.children:
        if not c.is_leaf:
            break
        lead.append(c)
    return lead, " ".join(c.word or "" for c in lead).lower()


def _replacement(relation: str) -> str:
    if relation in CONVERSE_RELATION:
        return CONVERSE_RELATION[relation]
    return next(r for r in RELATION_PHRASES if r != relation)


def replace_rel(caption: str, tree: Tree, words: Sequence[Word]) -> CaptionEdit:
    """Replace the relation words of one prepositional phrase: the first whose relation is in
    :data:`RELATION_PHRASES` (by its converse where it has one), else the first other one
    with an object (not the partitive "of")."""
    pps = []
    for pp in tree.phrases("PP"):
        lead, rel = _relation(pp)
        if lead and len(lead) < len(pp.children) and rel != "of":
            pps.append((pp, lead, rel))
    if not pps:
        return CaptionEdit("replace_rel", None, "skipped: no prepositional phrase to change")
    pp, lead, rel = next((p for p in pps if p[2] in RELATION_PHRASES), pps[0])
    new = _replacement(rel)
    rw = _Rewrite(caption, words)
    rw.set_word(lead[0].start, new)
    for leaf in lead[1:]:
        rw.set_word(leaf.start, "")
        rw.joins.add(leaf.start)
    note = f"replaced '{' '.join(c.word or '' for c in lead)}' by '{new}'"
    return CaptionEdit("replace_rel", rw.text(), note)


def _absent_pairs(words: Sequence[Word], pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Colour-shape pairs whose colour and shape words both are absent from the caption; if
    there are none, the pairs at least not named together."""
    said = {w.text.lower() for w in words}
    unseen = [p for p in pairs if p[0] not in said and p[1] not in said]
    if unseen:
        return unseen
    text = " ".join(w.text.lower() for w in words)
    return [p for p in pairs if f"{p[0]} {p[1]}" not in text]


def add_obj(
    caption: str,
    tree: Tree,
    words: Sequence[Word],
    seed: int = 0,
    *,
    pairs: Sequence[tuple[str, str]],
) -> CaptionEdit:
    """Conjoin "and a <colour> <shape>" after the caption's last word (before a final
    punctuation mark), naming a pair of ``pairs`` (the vocabulary's colour-shape pairs, e.g.
    the world's :data:`~otviz.world.vocab.SEEN_PAIRS`) absent from the caption, drawn with
    ``seed``. A trailing "A and B" list becomes "A, B and <new>"."""
    content = [k for k, w in enumerate(words) if w.text[0].isalnum()]
    candidates = _absent_pairs(words, pairs)
    if not content or not candidates:
        return CaptionEdit("add_obj", None, "skipped: no absent object to add")
    colour, shape = candidates[int(np.random.default_rng(seed).integers(len(candidates)))]
    last = content[-1]
    rw = _Rewrite(caption, words)
    top = tree.children[-1] if tree.children else tree
    if top.children and top.label == "NP" and top.end == last + 1:
        conj = [c for c in top.children if c.is_leaf and c.label == "CC"]
        if conj and (conj[-1].word or "").lower() == "and":
            rw.set_word(conj[-1].start, ",")
            rw.joins.add(conj[-1].start)
    added = f"{article(colour)} {colour} {shape}"
    rw.inserts[last] = f" and {added}"
    return CaptionEdit("add_obj", rw.text(), f"added '{added}', not in the caption")


def edit_caption(
    caption: str, category: str, seed: int = 0, *, pairs: Sequence[tuple[str, str]]
) -> CaptionEdit:
    """The edit of ``category`` (one of :data:`EDIT_CATEGORIES`) of ``caption``; ``pairs``:
    the colour-shape pairs ``add_obj`` may add (:func:`add_obj`)."""
    return caption_edits(caption, (category,), seed, pairs=pairs)[0]


def caption_edits(
    caption: str,
    categories: Sequence[str] = EDIT_CATEGORIES,
    seed: int = 0,
    *,
    pairs: Sequence[tuple[str, str]],
) -> list[CaptionEdit]:
    """One edit per category, in the order asked (skipped ones included, with their note).
    ``seed`` picks the added object of ``add_obj`` among ``pairs`` (:func:`add_obj`)."""
    unknown = [c for c in categories if c not in EDIT_CATEGORIES]
    if unknown:
        raise ValueError(f"unknown edit categories {unknown}; known: {EDIT_CATEGORIES}")
    parse = parse_caption(caption)
    tree, words = parse.tree, parse.words
    out = []
    for category in categories:
        if category == "add_obj":
            out.append(add_obj(caption, tree, words, seed, pairs=pairs))
        else:
            out.append(_EDITS[category](caption, tree, words))
    return out


_EDITS = {"swap_att": swap_att, "swap_obj": swap_obj, "replace_rel": replace_rel}
