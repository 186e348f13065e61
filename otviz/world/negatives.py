"""Hard negative captions in the SugarCrepe categories, each verified false for the scene.

A negative is a minimal edit of the caption's meaning, realised with the same surface form:

* ``replace_obj``: one noun phrase's shape replaced ("a red circle" -> "a red star");
* ``replace_att``: one noun phrase's colour, or its stated size, replaced;
* ``replace_rel``: one relation replaced by another (left of -> above, ...);
* ``swap_obj``: the shapes of two noun phrases exchanged;
* ``swap_att``: the colours (or the stated sizes) of two noun phrases exchanged;
* ``add_obj``: a conjunct naming a colour-shape pair absent from the scene inserted.

Candidate edits are tried in random order and the first one that :func:`is_true` rejects
over all scene objects (distractors included), that names no forbidden colour-shape pair
and that does not repeat a noun phrase ("a red star and a red star"), is kept. A category
with no such edit (no relation to replace, a single noun phrase to swap, ...) is left out.

Candidates are tested as plain description keys and relation triples
(:func:`~otviz.world.semantics.assignment`); only the kept one is built as a :class:`Meaning`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from functools import cache, lru_cache, partial

import numpy as np

from otviz.world.draws import shuffled
from otviz.world.semantics import assignment
from otviz.world.types import Clause, Description, DescriptionKey, Meaning, SceneObject
from otviz.world.vocab import ALL_PAIRS, COLOURS, RELATIONS, SHAPES, SIZES

_ALL_PAIR_SET = frozenset(ALL_PAIRS)
_COLOUR, _SHAPE, _SIZE = range(3)  # fields of a DescriptionKey
_VOCABULARY = {_COLOUR: COLOURS, _SHAPE: SHAPES, _SIZE: SIZES}

Edit = tuple[tuple[int, int, str], ...]
"""(description index, key field, new value) for each description an edit changes."""
Candidate = tuple[list[DescriptionKey], list[tuple[int, str, int]], Callable[[], Meaning]]
"""A candidate negative: its descriptions' keys and relation triples (what the checks
need) and a function building its :class:`Meaning` (called for the kept one only)."""


@cache
def _description(key: DescriptionKey) -> Description:
    """The (immutable, shared) description of ``key``; there are 8 x 8 x 3 of them."""
    return Description(*key)


def _with_descriptions(meaning: Meaning, keys: Sequence[DescriptionKey]) -> Meaning:
    """``meaning`` with its descriptions (in :meth:`Meaning.descriptions` order) replaced."""
    clauses, k = [], 0
    for c in meaning.clauses:
        if c.landmark is None:
            clauses.append(Clause(_description(keys[k]), c.relation))
            k += 1
        else:
            clauses.append(Clause(_description(keys[k]), c.relation, _description(keys[k + 1])))
            k += 2
    return Meaning(tuple(clauses), meaning.there_is)


def _attribute_edits(
    meaning: Meaning, keys: list[DescriptionKey], rng: np.random.Generator,
    edits: Sequence[Edit],
) -> Iterator[Candidate]:
    """Apply each edit to the descriptions, in random order."""
    relations = meaning.relations()
    for edit in shuffled(edits, rng):
        new = list(keys)
        for k, field, value in edit:
            key = new[k]
            new[k] = (*key[:field], value, *key[field + 1 :])
        yield new, relations, partial(_with_descriptions, meaning, new)


def _replacements(keys: list[DescriptionKey], field: int) -> tuple[Edit, ...]:
    return _replacement_edits(tuple(key[field] for key in keys), field)


def _swaps(keys: list[DescriptionKey], field: int) -> tuple[Edit, ...]:
    return _swap_edits(tuple(key[field] for key in keys), field)


@lru_cache(maxsize=1 << 15)
def _replacement_edits(values: tuple[str | None, ...], field: int) -> tuple[Edit, ...]:
    """Edits setting one description's stated ``field`` to another word (memoised on the
    descriptions' values of that field)."""
    return tuple(
        ((k, field, v),)
        for k, old in enumerate(values) if old is not None
        for v in _VOCABULARY[field] if v != old
    )


@lru_cache(maxsize=1 << 15)
def _swap_edits(values: tuple[str | None, ...], field: int) -> tuple[Edit, ...]:
    """Edits exchanging ``field`` between two descriptions with different stated values."""
    return tuple(
        ((i, field, values[j]), (j, field, values[i]))
        for i in range(len(values)) for j in range(i + 1, len(values))
        if values[i] is not None and values[j] is not None and values[i] != values[j]
    )


def _replace_obj(
    meaning: Meaning, keys: list[DescriptionKey], rng: np.random.Generator,
    _: Sequence[SceneObject],
) -> Iterator[Candidate]:
    return _attribute_edits(meaning, keys, rng, _replacements(keys, _SHAPE))


def _replace_att(
    meaning: Meaning, keys: list[DescriptionKey], rng: np.random.Generator,
    _: Sequence[SceneObject],
) -> Iterator[Candidate]:
    edits = _replacements(keys, _COLOUR) + _replacements(keys, _SIZE)
    return _attribute_edits(meaning, keys, rng, edits)


def _swap_obj(
    meaning: Meaning, keys: list[DescriptionKey], rng: np.random.Generator,
    _: Sequence[SceneObject],
) -> Iterator[Candidate]:
    return _attribute_edits(meaning, keys, rng, _swaps(keys, _SHAPE))


def _swap_att(
    meaning: Meaning, keys: list[DescriptionKey], rng: np.random.Generator,
    _: Sequence[SceneObject],
) -> Iterator[Candidate]:
    return _attribute_edits(meaning, keys, rng, _swaps(keys, _COLOUR) + _swaps(keys, _SIZE))


def _with_clauses(clauses: tuple[Clause, ...], there_is: bool) -> Candidate:
    """The candidate made of ``clauses`` (for edits that change the clause structure)."""
    negative = Meaning(clauses, there_is)
    keys = [d.key for d in negative.descriptions()]
    return keys, negative.relations(), partial(Meaning, clauses, there_is)


def _replace_rel(
    meaning: Meaning, keys: list[DescriptionKey], rng: np.random.Generator,
    _: Sequence[SceneObject],
) -> Iterator[Candidate]:
    clauses = meaning.clauses
    edits = [
        (k, r)
        for k, c in enumerate(clauses) if c.relation is not None
        for r in RELATIONS if r != c.relation
    ]
    for k, r in shuffled(edits, rng):
        changed = Clause(clauses[k].subject, r, clauses[k].landmark)
        yield _with_clauses(clauses[:k] + (changed,) + clauses[k + 1 :], meaning.there_is)


def _add_obj(
    meaning: Meaning, keys: list[DescriptionKey], rng: np.random.Generator,
    objects: Sequence[SceneObject],
) -> Iterator[Candidate]:
    absent = list(ALL_PAIRS)
    for pair in {(o.colour, o.shape) for o in objects} & _ALL_PAIR_SET:
        absent.remove(pair)
    clauses = meaning.clauses
    for colour, shape in shuffled(absent, rng):
        clause = Clause(Description(colour, shape, SIZES[int(rng.integers(len(SIZES)))]))
        at = int(rng.integers(len(clauses) + 1))
        yield _with_clauses(clauses[:at] + (clause,) + clauses[at:], meaning.there_is)


_CATEGORIES: dict[str, Callable[..., Iterator[Candidate]]] = {
    "replace_obj": _replace_obj,
    "replace_att": _replace_att,
    "replace_rel": _replace_rel,
    "swap_obj": _swap_obj,
    "swap_att": _swap_att,
    "add_obj": _add_obj,
}


def hard_negatives(
    meaning: Meaning,
    objects: Sequence[SceneObject],
    rng: np.random.Generator,
    forbidden_pairs: Collection[tuple[str, str]] = (),
) -> dict[str, Meaning]:
    """One negative meaning per applicable category, each false of ``objects`` and naming
    none of ``forbidden_pairs`` (the held-out pairs, for the train and test splits)."""
    keys = [d.key for d in meaning.descriptions()]
    # keys some object fits: a candidate with a key outside them is false without a search
    fitting = {(o.colour, o.shape, size) for o in objects for size in (o.size, None)}
    out: dict[str, Meaning] = {}
    for category, candidates in _CATEGORIES.items():
        for new, relations, build in candidates(meaning, keys, rng, objects):
            if any((colour, shape) in forbidden_pairs for colour, shape, _ in new):
                continue
            if len(set(new)) == len(new) and (
                not fitting.issuperset(new) or assignment(new, relations, objects) is None
            ):
                out[category] = build()
                break
    return out
