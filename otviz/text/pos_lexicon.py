"""Word classes for the built-in caption parser: a closed-class lexicon and suffix rules.

Closed classes (determiners, prepositions, conjunctions, pronouns, auxiliaries, ...) are
listed in full; open classes are guessed: a list of common caption verbs with their regular
inflections (``-s``, ``-ing``, ``-ed``) plus irregular forms, any other ``-ing``/``-ed`` word
as a participle, ``-ly`` words as adverbs, a list of common adjectives plus adjective
suffixes, and everything else as a noun. Tags are Penn-Treebank tags. The lexicon covers the
synthetic world's vocabulary exactly (sizes and colours are adjectives, shapes are nouns).
Everything here works on lower-cased words; context is left to the parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

CLOSED: dict[str, str] = {
    **dict.fromkeys(
        "a an the this that these those each every some any no another either neither all "
        "both half".split(),
        "DT",
    ),
    **dict.fromkeys("my your his her its our their".split(), "PRP$"),
    **dict.fromkeys(
        "i you he she it we they me him us them myself yourself himself herself itself "
        "ourselves themselves".split(),
        "PRP",
    ),
    **dict.fromkeys(
        "of in on at by with from into onto over under above below behind beside besides "
        "near through across along around between among inside outside against toward "
        "towards during without upon atop beneath underneath past like about after before "
        "while as for since until than despite throughout beyond via amid within off up down "
        "out".split(),
        "IN",
    ),
    "to": "TO",
    **dict.fromkeys("and or but nor".split(), "CC"),
    **dict.fromkeys("can could will would shall should may might must".split(), "MD"),
    **dict.fromkeys("is has does isn't hasn't doesn't".split(), "VBZ"),
    **dict.fromkeys("are am have do aren't haven't don't".split(), "VBP"),
    **dict.fromkeys("was were had did wasn't weren't hadn't didn't".split(), "VBD"),
    "be": "VB",
    "been": "VBN",
    "being": "VBG",
    **dict.fromkeys("can't won't couldn't wouldn't shouldn't".split(), "MD"),
    **dict.fromkeys("who whom what".split(), "WP"),
    "whose": "WP$",
    "which": "WDT",
    **dict.fromkeys("where when why how".split(), "WRB"),
    **dict.fromkeys(
        "not never very really quite too also just always often still almost here there now "
        "then together away back alone nearby upstairs downstairs else even only again so "
        "yet".split(),
        "RB",
    ),
}
"""Closed-class words and their default tags (context may override: ``there``, ``that``,
``her``, particles)."""

AUXILIARIES: frozenset[str] = frozenset(
    w for w, t in CLOSED.items() if t in ("MD", "VBZ", "VBP", "VBD", "VB", "VBN", "VBG")
)

NUMBERS: frozenset[str] = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy "
    "eighty ninety hundred thousand million dozen".split()
)

ADJECTIVES: frozenset[str] = frozenset(
    # the world's sizes and colours, then common caption adjectives
    "small large red orange yellow green cyan blue purple white "
    "black brown gray grey pink gold golden silver beige tan dark light bright colorful "
    "colourful big little tiny huge giant tall short long wide narrow thin thick fat young old "
    "new empty full open closed happy sad busy clean dirty wet dry hot cold warm cool sunny "
    "cloudy snowy grassy sandy rocky muddy dusty foggy beautiful pretty cute ugly nice good bad "
    "great fresh ripe raw delicious healthy tasty several many few much more most other same "
    "different single double upper lower outdoor indoor modern vintage antique plain fancy "
    "round square electric wild domestic male female adult elderly friendly lonely lovely "
    "curly early silly only first second third last next left right middle top front "
    "rear huge giant fluffy furry hairy shiny heavy soft hard smooth rough sharp flat steep "
    "deep shallow quiet loud calm real fake entire whole main tiny wooden".split()
)

ADJECTIVE_SUFFIXES: tuple[str, ...] = (
    "ful",
    "ous",
    "ive",
    "able",
    "ible",
    "less",
    "ish",
    "ical",
)

VERBS: frozenset[str] = frozenset(
    "sit stand lie lay walk run ride hold carry eat drink play look watch wear lean brush "
    "cut cook fly swim jump throw catch kick hit surf ski skate skateboard snowboard park "
    "stop wait rest sleep smile laugh talk read write use take make cross climb pull push "
    "drive fill cover sell show pose prepare feed pet hug kiss dance sing stare face grab "
    "reach point wave bend kneel crouch perch graze hang float fall slide roll place put set "
    "serve share gather stack line display decorate close race chase follow lead see get "
    "give go come sleep sail paddle row fish hike bike wash dry clean paint draw build "
    "work help try want like love need keep let leave move turn open shake pick drop "
    "land lift bite lick chew touch sniff swing tow haul load unload check hide huddle "
    "cuddle blow spray pour mix stir slice chop bake grill fry roast hover glide soar "
    "dive splash wade relax lounge sunbathe crowd cross head block".split()
)
"""Lemmas of common caption verbs (their ``-s``, ``-ing`` and ``-ed`` forms are verbs)."""

IRREGULAR_VERBS: dict[str, str] = {
    **dict.fromkeys(
        "sat stood held ran rode wore lay flew ate drank took made drew saw hung caught "
        "threw drove grew built sold fed led fell broke froze hid stuck bent knelt went "
        "came gave got kept swam sang slid bit shook blew dove".split(),
        "VBD",
    ),
    **dict.fromkeys(
        "ridden worn eaten drunk taken drawn seen shown thrown driven grown fallen broken "
        "frozen hidden given gone done swum sung bitten shaken blown".split(),
        "VBN",
    ),
    **dict.fromkeys("lying dying tying".split(), "VBG"),
    **dict.fromkeys("lies sits".split(), "VBZ"),
}

NOUNS_NOT_VERBS: frozenset[str] = frozenset(
    "ring king wing string thing something anything nothing everything building ceiling "
    "clothing evening morning spring sibling railing icing pudding stuffing wedding awning "
    "bedding topping dumpling lightning swing sling sting bed red shed sled hundred seed "
    "speed need steed tweed weed reed bleed breed sacred naked wicked rugged "
    "family fly belly jelly lily bully rally ally reply supply italy assembly "
    "bus gas glass grass class dress cross tennis news lens series species".split()
)
"""Words that look like inflected verbs (or plurals, or ``-ly`` adverbs) but are not."""

IRREGULAR_PLURALS: frozenset[str] = frozenset(
    "people men women children teeth feet mice geese police cattle oxen".split()
)

INTENSIFIERS: frozenset[str] = frozenset("very really quite too so extremely".split())
"""Adverbs kept inside a noun phrase when an adjective follows (``a very tall man``)."""

PARTICLES: frozenset[str] = frozenset("up down out off away back over around".split())

PUNCTUATION: dict[str, str] = {
    ",": ",",
    ".": ".",
    "!": ".",
    "?": ".",
    ";": ":",
    ":": ":",
    "-": ":",
    "\u2013": ":",
    "\u2014": ":",
    "\u2026": ":",
    "(": "-LRB-",
    ")": "-RRB-",
    "[": "-LRB-",
    "]": "-RRB-",
    "{": "-LRB-",
    "}": "-RRB-",
    '"': "''",
    "'": "''",
    "`": "``",
    "\u201c": "``",
    "\u201d": "''",
    "\u2018": "``",
    "\u2019": "''",
    "$": "$",
    "#": "#",
    "&": "CC",
    "%": "NN",
}

MULTIWORD_PREPOSITIONS: tuple[tuple[tuple[str, str], ...], ...] = tuple(
    sorted(
        (
            tuple(zip(tags.split(), words.split(), strict=True))
            for words, tags in (
                ("to the left of", "TO DT NN IN"),
                ("to the right of", "TO DT NN IN"),
                ("on the left of", "IN DT NN IN"),
                ("on the right of", "IN DT NN IN"),
                ("in front of", "IN NN IN"),
                ("on top of", "IN NN IN"),
                ("in the middle of", "IN DT NN IN"),
                ("next to", "JJ TO"),
                ("close to", "RB TO"),
                ("out of", "IN IN"),
                ("because of", "IN IN"),
                ("instead of", "RB IN"),
                ("in between", "IN IN"),
            )
        ),
        key=len,
        reverse=True,
    )
)
"""Prepositions of several words, kept flat inside their PP (world convention: ``(PP (TO to)
(DT the) (NN left) (IN of) NP)``), longest first."""

_NUMBER = re.compile(r"^\d+(?:[.,:/]\d+)*(?:st|nd|rd|th|s)?$")
_ORDINAL = re.compile(r"^\d+(?:st|nd|rd|th)$")


@dataclass(frozen=True)
class WordClass:
    """What the lexicon knows about one word, before context.

    Attributes:
        closed: tag of a closed-class word (or punctuation), else None.
        verb: verb tag of an inflected form (``VB``, ``VBZ``, ``VBG``, ``VBD``, ``VBN``),
            else None.
        adjective: listed adjective or adjective suffix (or ordinal number).
        number: a cardinal number (digits or number word).
        adverb: an ``-ly`` adverb.
        plural: looks like a plural noun.
    """

    closed: str | None = None
    verb: str | None = None
    adjective: bool = False
    number: bool = False
    adverb: bool = False
    plural: bool = False

    @property
    def open(self) -> bool:
        """Can be a noun-phrase word (noun, adjective, number, participle)."""
        return self.closed is None and not self.adverb


@lru_cache(maxsize=65536)
def classify(word: str) -> WordClass:
    """The lexical class of a word (as split by :func:`otviz.text.words.split_words`)."""
    w = word.lower()
    if not (w[:1].isalnum()):
        return WordClass(closed=PUNCTUATION.get(w, "SYM"))
    if w in CLOSED:
        return WordClass(closed=CLOSED[w])
    if w in NUMBERS or (_NUMBER.match(w) and not _ORDINAL.match(w)):
        return WordClass(number=True)
    if not w.isascii():  # split_words only yields lone non-ASCII characters
        return WordClass(number=w.isdigit())
    listed_noun = w in NOUNS_NOT_VERBS
    verb = None if listed_noun else _verb_form(w)
    adjective = (
        w in ADJECTIVES
        or _ORDINAL.match(w) is not None
        or (len(w) > 5 and w.endswith(ADJECTIVE_SUFFIXES) and not listed_noun)
    )
    adverb = (
        len(w) > 3
        and w.endswith("ly")
        and not adjective
        and not listed_noun
        and w[:-2] not in VERBS
    )
    plural = w in IRREGULAR_PLURALS or (
        len(w) > 3
        and w.endswith("s")
        and not w.endswith(("ss", "us", "is", "ous"))
        and not listed_noun
        and "'" not in w
    )
    return WordClass(verb=verb, adjective=adjective, adverb=adverb, plural=plural)


def _verb_form(w: str) -> str | None:
    """Verb tag of ``w`` if it is a listed verb lemma or an inflection of one (any
    ``-ing``/``-ed`` word counts as a participle)."""
    if w in IRREGULAR_VERBS:
        return IRREGULAR_VERBS[w]
    if w in VERBS:
        return "VB"
    if len(w) > 4 and w.endswith("ing"):
        return "VBG"
    if len(w) > 3 and w.endswith("ed"):
        return "VBN"
    if len(w) > 2 and w.endswith("s"):
        stems = (w[:-1], w[:-2], w[:-3] + "y") if w.endswith("ies") else (w[:-1], w[:-2])
        if any(s in VERBS for s in stems):
            return "VBZ"
    return None
