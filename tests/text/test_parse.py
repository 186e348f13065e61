"""Caption parsers: the built-in parser against the world's gold trees, expected phrases of
ordinary captions, robustness on arbitrary strings, PowerCLIP phrase nodes and token masks
against a loop reference, and benepar detection/conversion without its model."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch
from open_clip.tokenizer import SimpleTokenizer

import otviz.text.parse as parse_mod
from otviz.text import benepar_parser
from otviz.text.builtin_parser import MAX_DEPTH
from otviz.text.parse import (
    batch_node_masks,
    node_token_masks,
    parse_caption,
    phrase_nodes,
)
from otviz.text.pos_lexicon import ADJECTIVES, CLOSED, MULTIWORD_PREPOSITIONS, VERBS
from otviz.text.tokens import WordTokenizer
from otviz.text.tree import Tree
from otviz.text.words import split_words
from otviz.world import SPLITS, World, realise
from tests.helpers import ROOT


def _check_tree(caption: str, tree: Tree) -> None:
    """Leaves are the caption's words; spans are word indices, contiguous and nested."""
    words = [w.text for w in split_words(caption)]
    if not words:
        assert (tree.label, tree.start, tree.end, tree.children) == ("S", 0, 0, ())
        return
    assert tree.leaves() == words
    assert (tree.start, tree.end) == (0, len(words))
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.is_leaf:
            assert node.end == node.start + 1 and node.word == words[node.start]
            continue
        assert node.word is None
        assert node.start == node.children[0].start and node.end == node.children[-1].end
        assert all(a.end == b.start for a, b in zip(node.children, node.children[1:], strict=False))
        stack.extend(node.children)


def _depth(tree: Tree) -> int:
    return 1 + max((_depth(c) for c in tree.children), default=0)


# -- the world's gold trees ------------------------------------------------------------------


@pytest.fixture(scope="module")
def world_samples():
    """700 samples of each split (2,100 in all)."""
    return [s for split in SPLITS for s in World(split=split, seed=0).samples(0, 700)]


def test_builtin_reproduces_world_gold_trees(world_samples):
    assert len(world_samples) >= 2000
    for s in world_samples:
        result = parse_caption(s.caption, "builtin")
        assert result.parser == "builtin"
        assert result.tree.to_bracket() == s.tree.to_bracket(), s.caption
        assert result.tree == s.tree, s.caption  # labels, spans, words, structure
        assert [w.text for w in result.words] == s.words


def test_builtin_reproduces_world_negative_trees():
    """Hard negatives (swaps, replacements, added objects) follow the same grammar."""
    n = 0
    for s in World(split="test", seed=3).samples(0, 150):
        for meaning in s.negative_meanings.values():
            gold = realise(meaning)
            assert parse_caption(gold.caption, "builtin").tree == gold.tree, gold.caption
            n += 1
    assert n >= 500


def test_builtin_world_noun_phrases_name_the_objects(world_samples):
    """The flat base NPs (NPs without NP children) are exactly the world's object phrases."""
    for s in world_samples[:300]:
        tree = parse_caption(s.caption, "builtin").tree
        base = [
            (n.start, n.end)
            for n in tree.phrases("NP")
            if not any(c.label == "NP" for c in n.children)
        ]
        assert base == [(p.start, p.end) for p in s.phrases]


# -- ordinary captions -----------------------------------------------------------------------

ORDINARY = {
    "a man riding a horse on the beach": {
        ("NP", "a man"),
        ("NP", "a horse"),
        ("NP", "the beach"),
        ("PP", "on the beach"),
        ("VP", "riding a horse on the beach"),
        ("NP", "a man riding a horse on the beach"),
    },
    "two dogs playing in the snow": {
        ("NP", "two dogs"),
        ("NP", "the snow"),
        ("PP", "in the snow"),
        ("VP", "playing in the snow"),
    },
    "a kitchen with a white fridge and a wooden table": {
        ("NP", "a kitchen"),
        ("NP", "a white fridge"),
        ("NP", "a wooden table"),
        ("PP", "with a white fridge"),
    },
    "A child leans into the camera brushing their teeth.": {
        ("NP", "A child"),
        ("NP", "the camera"),
        ("NP", "their teeth"),
        ("PP", "into the camera"),
        ("VP", "brushing their teeth"),
        ("VP", "leans into the camera brushing their teeth"),
    },
    "A woman slices a tomato on a cutting board.": {
        ("NP", "A woman"),
        ("NP", "a tomato"),
        ("NP", "a cutting board"),
        ("VP", "slices a tomato on a cutting board"),
    },
    "There are two cars parked on the street.": {
        ("NP", "two cars"),
        ("NP", "the street"),
        ("VP", "parked on the street"),
    },
    "A young boy is playing with a frisbee in the park.": {
        ("NP", "A young boy"),
        ("NP", "a frisbee"),
        ("NP", "the park"),
        ("VP", "is playing with a frisbee in the park"),
        ("VP", "playing with a frisbee in the park"),
    },
    "a group of people standing next to a black and white cat": {
        ("NP", "a group"),
        ("NP", "people"),
        ("NP", "a group of people"),
        ("PP", "next to a black and white cat"),
        ("NP", "a black and white cat"),
    },
    "The plate has a sandwich and some fries on it.": {
        ("NP", "The plate"),
        ("NP", "a sandwich"),
        ("NP", "some fries"),
        ("NP", "a sandwich and some fries"),
        ("NP", "it"),
        ("PP", "on it"),
    },
    "people walk down the street while a dog waits": {
        ("NP", "people"),
        ("NP", "the street"),
        ("NP", "a dog"),
        ("VP", "waits"),
    },
    "the sky is very blue": {("NP", "the sky"), ("ADJP", "very blue")},
    # an -s word missing from the verb list: a verb after "a <noun>", a noun after "the"
    "A woman sweeps the floor.": {("NP", "A woman"), ("VP", "sweeps the floor")},
    "the coffee cups on the table": {("NP", "the coffee cups"), ("PP", "on the table")},
}


@pytest.mark.parametrize("caption", list(ORDINARY))
def test_ordinary_captions_have_the_obvious_phrases(caption):
    result = parse_caption(caption, "builtin")
    _check_tree(caption, result.tree)
    found = {(n.label, n.span_text()) for n in result.tree.phrases()}
    assert ORDINARY[caption] <= found, sorted(found)
    assert result.tree.label == "S"


def test_ordinary_caption_tree_shapes():
    """Full trees where the structure is unambiguous."""
    tree = parse_caption("A child leans into the camera brushing their teeth.", "builtin").tree
    assert tree.to_bracket() == (
        "(S (NP (DT A) (NN child)) (VP (VBZ leans) (PP (IN into) (NP (DT the) (NN camera))) "
        "(VP (VBG brushing) (NP (PRP$ their) (NNS teeth)))) (. .))"
    )
    tree = parse_caption("two dogs playing in the snow", "builtin").tree
    assert tree.to_bracket() == (
        "(S (NP (NP (CD two) (NNS dogs)) (VP (VBG playing) (PP (IN in) (NP (DT the) (NN snow))))))"
    )


def test_sentences_become_s_children():
    tree = parse_caption("A dog. A cat sleeps!", "builtin").tree
    assert [c.label for c in tree.children] == ["S", "S"]
    assert [c.span_text() for c in tree.children] == ["A dog .", "A cat sleeps !"]
    decimal = parse_caption("a 3.5 inch screen. Off", "builtin").tree
    assert [c.span_text() for c in decimal.children] == ["a 3 . 5 inch screen .", "Off"]
    assert decimal.children[0].children[0].to_bracket() == (
        "(NP (DT a) (CD 3) (. .) (CD 5) (NN inch) (NN screen))"
    )


# -- robustness --------------------------------------------------------------------------------

ODD = [
    "",
    " ",
    "\n\t ",
    "!!!",
    "...",
    ",,,and",
    "😀😀 🐶",
    "naïve café",
    "日本語のキャプション",
    "12345",
    "3.14 dogs, 2,000 cats & 1st place",
    "( ( ( a ) ) ) [x] {y}",
    "“quoted” ‘text’ — dash – here…",
    "The The THE the",
    "A MAN RIDING A HORSE",
    "to the left of",
    "there is",
    "is is is is",
    "and and and",
    "of of of",
    "a" * 500,
    "a " * 3000,
    "of a " * 2000,
    "is " * 2000,
    "very " * 2000,
    "running " * 2000,
    "to " * 2000,
    "there is " * 1000,
    "a man riding a horse " * 400,
    "a dog that is " * 500,
]


@pytest.mark.parametrize("caption", ODD, ids=range(len(ODD)))
def test_odd_strings_never_crash(caption):
    result = parse_caption(caption, "builtin")
    _check_tree(caption, result.tree)
    assert _depth(result.tree) <= 3 * MAX_DEPTH + 4
    nodes = phrase_nodes(result.tree)
    assert len({(n.start, n.end) for n in nodes}) == len(nodes)
    result.tree.to_bracket()


_SOUP = sorted(
    {*CLOSED, *list(ADJECTIVES)[:40], *list(VERBS)[:40]}
    | {"dog", "dogs", "men", "walks", "riding", "parked", "quickly", "2", ",", ".", "'s"}
    | {" ".join(w for _, w in entry) for entry in MULTIWORD_PREPOSITIONS}
)


def test_word_soup_never_crashes():
    """Random sequences of lexicon words exercise every rule's boundary cases."""
    rng = random.Random(0)
    for _ in range(1500):
        caption = " ".join(rng.choice(_SOUP) for _ in range(rng.randint(0, 30)))
        _check_tree(caption, parse_caption(caption, "builtin").tree)


_ALPHABET = (
    " \t\n.,;:!?'\"()[]{}-&$%#@/\\*+=~`^|<>"
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    "\u00e9\u00ef\u00df\u2019\u201c\u201d\u2014\u2026\u65e5\u672c\u0416\u05d0\u0661"
    "\U0001f436\U0001f600\u200b\u00a0\ufb01"
)


def test_arbitrary_text_never_crashes():
    """Random strings over letters, digits, punctuation, whitespace and non-ASCII."""
    rng = random.Random(1)
    for _ in range(1500):
        caption = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 60)))
        _check_tree(caption, parse_caption(caption, "builtin").tree)


def test_bad_arguments():
    with pytest.raises(ValueError, match="parser"):
        parse_caption("a dog", "spacy")
    with pytest.raises(TypeError):
        parse_caption(None)  # type: ignore[arg-type]


# -- phrase nodes and token masks ------------------------------------------------------------


def test_phrase_nodes_against_reference(world_samples):
    for s in world_samples[:200] + [None]:
        caption = s.caption if s is not None else "A child leans into the camera brushing."
        tree = parse_caption(caption, "builtin").tree
        for min_words in (1, 2, 4):
            nodes = phrase_nodes(tree, min_words)
            spans = [(n.start, n.end) for n in nodes]
            expected = {
                (n.start, n.end) for n in tree.phrases() if n.end - n.start >= min_words
            } | {(0, tree.end)}
            assert set(spans) == expected
            assert spans == sorted(spans, key=lambda p: (p[0], -p[1]))  # pre-order
            assert nodes[0] is tree  # the root stands for its own span
            assert all(not n.is_leaf for n in nodes)


def test_phrase_nodes_world_example():
    caption = "a small red circle to the left of a blue star and a green ring"
    tree = parse_caption(caption, "builtin").tree
    texts = [n.span_text() for n in phrase_nodes(tree)]
    assert texts == [
        caption,  # S and the coordinated NP share this span
        "a small red circle to the left of a blue star",
        "a small red circle",
        "to the left of a blue star",
        "a blue star",
        "a green ring",
    ]
    assert phrase_nodes(parse_caption("", "builtin").tree) == []


@pytest.fixture(scope="module")
def tokenizer() -> WordTokenizer:
    return WordTokenizer(SimpleTokenizer(context_length=24))


def test_node_token_masks_against_loop(tokenizer):
    captions = [
        "a small red circle to the left of a blue star and a green ring",
        "A child leans into the camera brushing their teeth.",
        "naïve café, photobombing x2.5",
    ]
    batch = tokenizer(captions)
    trees = [parse_caption(c, "builtin").tree for c in captions]
    for b, tree in enumerate(trees):
        nodes = phrase_nodes(tree)
        mask = node_token_masks(nodes, batch.token_word[b])
        assert mask.shape == (len(nodes), batch.ids.shape[1]) and mask.dtype == torch.bool
        for k, node in enumerate(nodes):
            for pos, w in enumerate(batch.token_word[b].tolist()):
                assert bool(mask[k, pos]) == (node.start <= w < node.end)
        assert torch.equal(mask[0], batch.mask[b])  # the root covers every content token
    nodes, node_mask = batch_node_masks(trees, batch.token_word)
    K = max(len(phrase_nodes(t)) for t in trees)
    assert nodes.shape == (3, K, batch.ids.shape[1]) and node_mask.shape == (3, K)
    for b, tree in enumerate(trees):
        n = len(phrase_nodes(tree))
        assert torch.equal(nodes[b, :n], node_token_masks(phrase_nodes(tree), batch.token_word[b]))
        assert not nodes[b, n:].any() and not node_mask[b, n:].any()


def test_batch_node_masks_drop_truncated_nodes(tokenizer):
    caption = "a small red circle to the left of a blue star and " + "a green ring, " * 8
    batch = tokenizer([caption])
    assert batch.truncated[0]
    tree = parse_caption(caption, "builtin").tree
    nodes, node_mask = batch_node_masks([tree], batch.token_word)
    kept = batch.token_word[0][batch.mask[0]]
    for k, node in enumerate(phrase_nodes(tree)):
        survives = bool(((kept >= node.start) & (kept < node.end)).any())
        assert bool(node_mask[0, k]) == survives
    assert not node_mask[0].all()


# -- benepar ----------------------------------------------------------------------------------


@pytest.fixture
def fresh_model_cache():
    benepar_parser.model_path.cache_clear()
    yield
    benepar_parser.model_path.cache_clear()


def test_benepar_detection_finds_a_model_folder(tmp_path, monkeypatch, fresh_model_cache):
    monkeypatch.setenv("NLTK_DATA", str(tmp_path))
    if "nltk.data" in sys.modules:
        monkeypatch.setattr(sys.modules["nltk.data"], "path", [str(tmp_path)])
    folder = tmp_path / "models" / "benepar_en3"
    folder.mkdir(parents=True)
    assert benepar_parser.model_path() is None  # an empty folder is no model
    benepar_parser.model_path.cache_clear()
    (folder / "benepar_model.bin").write_bytes(b"")
    assert benepar_parser.model_path() == str(folder)
    assert benepar_parser.benepar_available()


def test_detection_is_cheap_and_offline():
    """Importing and using the parse API loads neither benepar, nltk nor transformers."""
    code = (
        "import sys, time; t = time.perf_counter();"
        "from otviz.text.parse import benepar_available, parse_caption;"
        "benepar_available(); parse_caption('a dog on a mat');"
        "print([m for m in ('benepar', 'nltk', 'transformers', 'spacy') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_auto_falls_back_to_builtin(monkeypatch):
    monkeypatch.setattr(parse_mod, "benepar_available", lambda: False)
    assert parse_caption("a dog on a mat").parser == "builtin"

    def broken(*args):
        raise RuntimeError("broken")

    builtin = parse_caption("a dog on a mat", "builtin").tree
    monkeypatch.setattr(parse_mod, "benepar_available", lambda: True)
    monkeypatch.setattr(parse_mod, "_benepar_failed", False)
    monkeypatch.setattr(parse_mod, "load_parser", lambda: None)
    monkeypatch.setattr(parse_mod, "parse_with_benepar", broken)
    result = parse_caption("a dog on a mat")  # benepar fails on this caption only
    assert (result.parser, result.tree) == ("builtin", builtin)
    assert not parse_mod._benepar_failed
    monkeypatch.setattr(parse_mod, "load_parser", broken)
    result = parse_caption("a dog on a mat")  # the model does not load: never retried
    assert (result.parser, result.tree) == ("builtin", builtin)
    assert parse_mod._benepar_failed


def test_explicit_benepar_without_model_raises(monkeypatch):
    monkeypatch.setattr(benepar_parser, "model_path", lambda: None)
    with pytest.raises(RuntimeError, match="not installed"):
        parse_caption("a dog", "benepar")


def test_tree_from_nltk_keeps_caption_words():
    nltk = pytest.importorskip("nltk")
    caption = "a dog (brown) runs."
    words = [w.text for w in split_words(caption)]
    out = nltk.Tree.fromstring(
        "(TOP (S (NP (NP (DT a) (NN dog)) (PRN (-LRB- -LRB-) (JJ brown) (-RRB- -RRB-))) "
        "(VP (VBZ runs)) (. .)))"
    )
    tree = benepar_parser.tree_from_nltk(out, words)
    assert tree.label == "S" and tree.leaves() == words
    _check_tree(caption, tree)
    assert [(n.label, n.start, n.end) for n in tree.phrases()] == [
        ("S", 0, 7),
        ("NP", 0, 5),
        ("NP", 0, 2),
        ("PRN", 2, 5),
        ("VP", 5, 6),
    ]
    fragment = nltk.Tree.fromstring("(TOP (NN dog) (NN park))")
    assert benepar_parser.tree_from_nltk(fragment, ["dog", "park"]).to_bracket() == (
        "(S (NN dog) (NN park))"
    )
    with pytest.raises(ValueError):
        benepar_parser.tree_from_nltk(out, words[:-1])
    with pytest.raises(ValueError):
        benepar_parser.tree_from_nltk(out, [*words, "extra"])
