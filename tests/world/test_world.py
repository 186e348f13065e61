"""The synthetic world: determinism, caption/tree/phrase/box ground truth checked against
the rendered pixels, the semantic evaluator on hand-built scenes, hard negatives, splits,
the classification view and the long-tailed profile."""

import copy
import dataclasses
import json
import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from itertools import combinations, permutations

import numpy as np
import pytest

from otviz.text.tree import Tree
from otviz.text.words import split_words
from otviz.world import (
    COLOUR_RGB,
    COLOURS,
    HELD_OUT_PAIRS,
    NEGATIVE_CATEGORIES,
    SHAPES,
    ClassificationView,
    Clause,
    Description,
    Meaning,
    SceneObject,
    World,
    WorldConfig,
    ambiguous_caption_share,
    caption_match_counts,
    export_samples,
    is_true,
    long_tailed_counts,
    realise,
    render_grid,
    retrieval_ceiling,
)
from otviz.world.draws import integers, shuffled
from otviz.world.render import shape_alpha
from otviz.world.scene import boxes_overlap, relation_holds
from otviz.world.semantics import satisfying_assignment
from tests.helpers import ROOT

CFG = WorldConfig()
# a fully covered pixel is its palette colour + jitter + grain (+1 for rounding to uint8)
TOL = CFG.colour_jitter + CFG.pixel_noise + 1


@pytest.fixture(scope="module")
def test_samples():
    return World(CFG, "test", seed=0).samples(0, 300)


def _colour_footprint(image: np.ndarray, box, colour: str) -> np.ndarray:
    """Pixels of the box within TOL of the palette colour in every channel."""
    x0, y0, x1, y1 = box
    diff = np.abs(image[y0:y1, x0:x1].astype(int) - np.asarray(COLOUR_RGB[colour]))
    return (diff <= TOL).all(axis=-1)


def _check_object_pixels(image: np.ndarray, obj: SceneObject) -> None:
    """The box shows an object of the stated colour, shape and size: the pixels of that
    colour in the box cover every pixel the shape fully covers and lie within the shape."""
    x0, y0, x1, y1 = obj.box
    alpha = shape_alpha(obj.shape, x1 - x0)
    footprint = _colour_footprint(image, obj.box, obj.colour)
    assert footprint[alpha == 1.0].all(), obj
    assert not footprint[alpha == 0.0].any(), obj


def _allowed_side(obj: SceneObject) -> bool:
    lo, hi = CFG.small_px if obj.size == "small" else CFG.large_px
    x0, y0, x1, y1 = obj.box
    return lo <= x1 - x0 <= hi and x1 - x0 == y1 - y0


def test_same_seed_same_sample_different_seed_differs():
    a, b = World(CFG, "train", 3), World(CFG, "train", 3)
    for i in (0, 7, 123):
        sa, sb = a.sample(i), b.sample(i)
        assert np.array_equal(sa.image, sb.image)
        assert sa.caption == sb.caption and sa.negatives == sb.negatives
        assert sa.objects == sb.objects
    other_seed = World(CFG, "train", 4).samples(0, 20)
    other_split = World(CFG, "test", 3).samples(0, 20)
    same = a.samples(0, 20)
    for others in (other_seed, other_split):
        assert sum(x.caption != y.caption for x, y in zip(same, others, strict=True)) >= 15
        assert all(not np.array_equal(x.image, y.image) for x, y in zip(same, others, strict=True))


def test_negatives_flag_changes_nothing_else():
    s = World(CFG, "test", 1).sample(5)
    t = World(WorldConfig(negatives=False), "test", 1).sample(5)
    assert np.array_equal(s.image, t.image) and s.caption == t.caption and t.negatives == {}


def test_deferred_negatives_are_made_once_and_survive_copies():
    """World samples make their negatives on first read; a read from a copy, a deep copy or
    a pickle made before any read, from racing threads, or through dataclasses.replace,
    gives the same values as a plain read (the generator is consumed once)."""
    world = World(CFG, "train", 5)
    for i in range(12):
        ref = world.sample(i)
        expect = (dict(ref.negative_meanings), dict(ref.negatives))
        assert expect[0] and set(expect[1]) == set(expect[0])
        s = world.sample(i)
        copies = [copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s)), s]
        assert all((c.negative_meanings, c.negatives) == expect for c in copies)
        assert "_deferred_negatives" not in pickle.loads(pickle.dumps(world.sample(i))).__dict__
        racing = [world.sample(i)] * 8
        with ThreadPoolExecutor(4) as pool:
            reads = list(pool.map(lambda t: (t.negative_meanings, t.negatives), racing))
        assert all(r == expect for r in reads)
        assert dataclasses.replace(world.sample(i), caption="x").negatives == expect[1]
    with pytest.raises(AttributeError):
        _ = world.sample(0).no_such_field


def test_words_tree_and_phrases(test_samples):
    for s in test_samples:
        assert s.words == [w.text for w in split_words(s.caption)]
        assert s.tree.leaves() == s.words
        # word spans of every node are right: a bracket round trip recomputes them
        assert Tree.from_bracket(s.tree.to_bracket()) == s.tree
        nps = {(n.start, n.end) for n in s.tree.phrases("NP")}
        assert len(s.phrases) == len(s.meaning.descriptions()) >= 1
        for p, d in zip(s.phrases, s.meaning.descriptions(), strict=True):
            assert (p.start, p.end) in nps
            assert p.text == " ".join(s.words[p.start : p.end])
            assert p.text.split()[-2:] == [d.colour, d.shape]
            obj = s.objects[p.object_index]
            assert p.box == obj.box and obj.mentioned
            assert d.matches(obj)
            # the noun phrase names exactly one scene object (sizes kept where needed)
            assert sum(d.matches(o) for o in s.objects) == 1
        mentioned = sorted(p.object_index for p in s.phrases)
        assert mentioned == [k for k, o in enumerate(s.objects) if o.mentioned]


def test_documented_tree_convention():
    m = Meaning((
        Clause(Description("red", "circle", "small"), "left_of", Description("blue", "star")),
        Clause(Description("green", "ring")),
    ))
    r = realise(m)
    assert r.caption == "a small red circle to the left of a blue star and a green ring"
    assert r.tree.to_bracket() == (
        "(S (NP (NP (NP (DT a) (JJ small) (JJ red) (NN circle)) (PP (TO to) (DT the) "
        "(NN left) (IN of) (NP (DT a) (JJ blue) (NN star)))) (CC and) "
        "(NP (DT a) (JJ green) (NN ring))))"
    )
    assert r.spans == [(0, 4), (8, 11), (12, 15)]
    three = Meaning(tuple(Clause(Description(c, "star", None)) for c in ("orange", "red", "cyan")),
                    there_is=True)
    r3 = realise(three)
    assert r3.caption == "there is an orange star, a red star and a cyan star"
    assert r3.tree.to_bracket() == (
        "(S (EX there) (VBZ is) (NP (NP (DT an) (JJ orange) (NN star)) (, ,) "
        "(NP (DT a) (JJ red) (NN star)) (CC and) (NP (DT a) (JJ cyan) (NN star))))"
    )


def test_scene_layout_and_pixels(test_samples):
    counts = np.zeros(5, int)
    for s in test_samples:
        assert s.image.shape == (80, 80, 3) and s.image.dtype == np.uint8
        assert s.image.flags.c_contiguous
        assert 1 <= len(s.objects) <= 4
        counts[len(s.objects)] += 1
        triples = [(o.colour, o.shape, o.size) for o in s.objects]
        assert len(set(triples)) == len(triples)
        for o in s.objects:
            assert _allowed_side(o)
            assert CFG.margin <= min(o.box[:2]) and max(o.box[2:]) <= 80 - CFG.margin
            _check_object_pixels(s.image, o)
        for a, b in combinations(s.objects, 2):
            assert not boxes_overlap(a.box, b.box, CFG.margin)
    assert counts[1:].min() > 0
    assert any(not o.mentioned for s in test_samples for o in s.objects)


def test_semantics_on_hand_built_scene():
    red_circle = SceneObject("circle", "red", "small", (5, 30, 21, 46))
    blue_star = SceneObject("star", "blue", "large", (40, 28, 66, 54))
    green_ring = SceneObject("ring", "green", "small", (44, 2, 58, 16), mentioned=False)
    scene = [red_circle, blue_star, green_ring]
    rc, bs, gr = Description("red", "circle"), Description("blue", "star"), Description(
        "green", "ring")

    def rel(a, r, b):
        return is_true(Meaning((Clause(a, r, b),)), scene)

    assert rel(rc, "left_of", bs) and rel(bs, "right_of", rc)
    assert not rel(rc, "right_of", bs) and not rel(rc, "above", bs)
    # the ring is over the star (x ranges overlap): above it, neither left nor right of it
    assert rel(gr, "above", bs) and not rel(gr, "left_of", bs) and not rel(gr, "right_of", bs)
    # ring and circle are a diagonal pair: two relations hold, their converses do not
    assert rel(gr, "above", rc) and rel(gr, "right_of", rc) and rel(rc, "left_of", gr)
    assert not rel(gr, "below", rc) and not rel(gr, "left_of", rc)
    assert is_true(Meaning((Clause(rc), Clause(gr))), scene)  # distractors count
    assert not is_true(Meaning((Clause(Description("red", "circle", "large")),)), scene)
    assert not is_true(Meaning((Clause(rc), Clause(rc))), scene)  # distinct objects


def _brute_force_true(meaning: Meaning, objects: list[SceneObject]) -> bool:
    """Truth by enumerating every injective assignment of objects to noun phrases."""
    descs = meaning.descriptions()
    return any(
        all(d.matches(objects[j]) for d, j in zip(descs, chosen, strict=True))
        and all(relation_holds(r, objects[chosen[a]].box, objects[chosen[b]].box)
                for a, r, b in meaning.relations())
        for chosen in permutations(range(len(objects)), len(descs))
    )


def test_semantics_against_enumeration(test_samples):
    """The backtracking evaluator agrees with exhaustive enumeration on every caption and
    negative of one image against the scenes of others (true and false cases alike)."""
    verdicts = []
    for s, other in zip(test_samples[:120], test_samples[1:121], strict=True):
        for m in (s.meaning, *s.negative_meanings.values()):
            for objects in (s.objects, other.objects):
                found = satisfying_assignment(m, objects)
                assert (found is not None) == _brute_force_true(m, objects) == is_true(m, objects)
                if found is not None:
                    assert len(set(found)) == len(found)
                    assert all(d.matches(objects[j])
                               for d, j in zip(m.descriptions(), found, strict=True))
                verdicts.append(found is not None)
    assert 0.05 < np.mean(verdicts) < 0.95


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 21, 64])
def test_fast_draws_match_numpy_and_leave_the_same_stream(n):
    """``draws.integers`` and ``draws.shuffled`` return what numpy's sized integer draw and
    permutation return, and leave the generator in the same state (also with half of a
    64-bit draw buffered)."""
    items = [f"item{k}" for k in range(n)]
    for seed in range(40):
        a, b = np.random.default_rng(seed), np.random.default_rng(seed)
        assert a.integers(7) == b.integers(7)  # leaves a buffered 32-bit half
        assert integers(a, -3, 11, n) == b.integers(-3, 11, size=n).tolist()
        assert shuffled(items, a) == [items[k] for k in b.permutation(n).tolist()]
        assert a.bit_generator.state == b.bit_generator.state
        assert a.integers(1000, size=3).tolist() == b.integers(1000, size=3).tolist()


def test_negatives_are_false_and_minimal(test_samples):
    seen = set()
    for s in test_samples:
        assert is_true(s.meaning, s.objects)
        assert set(s.negatives) <= set(NEGATIVE_CATEGORIES)
        for k in ("replace_obj", "replace_att", "add_obj"):
            assert k in s.negatives
        assert ("replace_rel" in s.negatives) == bool(s.meaning.relations())
        for cat, neg in s.negatives.items():
            seen.add(cat)
            m = s.negative_meanings[cat]
            assert realise(m).caption == neg != s.caption
            assert not is_true(m, s.objects)
            assert len(set(m.descriptions())) == len(m.descriptions())
            words = [w.text for w in split_words(neg)]
            if cat == "replace_rel":
                assert m.descriptions() == s.meaning.descriptions()
                old, new = s.meaning.relations(), m.relations()
                assert sum(a != b for a, b in zip(old, new, strict=True)) == 1
            elif cat.startswith("replace"):
                assert len(words) == len(s.words)
                changed = [k for k, (a, b) in enumerate(zip(words, s.words, strict=True)) if a != b]
                assert len(changed) == 1 or (  # or the article follows the new word
                    len(changed) == 2 and s.words[changed[0]] in ("a", "an"))
            elif cat.startswith("swap"):
                strip = sorted(w for w in words if w not in ("a", "an"))
                assert strip == sorted(w for w in s.words if w not in ("a", "an"))
            else:  # add_obj: one more noun phrase, the original ones in order
                assert len(m.descriptions()) == len(s.meaning.descriptions()) + 1
    assert seen == set(NEGATIVE_CATEGORIES)


def test_compositional_split():
    assert 0.12 <= len(HELD_OUT_PAIRS) / (len(COLOURS) * len(SHAPES)) <= 0.18
    held = set(HELD_OUT_PAIRS)
    seen_pairs = {(c, s) for c in COLOURS for s in SHAPES} - held
    assert {c for c, _ in seen_pairs} == set(COLOURS) and {s for _, s in seen_pairs} == set(SHAPES)
    train = World(WorldConfig(negatives=False), "train", 0).samples(0, 2500)
    assert all((o.colour, o.shape) not in held for s in train for o in s.objects)
    for s in World(CFG, "train", 1).samples(0, 300):
        for m in s.negative_meanings.values():
            assert all((d.colour, d.shape) not in held for d in m.descriptions())
    comp = World(CFG, "compositional", 0).samples(0, 300)
    for s in comp:
        assert any((o.colour, o.shape) in held for o in s.objects if o.mentioned)
        assert is_true(s.meaning, s.objects)
        assert all(not is_true(m, s.objects) for m in s.negative_meanings.values())
    assert {(o.colour, o.shape) for s in comp for o in s.objects} >= held


def test_match_counts_against_brute_force(test_samples):
    subset = test_samples[:80]
    counts = caption_match_counts(subset)
    brute = [sum(is_true(s.meaning, t.objects) for t in subset) for s in subset]
    assert counts.tolist() == brute and counts.min() >= 1
    assert ambiguous_caption_share(subset) == np.mean(np.asarray(brute) > 1)
    assert retrieval_ceiling(subset) == pytest.approx(np.mean(1 / np.asarray(brute)))


def test_long_tailed_counts_profile():
    lt = long_tailed_counts(10, 100, 10.0, "lt")
    assert lt[0] == 100 and lt[-1] == 10 and lt[0] / lt[-1] == 10
    assert all(a >= b for a, b in zip(lt, lt[1:], strict=False))
    for k, c in enumerate(lt):
        assert abs(c - 100 * 10 ** (-k / 9)) <= 0.5
    assert long_tailed_counts(10, 100, 10.0, "reverse") == lt[::-1]
    assert long_tailed_counts(10, 100, 10.0, "uniform") == [100] * 10
    assert long_tailed_counts(8, 50, 5.0)[-1] == 10
    with pytest.raises(ValueError):
        long_tailed_counts(4, 10, 2.0, "sideways")


@pytest.mark.parametrize("task", ["shape", "colour", "colour_shape"])
def test_classification_labels_match_pixels(task):
    view = ClassificationView(task, "test", seed=0, distractors=True)
    assert len(view.prompts()) == len(view.classes)
    for i in range(40):
        image, label, objects = view.sample_scene(i)
        assert np.array_equal(view.sample(i)[0], image)
        first, *others = objects
        assert view.label_of(first.colour, first.shape) == label
        assert all(view.label_of(o.colour, o.shape) != label for o in others)
        for o in objects:
            _check_object_pixels(image, o)
    images, labels = view.long_tailed(12, 4.0, "lt", seed=1)
    expected = long_tailed_counts(len(view.classes), 12, 4.0, "lt")
    assert np.bincount(labels, minlength=len(view.classes)).tolist() == expected
    assert images.shape == (sum(expected), 80, 80, 3)


def test_classification_classes_and_prompts():
    assert ClassificationView("shape").classes == list(SHAPES)
    colour = ClassificationView("colour")
    assert colour.prompt("orange") == "a photo of an orange object"
    assert ClassificationView("colour_shape").prompt("red circle") == "a photo of a red circle"
    comp = ClassificationView("colour_shape", "compositional")
    assert comp.classes == [f"{c} {s}" for c, s in HELD_OUT_PAIRS]
    assert not set(comp.classes) & set(ClassificationView("colour_shape", "test").classes)


def test_export_and_grid(tmp_path):
    records = export_samples(tmp_path, 8, split="test", seed=0, scale=3)
    assert json.loads((tmp_path / "captions.json").read_text()) == records
    captions = [r["caption"] for r in records]
    assert any(" and " in c for c in captions) and any(" of " in c or "above" in c or
                                                       "below" in c for c in captions)
    for r in records:
        from PIL import Image

        img = np.asarray(Image.open(tmp_path / r["file"]))
        assert img.shape == (240, 240, 3)
        assert len(r["boxes"]) == len(r["phrases"])
    world = World(CFG, "test", 0)
    grid = render_grid(world.samples(0, 6), columns=4, gutter=2)
    assert grid.shape == (2 * 82 + 2, 4 * 82 + 2, 3)


@pytest.mark.parametrize("n, scale", [(0, 3), (-3, 3), (2, 0)])
def test_export_refuses_empty_sets_before_writing(tmp_path, n, scale):
    with pytest.raises(ValueError, match="needs n >= 1 and scale >= 1"):
        export_samples(tmp_path / "out", n, scale=scale)
    assert not (tmp_path / "out").exists()


def test_world_speed_benchmark_runs(tmp_path):
    """The throughput benchmark runs end to end (a tiny, untimed run) and writes the wall
    and CPU rates of its three settings; it pins itself to the CPU it is given."""
    cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else -1
    out = tmp_path / "world_speed.json"
    script = ROOT / "benchmarks" / "world_speed.py"
    subprocess.run(
        [sys.executable, str(script), "--count", "4", "--repeats", "1", "--cpu", str(cpu),
         "--out", str(out)],
        check=True, capture_output=True,
    )
    result = json.loads(out.read_text())
    settings = [(row["negatives"], row["read_negatives"]) for row in result["rows"]]
    assert settings == [(False, False), (True, False), (True, True)]
    for row in result["rows"]:
        assert row["count"] == 4 and row["repeats"] == 1
        for key in ("samples_per_s_wall", "samples_per_s_cpu", "us_per_sample_cpu"):
            assert 0 < row[key] < float("inf")
        assert row["samples_per_s_wall"] * row["wall_s"] == pytest.approx(4)
    if cpu >= 0:
        assert result["cpus"] == [cpu]
    assert "--count 4" in result["command"]
