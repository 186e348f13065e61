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
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence

import numpy as np

from otviz.world.semantics import is_true
from otviz.world.types import Clause, Description, Meaning, SceneObject
from otviz.world.vocab import ALL_PAIRS, COLOURS, RELATIONS, SHAPES, SIZES

_OTHER_SIZE = {"small": "large", "large": "small"}


def _with_descriptions(meaning: Meaning, descs: Sequence[Description]) -> Meaning:
    """``meaning`` with its descriptions (in :meth:`Meaning.descriptions` order) replaced."""
    it = iter(descs)
    clauses = tuple(
        Clause(next(it), c.relation, next(it) if c.landmark is not None else None)
        for c in meaning.clauses
    )
    return Meaning(clauses, meaning.there_is)


def _with_attribute(d: Description, attribute: str, value: str) -> Description:
    values = {"colour": d.colour, "shape": d.shape, "size": d.size, attribute: value}
    return Description(**values)


def _shuffled(options: list, rng: np.random.Generator) -> Iterator:
    for k in rng.permutation(len(options)).tolist():
        yield options[k]


def _attribute_edits(
    meaning: Meaning, rng: np.random.Generator, edits: list[tuple[tuple[int, str, str], ...]]
) -> Iterator[Meaning]:
    """Apply each edit, a tuple of (description index, attribute, new value), in random order."""
    descs = meaning.descriptions()
    for edit in _shuffled(edits, rng):
        new = list(descs)
        for k, attribute, value in edit:
            new[k] = _with_attribute(new[k], attribute, value)
        yield _with_descriptions(meaning, new)


def _replace_obj(
    meaning: Meaning, rng: np.random.Generator, _: Sequence[SceneObject]
) -> Iterator[Meaning]:
    edits = [
        ((k, "shape", s),)
        for k, d in enumerate(meaning.descriptions()) for s in SHAPES if s != d.shape
    ]
    return _attribute_edits(meaning, rng, edits)


def _replace_att(
    meaning: Meaning, rng: np.random.Generator, _: Sequence[SceneObject]
) -> Iterator[Meaning]:
    descs = meaning.descriptions()
    edits = [((k, "colour", c),) for k, d in enumerate(descs) for c in COLOURS if c != d.colour]
    edits += [
        ((k, "size", _OTHER_SIZE[d.size]),) for k, d in enumerate(descs) if d.size is not None
    ]
    return _attribute_edits(meaning, rng, edits)


def _swaps(descs: Sequence[Description], attribute: str) -> list[tuple[tuple[int, str, str], ...]]:
    values = [getattr(d, attribute) for d in descs]
    return [
        ((i, attribute, values[j]), (j, attribute, values[i]))
        for i in range(len(descs)) for j in range(i + 1, len(descs))
        if values[i] is not None and values[j] is not None and values[i] != values[j]
    ]


def _swap_obj(
    meaning: Meaning, rng: np.random.Generator, _: Sequence[SceneObject]
) -> Iterator[Meaning]:
    return _attribute_edits(meaning, rng, _swaps(meaning.descriptions(), "shape"))


def _swap_att(
    meaning: Meaning, rng: np.random.Generator, _: Sequence[SceneObject]
) -> Iterator[Meaning]:
    descs = meaning.descriptions()
    return _attribute_edits(meaning, rng, _swaps(descs, "colour") + _swaps(descs, "size"))


def _replace_rel(
    meaning: Meaning, rng: np.random.Generator, _: Sequence[SceneObject]
) -> Iterator[Meaning]:
    clauses = meaning.clauses
    edits = [
        (k, r)
        for k, c in enumerate(clauses) if c.relation is not None
        for r in RELATIONS if r != c.relation
    ]
    for k, r in _shuffled(edits, rng):
        changed = Clause(clauses[k].subject, r, clauses[k].landmark)
        yield Meaning(clauses[:k] + (changed,) + clauses[k + 1 :], meaning.there_is)


def _add_obj(
    meaning: Meaning, rng: np.random.Generator, objects: Sequence[SceneObject]
) -> Iterator[Meaning]:
    present = {(o.colour, o.shape) for o in objects}
    clauses = meaning.clauses
    for colour, shape in _shuffled([p for p in ALL_PAIRS if p not in present], rng):
        clause = Clause(Description(colour, shape, SIZES[int(rng.integers(len(SIZES)))]))
        at = int(rng.integers(len(clauses) + 1))
        yield Meaning(clauses[:at] + (clause,) + clauses[at:], meaning.there_is)


_CATEGORIES: dict[str, Callable[..., Iterator[Meaning]]] = {
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
    out: dict[str, Meaning] = {}
    for category, candidates in _CATEGORIES.items():
        for negative in candidates(meaning, rng, objects):
            descs = negative.descriptions()
            if any((d.colour, d.shape) in forbidden_pairs for d in descs):
                continue
            if len(set(descs)) == len(descs) and not is_true(negative, objects):
                out[category] = negative
                break
    return out
