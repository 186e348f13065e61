"""The built-in constituency parser: a small deterministic chunker for captions.

It needs no model and reproduces the synthetic world's gold trees exactly
(:mod:`otviz.world.grammar` gives the conventions; they are instances of the rules below),
and gives sensible noun/prepositional/verb phrase trees for ordinary English captions.

Rules (Penn-Treebank labels; word classes from :mod:`otviz.text.pos_lexicon`):

* Base noun phrase, flat: ``NP -> (DT|PRP$|CD)* (JJ|NN|VBG|VBN|RB JJ|JJ CC JJ)* NN``, or a
  lone pronoun. A participle or a verb form ends the NP after a noun (``a man | riding``);
  a bare verb form after a plural noun is the verb (``two dogs | play``).
* ``of`` chains nest to the right: ``(NP (NP a cup) (PP (IN of) (NP coffee)))``.
* ``PP -> IN NP``; multi-word prepositions stay flat: ``(PP (TO to) (DT the) (NN left)
  (IN of) NP)``. The object of a preposition is a base NP (with its ``of`` chain).
* An NP's post-modifiers (PPs, participle VPs, ``who/that`` relatives, ``ADJP PP``) join it
  under a new NP: ``(NP (NP a red circle) (PP ...) (VP ...))``.
* ``VP -> aux (VP ...) | verb [PRT] [NP | ADJP] (PP | ADVP | participle VP | to VP)*``;
  the object is a base NP (or a flat coordination of base NPs), later PPs attach to the
  VP; a predicative ADJP only follows a linking verb (``is blue``).
* Coordination is flat, and for noun phrases at the highest level:
  ``(NP NP , NP CC NP)``; verb phrases coordinate as ``(VP VP CC VP)``.
* A clause is ``[EX be] NP`` (existential, flat) or ``NP VP`` or a fragment; the root is
  ``S``; several clauses in a sentence become ``S`` children, several sentences too.

Nesting is capped at :data:`MAX_DEPTH` levels so any input parses without deep recursion;
every word becomes exactly one leaf, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from otviz.text.pos_lexicon import (
    ADJECTIVES,
    AUXILIARIES,
    INTENSIFIERS,
    MULTIWORD_PREPOSITIONS,
    PARTICLES,
    WordClass,
    classify,
)
from otviz.text.tree import Tree
from otviz.text.words import Word

_Builder = Callable[[int, int], tuple[Tree | None, int]]

MAX_DEPTH = 40
"""Deepest nesting of phrase-building calls; beyond it words are attached flat."""

_DET_TAGS = ("DT", "PRP$", "WP$")
_PRONOUN_DETS = frozenset(
    "this that these those all both each either neither some any half another".split()
)
_SINGULAR_DETS = frozenset("a an each every this that another".split())
_TERMINALS = frozenset(".!?")
_SUBORDINATORS = frozenset("while as when after before since until because".split())
_RELATIVES = {"who": "WP", "which": "WDT", "that": "WDT"}
_BE = frozenset("is are was were".split())
_LINKING = frozenset(
    "is are was were be been being am look looks looking looked seem seems appear appears "
    "become becomes get gets getting stay stays remain remains feel feels".split()
)
_VERB_TAGS = frozenset(("MD", "VB", "VBZ", "VBP", "VBD", "VBN", "VBG"))
_CLAUSE_EDGE = frozenset(("DT", "PRP$", "PRP", "IN", "TO", "RB", "CC", ",", ".", ":"))


def parse_words(words: Sequence[Word]) -> Tree:
    """Constituency tree over ``words`` (leaves are exactly the words' texts, in order).

    An empty word list gives the childless root ``Tree("S", 0, 0)``.
    """
    if not words:
        return Tree("S", 0, 0)
    return _Parser(words).parse()


class _Parser:
    """Recursive-descent chunker over one caption; the methods return ``(node, next index)``
    with ``node`` None (and the index unchanged) when the construction does not apply."""

    def __init__(self, words: Sequence[Word]) -> None:
        self.words = words
        self.low = [w.text.lower() for w in words]
        self.cls = [classify(w.text) for w in words]
        self.end = len(words)  # end of the sentence being parsed
        self.sentence_start = 0
        self.verb_override: dict[int, str] = {}

    # -- structure -------------------------------------------------------------------------

    def parse(self) -> Tree:
        sentences = [self.sentence(a, b) for a, b in self._sentence_ranges()]
        return sentences[0] if len(sentences) == 1 else _node("S", sentences)

    def _sentence_ranges(self) -> list[tuple[int, int]]:
        """Split after terminal punctuation (not a decimal point) followed by a word."""
        ranges, start, n = [], 0, len(self.words)
        for k in range(n - 1):
            if self.low[k] in _TERMINALS and self.low[k + 1] not in _TERMINALS:
                if not self._decimal_point(k):
                    ranges.append((start, k + 1))
                    start = k + 1
        ranges.append((start, n))
        return ranges

    def _decimal_point(self, k: int) -> bool:
        w = self.words
        return (
            self.low[k] == "."
            and 0 < k < len(w) - 1
            and w[k - 1].end == w[k].start
            and w[k].end == w[k + 1].start
            and w[k - 1].text.isdigit()
            and w[k + 1].text.isdigit()
        )

    def sentence(self, a: int, b: int) -> Tree:
        self.end, self.sentence_start = b, a
        clauses: list[list[Tree]] = []
        j = a
        while j < b:
            nodes, j = self.clause(j)
            clauses.append(nodes)
        if sum(1 for c in clauses if len(c) > 1 or not c[0].is_leaf) <= 1:
            return _node("S", [n for c in clauses for n in c])
        return _node("S", [_node("S", c) if len(c) > 1 else c[0] for c in clauses])

    def clause(self, j: int) -> tuple[list[Tree], int]:
        """One clause (always consumes at least one word)."""
        if self.low[j] == "there" and self._word(j + 1) in _BE:
            head = [self.leaf(j, "EX"), self.leaf(j + 1, self.cls[j + 1].closed or "VBZ")]
            np, k = self.np_coord(j + 2, 0)
            return ([*head, np], k) if np is not None else (head, j + 2)
        subject, k = self.np_coord(j, 0)
        if subject is not None:
            vp, m = self.vp_coord(k, 0, base_tag="VBP")
            return ([subject, vp], m) if vp is not None else ([subject], k)
        for build in (self.vp_coord, self.pp, self.advp):
            node, k = build(j, 0)
            if node is not None:
                return [node], k
        return [self.leaf(j, self._fallback_tag(j))], j + 1

    # -- noun phrases ----------------------------------------------------------------------

    def np_coord(self, i: int, depth: int) -> tuple[Tree | None, int]:
        """NPs with post-modifiers joined flat by commas and conjunctions (world: only at the
        top, so ``a circle above a star and a ring`` coordinates ``a ring`` with the NP+PP)."""
        return self._coordinate(self.np_conj, i, depth)

    def object_np(self, i: int, depth: int) -> tuple[Tree | None, int]:
        """A verb's object: base NPs (with ``of`` chains) joined flat; PPs after it attach to
        the VP."""
        return self._coordinate(self.np_core, i, depth)

    def _coordinate(self, conjunct: _Builder, i: int, depth: int) -> tuple[Tree | None, int]:
        first, j = conjunct(i, depth)
        if first is None:
            return None, i
        kids = [first]
        while j < self.end:
            k, seps = j, []
            if self.low[k] == ",":
                seps.append(self.leaf(k, ","))
                k += 1
            if k < self.end and self.cls[k].closed == "CC":
                seps.append(self.leaf(k, "CC"))
                k += 1
            if not seps:
                break
            nxt, m = conjunct(k, depth)
            if nxt is None:
                break
            kids += [*seps, nxt]
            j = m
        return (_node("NP", kids) if len(kids) > 1 else first), j

    def np_conj(self, i: int, depth: int) -> tuple[Tree | None, int]:
        """A base NP (with its ``of`` chain) and its post-modifiers."""
        core, j = self.np_core(i, depth)
        if core is None:
            return None, i
        posts = []
        while j < self.end:
            post, j = self.postmodifier(j, depth + 1)
            if post is None:
                break
            posts.append(post)
        return (_node("NP", [core, *posts]) if posts else core), j

    def postmodifier(self, j: int, depth: int) -> tuple[Tree | None, int]:
        if depth >= MAX_DEPTH:
            return None, j
        for build in (self.pp, self.to_vp):
            node, k = build(j, depth)
            if node is not None:
                return node, k
        if self.cls[j].verb in ("VBG", "VBN") and self.verb_override.get(j) is None:
            return self.vp_coord(j, depth)
        if self.low[j] in _RELATIVES and self._verb_start(j + 1):
            vp, k = self.vp_coord(j + 1, depth + 1, base_tag="VBP")
            if vp is not None:
                return _node("SBAR", [self.leaf(j, _RELATIVES[self.low[j]]), vp]), k
        return self.adjp_pp(j, depth)

    def adjp_pp(self, j: int, depth: int) -> tuple[Tree | None, int]:
        """A post-posed adjective with its PP: ``(ADJP (JJ full) (PP of ...))``."""
        if self.low[j] in ADJECTIVES:
            pp, k = self.pp(j + 1, depth + 1)
            if pp is not None:
                return _node("ADJP", [self.leaf(j, "JJ"), pp]), k
        return None, j

    def np_core(self, i: int, depth: int) -> tuple[Tree | None, int]:
        """Base NP, and ``of`` + NP nested to the right."""
        np, j = self.base_np(i)
        if np is None or depth >= MAX_DEPTH or self._word(j) != "of":
            return np, j
        obj, k = self.np_core(j + 1, depth + 1)
        if obj is None:
            return np, j
        return _node("NP", [np, _node("PP", [self.leaf(j, "IN"), obj])]), k

    def base_np(self, i: int) -> tuple[Tree | None, int]:
        """A flat base noun phrase starting at ``i``."""
        if i >= self.end or (self.cls[i].open and self._multiword(i)):
            return None, i  # next to, close to
        if self.cls[i].closed == "PRP" or (self.low[i] == "her" and not self._open(i + 1)):
            return _node("NP", [self.leaf(i, "PRP")]), i + 1
        tagged: list[tuple[int, str]] = []
        j = i
        while j < self.end and self.cls[j].closed in _DET_TAGS:
            tagged.append((j, self.cls[j].closed or "DT"))
            j += 1
            if (
                self.low[j - 1] in _PRONOUN_DETS
                and not self._open(j)
                and (j >= self.end or self.cls[j].closed not in _DET_TAGS)
            ):
                return _node("NP", self._leaves(tagged)), j
        while j < self.end and (self.cls[j].number or self._decimal_point(j)):
            tagged.append((j, "CD" if self.cls[j].number else "."))
            j += 1
        singular = any(self.low[k] in _SINGULAR_DETS for k, _ in tagged)
        body, kinds = self._np_body(j, bool(tagged), singular)
        if not body and not tagged:
            return None, i
        tagged += self._body_tags(body, kinds)
        return _node("NP", self._leaves(tagged)), (body[-1] if body else tagged[-1][0]) + 1

    def _np_body(self, j: int, has_det: bool, singular: bool) -> tuple[list[int], list[str]]:
        """Indices of the modifiers and head of a base NP from ``j``, and their kinds
        (``noun``, ``adj``, ``part``, ``rb``, ``cc``); the last is never ``rb``/``cc``.
        ``singular``: the NP has a singular determiner (``a``, ``each``, ...)."""
        body: list[int] = []
        kinds: list[str] = []
        while j < self.end:
            c, w = self.cls[j], self.low[j]
            after_noun = bool(kinds) and kinds[-1] == "noun"
            if c.closed is not None or c.adverb:
                if (
                    (w in INTENSIFIERS or c.adverb)
                    and not after_noun
                    and self._modifier_follows(j + 1)
                ):
                    kind = "rb"
                elif c.closed == "CC" and kinds and kinds[-1] == "adj" and self._adj(j + 1):
                    kind = "cc"
                else:
                    break
            elif c.verb is not None and not c.adjective:
                kind = self._verb_in_np(j, c, body, after_noun, has_det)
                if kind is None:
                    break
            elif (
                after_noun and w in ADJECTIVES and not self._open(j + 1)
            ) or self.verb_override.get(j):
                break
            elif after_noun and singular and self._unlisted_verb(j, body[-1]):
                self.verb_override[j] = "VBZ"
                break
            else:
                kind = "adj" if c.adjective else "noun"
            body.append(j)
            kinds.append(kind)
            j += 1
        return body, kinds

    def _verb_in_np(
        self, j: int, c: WordClass, body: list[int], after_noun: bool, has_det: bool
    ) -> str | None:
        """Kind of a verb-form word inside a base NP, or None where it ends the NP."""
        if c.verb in ("VBG", "VBN", "VBD"):
            if after_noun or (c.verb == "VBG" and not body and not has_det):
                return None  # a man | riding ..., | riding horses
            if self._open(j + 1) and self.cls[j + 1].verb is None:
                return "part"  # a sleeping cat, parked cars
            return "noun" if (body or has_det) and c.verb != "VBD" else None
        if not after_noun:
            return "noun"  # a walk, the stands
        if c.verb == "VBZ" or self.cls[body[-1]].plural:
            return None  # a man rides / two dogs play
        return "noun"  # a skate park, a bus stop

    def _unlisted_verb(self, j: int, noun: int) -> bool:
        """``a woman sweeps the floor``: an unlisted ``-s`` word after the singular noun at
        ``noun``, before a determiner, preposition, conjunction or the end, is a verb."""
        c = self.cls[j]
        nxt = self.cls[j + 1].closed if j + 1 < self.end else "."
        return (
            c.plural
            and c.verb is None
            and not c.adjective
            and not self.cls[noun].plural
            and nxt in _CLAUSE_EDGE
        )

    def _body_tags(self, body: list[int], kinds: list[str]) -> list[tuple[int, str]]:
        out = []
        for n, (j, kind) in enumerate(zip(body, kinds, strict=True)):
            c = self.cls[j]
            if n == len(body) - 1:
                out.append((j, self._noun_tag(j)))
            elif kind == "rb":
                out.append((j, "RB"))
            elif kind == "cc":
                out.append((j, "CC"))
            elif kind == "part":
                out.append((j, "VBG" if c.verb == "VBG" else "VBN"))
            elif kind == "adj" or c.adjective:
                out.append((j, "JJ"))
            else:
                out.append((j, self._noun_tag(j)))
        return out

    def _noun_tag(self, j: int) -> str:
        c, text = self.cls[j], self.words[j].text
        if c.number:
            return "CD"
        if c.plural:
            return "NNS"
        if text[:1].isupper() and not text.isupper() and j != self.sentence_start:
            return "NNP"
        return "NN"

    # -- prepositional, verb and adverb phrases --------------------------------------------

    def preposition(self, i: int) -> list[Tree]:
        """Leaves of the (possibly multi-word) preposition at ``i``, or []."""
        entry = self._multiword(i)
        if entry:
            return [self.leaf(i + k, tag) for k, (tag, _) in enumerate(entry)]
        tag = self.cls[i].closed if i < self.end else None
        return [self.leaf(i, tag)] if tag in ("IN", "TO") else []

    def pp(self, i: int, depth: int) -> tuple[Tree | None, int]:
        if depth >= MAX_DEPTH:
            return None, i
        prep = self.preposition(i)
        if not prep or (len(prep) == 1 and self._infinitive(i)):
            return None, i
        j = i + len(prep)
        obj, k = self.np_core(j, depth + 1)
        if obj is not None and self.low[i] in _SUBORDINATORS and self._finite(k):
            vp, m = self.vp_coord(k, depth + 1, base_tag="VBP")  # while a dog waits
            if vp is not None:
                return _node("SBAR", [*prep, _node("S", [obj, vp])]), m
        if obj is not None:
            return _node("PP", [*prep, obj]), k
        if j < self.end and self.cls[j].verb == "VBG":
            vp, k = self.vp_coord(j, depth + 1)
            if vp is not None:
                label = "SBAR" if self.low[i] in _SUBORDINATORS else "PP"
                return _node(label, [*prep, vp]), k
        return None, i

    def to_vp(self, i: int, depth: int) -> tuple[Tree | None, int]:
        """``to`` + infinitive: ``(VP (TO to) (VP ...))``."""
        if depth >= MAX_DEPTH or not self._infinitive(i):
            return None, i
        vp, k = self.vp_coord(i + 1, depth + 1, base_tag="VB")
        return (_node("VP", [self.leaf(i, "TO"), vp]), k) if vp is not None else (None, i)

    def advp(self, i: int, depth: int) -> tuple[Tree | None, int]:
        c = self.cls[i]
        if c.adverb or c.closed == "RB" or (c.closed == "IN" and self.low[i] in PARTICLES):
            return _node("ADVP", [self.leaf(i, "RB")]), i + 1
        return None, i

    def vp_coord(self, i: int, depth: int, base_tag: str = "VB") -> tuple[Tree | None, int]:
        first, j = self.vp(i, depth, base_tag)
        if first is None:
            return None, i
        kids = [first]
        while j < self.end and self.cls[j].closed == "CC" and self._verb_start(j + 1):
            nxt, k = self.vp(j + 1, depth, base_tag)
            if nxt is None:
                break
            kids += [self.leaf(j, "CC"), nxt]
            j = k
        return (_node("VP", kids) if len(kids) > 1 else first), j

    def vp(self, i: int, depth: int, base_tag: str = "VB") -> tuple[Tree | None, int]:
        if depth >= MAX_DEPTH or not self._verb_start(i):
            return None, i
        head = self.leaf(i, self._verb_tag(i, base_tag))
        j = i + 1
        if self.low[i] in AUXILIARIES:  # aux (not) VP
            k = j
            while k < self.end and self.low[k] in ("not", "never", "also", "just", "still"):
                k += 1
            inner, m = self.vp(k, depth + 1, "VB") if self._verb_start(k) else (None, k)
            if inner is not None:
                return _node("VP", [head, *self._adverbs(j, k), inner]), m
        kids = [head]
        if j < self.end and self.low[j] in PARTICLES and self.np_core(j + 1, depth)[0] is None:
            kids.append(_node("PRT", [self.leaf(j, "RP")]))
            j += 1
        complements = (self.adjp, self.object_np) if self.low[i] in _LINKING else (self.object_np,)
        for build in complements:
            node, k = build(j, depth + 1)
            if node is not None:
                kids.append(node)
                j = k
                break
        while j < self.end:
            node, j = self.adjunct(j, depth + 1)
            if node is None:
                break
            kids.append(node)
        return _node("VP", kids), j

    def adjunct(self, j: int, depth: int) -> tuple[Tree | None, int]:
        if depth >= MAX_DEPTH:
            return None, j
        for build in (self.pp, self.to_vp, self.advp, self.adjp_pp):
            node, k = build(j, depth)
            if node is not None:
                return node, k
        if self.cls[j].verb in ("VBG", "VBN") and self.verb_override.get(j) is None:
            return self.vp_coord(j, depth)
        return None, j

    def adjp(self, i: int, depth: int) -> tuple[Tree | None, int]:
        """A predicative adjective phrase: ``(RB) JJ (CC JJ)*`` not followed by a noun."""
        j, tagged = i, []
        if j < self.end and self.low[j] in INTENSIFIERS and self._adj(j + 1):
            tagged.append((j, "RB"))
            j += 1
        while self._adj(j):
            tagged.append((j, "JJ"))
            j += 1
            if self._word(j) in ("and", "or") and self._adj(j + 1):
                tagged.append((j, "CC"))
                j += 1
            else:
                break
        if not tagged or tagged[-1][1] != "JJ" or self._open(j):
            return None, i
        return _node("ADJP", self._leaves(tagged)), j

    # -- word-level helpers ----------------------------------------------------------------

    def leaf(self, i: int, tag: str) -> Tree:
        return Tree(tag, i, i + 1, word=self.words[i].text)

    def _leaves(self, tagged: list[tuple[int, str]]) -> list[Tree]:
        return [self.leaf(j, tag) for j, tag in tagged]

    def _adverbs(self, a: int, b: int) -> list[Tree]:
        return [self.leaf(k, "RB") for k in range(a, b)]

    def _multiword(self, i: int) -> tuple[tuple[str, str], ...]:
        """The multi-word preposition starting at ``i`` (longest), or ()."""
        for entry in MULTIWORD_PREPOSITIONS:
            if i + len(entry) <= self.end and all(
                self.low[i + k] == w for k, (_, w) in enumerate(entry)
            ):
                return entry
        return ()

    def _word(self, i: int) -> str:
        return self.low[i] if i < self.end else ""

    def _open(self, i: int) -> bool:
        return i < self.end and self.cls[i].open and not self.verb_override.get(i)

    def _adj(self, i: int) -> bool:
        return i < self.end and self.cls[i].adjective

    def _modifier_follows(self, i: int) -> bool:
        return i < self.end and (self.cls[i].adjective or self.cls[i].verb in ("VBG", "VBN"))

    def _infinitive(self, i: int) -> bool:
        return (
            self._word(i) == "to"
            and i + 1 < self.end
            and (self.cls[i + 1].verb == "VB" or self.low[i + 1] in ("be", "have", "do"))
        )

    def _verb_tag(self, i: int, base_tag: str) -> str:
        c = self.cls[i]
        tag = self.verb_override.get(i) or (c.closed if c.closed in _VERB_TAGS else c.verb)
        return base_tag if tag == "VB" and self.low[i] not in AUXILIARIES else tag or "VB"

    def _verb_start(self, i: int) -> bool:
        if i >= self.end:
            return False
        c = self.cls[i]
        if self.verb_override.get(i) or c.closed in _VERB_TAGS:
            return True
        return c.verb is not None and not (c.adjective and c.verb == "VB")

    def _finite(self, i: int) -> bool:
        """A finite verb (or modal) starts at ``i``."""
        return i < self.end and (
            self.verb_override.get(i) is not None
            or (self.cls[i].closed or self.cls[i].verb) in ("MD", "VBZ", "VBP", "VBD")
        )

    def _fallback_tag(self, i: int) -> str:
        c = self.cls[i]
        if c.closed is not None:
            return c.closed
        if c.number:
            return "CD"
        return "RB" if c.adverb else "JJ" if c.adjective else c.verb or "NN"


def _node(label: str, children: Sequence[Tree]) -> Tree:
    return Tree(label, children[0].start, children[-1].end, tuple(children))
