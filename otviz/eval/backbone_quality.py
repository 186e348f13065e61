"""How well a backbone sees shape, colour, size and their binding: the measurements of the
embedded model's quality targets (issue 9), each next to its bar.

:func:`measure` runs, on the world the backbone was trained on (its checkpoint's recorded
world config, so a new image size or patch grid just works):

1. zero-shot on one-object held-out images, world phrasing and CLIP prompt form
   (:mod:`otviz.eval.single_object`);
2. linear probes of shape and colour from box-pooled patch features
   (:mod:`otviz.eval.patch_probe`);
3. the binding test: where each word of a true and a conflicting caption peaks, for FILIP,
   Dense UOT, ConceptOT (trained heads, or training-free where a head does not load) and
   the Words view (:mod:`otviz.eval.binding`);
4. the grounding table with its model-free baselines and the "colour not unique" column
   (:func:`otviz.eval.alignment_tables.grounding_table`);
5. global retrieval R@1 both ways with the world's text->image ceiling, and zero-shot on the
   compositional split (held-out colour-shape pairs).

World speed (6.) is measured by ``benchmarks/world_speed.py``; the CLI
(``benchmarks/backbone_quality.py``) adds it under ``"world_speed"``, and
:func:`target_rows` reads it from there. :func:`markdown` renders the results.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from otviz import assets
from otviz.backbone import Backbone
from otviz.backbone_spec import BackboneSpec
from otviz.checkpoints.store import CheckpointError
from otviz.eval import alignment_tables as A
from otviz.eval.binding import (
    CAPTION_KINDS,
    ROLES,
    binding_items,
    binding_results,
    method_source,
    words_view_source,
)
from otviz.eval.classification_tables import pooled_image_embeddings, pooled_text_embeddings
from otviz.eval.patch_probe import ATTRIBUTES, linear_probe_accuracy, object_features
from otviz.eval.retrieval import recall_at_k
from otviz.eval.single_object import (
    PROMPT_FORMS,
    TASKS,
    compositional_zero_shot,
    single_object_zero_shot,
)
from otviz.eval.table import Column, Table, format_value
from otviz.eval.world_set import EvalSet, world_config_of
from otviz.explain import Explainer
from otviz.suite import METHOD_LABELS, WORLD_FIT_CAPTIONS, MethodSuite, SuiteMethod, load_head
from otviz.world import World, WorldConfig, retrieval_ceiling

BINDING_METHODS: tuple[str, ...] = ("filip", "dense_uot", "conceptot")
GROUNDING_METHODS: tuple[str, ...] = ("dense_uot", "conceptot")
WORDS_VIEW = "words_view"
TRAINING_FREE = "training-free"
Progress = Callable[[str], None]


@dataclass
class QualityConfig:
    """What :func:`measure` runs on and how many samples each part draws."""

    backbone: str = ""  # tiny-CLIP checkpoint dir ("": the shipped checkpoints/tiny-clip)
    heads: str = str(assets.path("heads"))  # dir of <method>/ heads, or "training-free"
    seed: int = 0  # world seed of every held-out set
    n_zero_shot: int = 800  # one-object test images
    n_probe_scenes: int = 600  # test scenes whose objects feed the linear probes
    n_binding: int = 200  # scenes of the binding test
    n_grounding: int = 1000  # test images of the grounding table
    n_retrieval: int = 1000  # test pairs of global retrieval
    n_compositional: int = 400  # images of the compositional zero-shot view
    cache_dir: str = ".cache/otviz-features"

    @classmethod
    def quick(cls, **overrides: Any) -> QualityConfig:
        """Fewer samples, for comparing short training runs (about a minute on one core)."""
        sizes = {"n_zero_shot": 200, "n_probe_scenes": 200, "n_binding": 60,
                 "n_grounding": 150, "n_retrieval": 300, "n_compositional": 100}
        return cls(**{**sizes, **overrides})


def method_suite(
    backbone: Backbone, heads: str, names: tuple[str, ...]
) -> tuple[MethodSuite, dict[str, str]]:
    """The methods ``names`` with their trained heads from ``heads`` where one loads for
    ``backbone``, else training-free; and per method where it came from (with the reason
    when a head was refused)."""
    from otviz.checkpoints.identity import backbone_identity

    methods: dict[str, SuiteMethod] = {}
    sources: dict[str, str] = {}
    free: MethodSuite | None = None
    identity = backbone_identity(backbone) if heads and heads != TRAINING_FREE else None
    for name in names:
        if identity is not None:
            try:
                methods[name] = load_head(Path(heads) / name, identity)
                sources[name] = f"trained head {Path(heads) / name}"
                continue
            except CheckpointError as e:
                sources[name] = f"training-free (head does not load: {e})"
        else:
            sources[name] = TRAINING_FREE
        free = free or MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS, names)
        methods[name] = free.methods[name]
    return MethodSuite(backbone, methods, f"{backbone.name} ({heads or TRAINING_FREE})"), sources


@torch.no_grad()
def global_retrieval(
    backbone: Backbone, config: WorldConfig, n: int, seed: int = 0
) -> dict[str, float]:
    """R@1/5/10 both ways of the pooled embeddings on the first ``n`` test pairs (ties
    against the match), and the world's text->image R@1 ceiling of those captions."""
    samples = World(dataclasses.replace(config, negatives=False), "test", seed).samples(0, n)
    image = F.normalize(pooled_image_embeddings(backbone, [s.image for s in samples]), dim=-1)
    text = F.normalize(pooled_text_embeddings(backbone, [s.caption for s in samples]), dim=-1)
    return {**recall_at_k(image @ text.T), "t2i_r1_ceiling": retrieval_ceiling(samples),
            "n": n}


def binding_section(
    backbone: Backbone, suite: MethodSuite, config: WorldConfig, n: int, seed: int = 0
) -> dict[str, Any]:
    """:func:`~otviz.eval.binding.binding_results` of every method of ``suite`` and of the
    Words view over ``n`` held-out scenes."""
    world = World(dataclasses.replace(config, negatives=False), "test", seed)
    items = binding_items(world, n)
    height, width = items[0].image.shape[:2]
    geometry = backbone.geometry_on(width, height)
    sources = {name: method_source(backbone, entry) for name, entry in suite.methods.items()}
    sources[WORDS_VIEW] = words_view_source(Explainer(backbone))
    return {"n_scenes": len(items),
            "methods": {name: binding_results(items, src, geometry)
                        for name, src in sources.items()}}


def measure(
    config: QualityConfig, backbone: Backbone | None = None, progress: Progress | None = None
) -> dict[str, Any]:
    """Every measurement of the module docstring (1-5) for ``config`` (``backbone``: an
    already loaded backbone instead of ``config.backbone``), as a JSON-ready dict with the
    seconds each part took."""
    if backbone is None:
        backbone = BackboneSpec(checkpoint=config.backbone or None).load()
    world = world_config_of(backbone, negatives=False)
    say = progress or (lambda stage: None)
    timings: dict[str, float] = {}
    out: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "backbone": {"name": backbone.name, "grid": list(backbone.grid),
                     "image_size": world.image_size,
                     "world_version": backbone.info.get("world_version"),
                     "world_config": dataclasses.asdict(world)},
        "timings_s": timings,
    }

    def timed(key: str, run: Callable[[], Any]) -> Any:
        say(key)
        t0 = time.perf_counter()
        out[key] = run()
        timings[key] = time.perf_counter() - t0
        return out[key]

    timed("zero_shot", lambda: single_object_zero_shot(backbone, world, config.n_zero_shot,
                                                       config.seed))

    def probes() -> dict[str, Any]:
        samples = World(world, "test", config.seed).samples(0, config.n_probe_scenes)
        objects = object_features(backbone, samples)
        return {a: linear_probe_accuracy(objects, a, seed=config.seed) for a in ATTRIBUTES}

    timed("probe", probes)
    suite, sources = method_suite(backbone, config.heads, BINDING_METHODS)
    out["method_sources"] = sources
    timed("binding", lambda: binding_section(backbone, suite, world, config.n_binding,
                                             config.seed))

    def grounding() -> dict[str, Any]:
        data = EvalSet.build(backbone, config.n_grounding, "test", config.seed,
                             config.cache_dir, config=dataclasses.replace(world, negatives=True))
        chosen = MethodSuite(backbone, {n: suite.methods[n] for n in GROUNDING_METHODS},
                             suite.label)
        return A.grounding_table(chosen, data).to_dict()

    timed("grounding", grounding)
    timed("retrieval", lambda: global_retrieval(backbone, world, config.n_retrieval,
                                                config.seed))
    timed("compositional", lambda: compositional_zero_shot(backbone, world,
                                                           config.n_compositional, config.seed))
    return out


# ----------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    """One bar of the issue: a measured value (looked up by ``path`` in the results), the
    bar and whether it must be reached (``>=``) or exceeded over another value."""

    label: str
    path: tuple[str, ...]
    bar: float | tuple[str, ...]


def grounding_row(results: dict[str, Any], name: str) -> dict[str, Any]:
    """The row ``name`` (a method or baseline) of the results' grounding table."""
    return next(r for r in results["grounding"]["rows"] if r["name"] == name)


def _lookup(results: dict[str, Any], path: tuple[str, ...]) -> float | None:
    if path[0] == "grounding":
        try:
            return grounding_row(results, path[1])[path[2]]
        except (KeyError, StopIteration):
            return None
    value: Any = results
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def targets() -> list[Target]:
    """The bars of issue 9, in its order."""
    out = [Target(f"zero-shot {task} (world phrasing)", ("zero_shot", "world", task), bar)
           for task, bar in (("shape", 0.90), ("colour", 0.98), ("size", 0.90),
                             ("colour_shape", 0.85))]
    out += [Target("linear probe, shape (box-pooled patches)", ("probe", "shape", "accuracy"),
                   0.90),
            Target("linear probe, colour (box-pooled patches)", ("probe", "colour", "accuracy"),
                   0.98)]
    for name in (*BINDING_METHODS, WORDS_VIEW):
        label = _method_label(name)
        base = ("binding", "methods", name)
        out += [Target(f"{label}: true caption, shape word on A", (*base, "true", "shape", "on_a"),
                       0.85),
                Target(f"{label}: conflicting, shape word on A",
                       (*base, "conflicting", "shape", "on_a"), 0.60),
                Target(f"{label}: conflicting, colour word on B",
                       (*base, "conflicting", "colour", "on_b"), 0.60)]
    for name in GROUNDING_METHODS:
        label = _method_label(name)
        out += [Target(f"{label}: pointing game", ("grounding", name, "pointing"), 0.85),
                Target(f"{label}: pointing, colour not unique (bar: colour oracle)",
                       ("grounding", name, "pointing_shared_colour"),
                       ("grounding", "colour_oracle", "pointing_shared_colour"))]
    out += [Target("retrieval I->T R@1", ("retrieval", "i2t_r1"), 0.60),
            Target("retrieval T->I R@1", ("retrieval", "t2i_r1"), 0.60)]
    out += [Target(f"compositional zero-shot ({form} form)", ("compositional", form), 0.80)
            for form in PROMPT_FORMS]
    out.append(Target("world samples/s, one core (CPU time, no negatives)",
                      ("world_speed", "samples_per_s_cpu"), 2000.0))
    return out


def target_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each :func:`targets` bar with its measured value and whether it is met (``None``
    where the value was not measured). A numeric bar is met at ``>=``; a bar that names
    another value must be strictly exceeded."""
    rows = []
    for t in targets():
        value = _lookup(results, t.path)
        bar = t.bar if isinstance(t.bar, float) else _lookup(results, t.bar)
        if value is None or bar is None:
            met = None
        else:
            met = bool(value >= bar) if isinstance(t.bar, float) else bool(value > bar)
        rows.append({"target": t.label, "measured": value, "bar": bar,
                     "strict": not isinstance(t.bar, float), "met": met})
    return rows


def _method_label(name: str) -> str:
    return "Words view" if name == WORDS_VIEW else METHOD_LABELS.get(name, name)


# ----------------------------------------------------------------------- markdown
def _pct(value: Any) -> str:
    return format_value(value, "pct")


def _value(value: Any, bar: Any) -> str:
    if value is None:
        return "not measured"
    return f"{value:,.0f}" if isinstance(bar, float) and bar > 1 else _pct(value)


def markdown(results: dict[str, Any]) -> str:
    """The results as Markdown: the targets next to their bars, then each part's detail."""
    bb = results["backbone"]
    lines = [f"# Backbone quality: {bb['name']}, {bb['image_size']} px, "
             f"{bb['grid'][0]}x{bb['grid'][1]} patches (world {bb['world_version']})", ""]
    if results.get("command"):
        lines += [f"`{results['command']}`", ""]
    lines += ["| target | measured | bar | met |", "|---|---:|---:|---|"]
    for r in target_rows(results):
        bar = ("> " if r["strict"] else ">= ") + _value(r["bar"], r["bar"])
        met = {True: "yes", False: "**no**", None: "-"}[r["met"]]
        lines.append(f"| {r['target']} | {_value(r['measured'], r['bar'])} | {bar} | {met} |")
    lines += ["", *_zero_shot_lines(results), *_probe_lines(results), *_binding_lines(results)]
    if "grounding" in results:
        g = results["grounding"]
        columns = [Column(c["key"], c["label"], c["format"]) for c in g["columns"]]
        lines += [Table(g["key"], g["title"], columns, g["rows"], g["notes"]).markdown()]
    lines += _retrieval_lines(results)
    lines += ["**Where the methods come from**", ""]
    lines += [f"- {_method_label(n)}: {s}" for n, s in results.get("method_sources", {}).items()]
    timings = ", ".join(f"{k} {v:.1f} s" for k, v in results.get("timings_s", {}).items())
    lines += [f"- seconds per part: {timings}", ""]
    return "\n".join(lines)


def _zero_shot_lines(results: dict[str, Any]) -> list[str]:
    zs = results.get("zero_shot")
    if not zs:
        return []
    n = results["config"]["n_zero_shot"]
    keys = [*TASKS, "colour_shape.shape", "colour_shape.colour"]
    lines = [f"**Zero-shot on {n} one-object test images**", "",
             "| task | " + " | ".join(PROMPT_FORMS) + " |",
             "|---|" + "---:|" * len(PROMPT_FORMS)]
    lines += [f"| {k} | " + " | ".join(_pct(zs[f].get(k)) for f in PROMPT_FORMS) + " |"
              for k in keys]
    return lines + ["", "- shape / colour / size: candidates differ only in that attribute, "
                    "the others true; colour_shape: the 64 captions 'a <colour> <shape>', "
                    "both right (.shape / .colour: the chosen caption's shape or colour "
                    "alone); forms: world = 'a small red circle', clip = 'a photo of a small "
                    "red circle'", ""]


def _probe_lines(results: dict[str, Any]) -> list[str]:
    probe = results.get("probe")
    if not probe:
        return []
    lines = ["**Linear probes of box-pooled patch features**", "",
             "| attribute | accuracy | majority class | train objects | test objects |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {a} | {_pct(p['accuracy'])} | {_pct(p['majority'])} | {p['n_train']} | "
              f"{p['n_test']} |" for a, p in probe.items()]
    return lines + ["", "- logistic regression on standardised features; scenes split 70/30",
                    ""]


def _binding_lines(results: dict[str, Any]) -> list[str]:
    b = results.get("binding")
    if not b:
        return []
    lines = [f"**Binding: where each word's heatmap peaks ({b['n_scenes']} scenes)**", "",
             "| method | caption | " + " | ".join(f"{r} on A / B / elsewhere" for r in ROLES)
             + " |", "|---|---|" + "---:|" * len(ROLES)]
    for name, per_kind in b["methods"].items():
        for kind in CAPTION_KINDS:
            cells = [" / ".join(_pct(per_kind[kind][r][p]) for p in ("on_a", "on_b", "elsewhere"))
                     for r in ROLES]
            lines.append(f"| {_method_label(name)} | {kind} | " + " | ".join(cells) + " |")
    return lines + ["", "- true: A's size, colour and shape; conflicting: A's size and shape "
                    "with B's colour (false of the scene); A and B differ in colour and shape",
                    ""]


def _retrieval_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    r = results.get("retrieval")
    if r:
        lines += [f"**Global retrieval on {r['n']} test pairs**: I->T R@1 {_pct(r['i2t_r1'])}, "
                  f"R@5 {_pct(r['i2t_r5'])}; T->I R@1 {_pct(r['t2i_r1'])}, R@5 "
                  f"{_pct(r['t2i_r5'])}; T->I R@1 ceiling {_pct(r['t2i_r1_ceiling'])}", ""]
    c = results.get("compositional")
    if c:
        n = results["config"]["n_compositional"]
        lines += [f"**Compositional split zero-shot** ({n} images, held-out colour-shape "
                  "pairs): " + ", ".join(f"{f} {_pct(v)}" for f, v in c.items()), ""]
    w = results.get("world_speed")
    if w:
        lines += [f"**World speed** (one core): {w['samples_per_s_cpu']:,.0f} samples/s CPU "
                  f"time, {w['samples_per_s_wall']:,.0f} wall (no negatives, "
                  f"{w['count']} samples)", ""]
    return lines
