"""What the trained heads add over the training-free configuration: pointing per method,
trained (shipped heads) vs training-free, paired per phrase, with 95 % bootstrap intervals
over images, and each shipped head's training time from its checkpoint.

The heatmaps are the grounding table's own (:func:`otviz.eval.alignment_tables.phrase_heatmaps`,
:func:`otviz.eval.grounding_metrics.pointing_hits`) on world test draws; both
configurations score the same phrases, so the difference is the heads' alone.

Usage::

    python benchmarks/head_gain.py [--seeds 7301,7302] [--n-test 500] [--heads DIR]
        [--methods A,B] [--threads N] [--out benchmarks/head_gain]

writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from otviz import assets
from otviz.backbone_spec import BackboneSpec
from otviz.checkpoints.heads import head_meta
from otviz.checkpoints.manifest import read_manifest
from otviz.eval.alignment_tables import phrase_heatmaps, phrase_queries
from otviz.eval.grounding_metrics import pointing_hits
from otviz.eval.runner import build_suite
from otviz.eval.seeds import group_bootstrap
from otviz.eval.segmentation import reading
from otviz.eval.world_set import EvalSet
from otviz.suite import ALIGN_METHODS, METHOD_LABELS

CONFIGS = ("trained", "free")


def train_time(heads: Path, name: str) -> dict:
    """Learning rate and steps of the head (its checkpoint) and the wall time of its
    training run (the manifest next to the heads folder; None when it has no entry)."""
    meta = head_meta(heads / name)
    entry = read_manifest(heads.parent / "manifest.json")["checkpoints"].get(
        f"{heads.name}/{name}", {})
    return {"steps": int(meta["metrics"].get("steps", 0)), "lr": meta["train_config"]["lr"],
            "train_s": entry.get("wall_time_s")}


def measure(seeds: list[int], n_test: int, heads: str, cache: str,
            names: tuple[str, ...] = tuple(ALIGN_METHODS)) -> dict:
    backbone = BackboneSpec().load()
    suites = {"trained": build_suite(backbone, heads, names),
              "free": build_suite(backbone, "training-free", names)}
    hits: dict[str, dict[str, list[np.ndarray]]] = {}
    shared: list[np.ndarray] = []
    groups: list[np.ndarray] = []
    for seed in seeds:
        data = EvalSet.build(backbone, n_test, "test", seed, cache)
        q = phrase_queries(data)
        groups.append(q.image.numpy() + seed * 10**6)
        shared.append(q.shared_colour.numpy())
        for config, suite in suites.items():
            for name in names:
                entry = suite.methods[name]
                heat = phrase_heatmaps(entry, data, q.image, data.positives[q.image], q.select)
                got = pointing_hits(heat, data.geometry, q.boxes).double().numpy()
                hits.setdefault(name, {c: [] for c in CONFIGS})[config].append(got)
    group, colour = np.concatenate(groups), np.concatenate(shared)
    rows = []
    for name, row in hits.items():
        trained, free = (np.concatenate(row[c]) for c in CONFIGS)
        diff = trained - free
        rows.append({
            "method": name, "label": METHOD_LABELS[name], "n": len(trained),
            "trained": 100 * trained.mean(),
            "trained_ci": [100 * v for v in group_bootstrap(trained, group)],
            "trained_shared_colour": 100 * trained[colour].mean(),
            "free": 100 * free.mean(),
            "free_ci": [100 * v for v in group_bootstrap(free, group)],
            "free_shared_colour": 100 * free[colour].mean(),
            "difference": 100 * diff.mean(),
            "difference_ci": [100 * v for v in group_bootstrap(diff, group)],
            **train_time(Path(heads), name),
        })
    return {"seeds": seeds, "n_test": n_test, "heads": heads, "reading": reading(backbone),
            "rows": rows}


def markdown(result: dict) -> str:
    lines = [f"**Trained heads vs the training-free configuration** ({result['reading']}; "
             f"heads: {result['heads']}; "
             f"world test seeds {', '.join(map(str, result['seeds']))}, {result['n_test']} "
             "images each; pointing in %, 95 % bootstrap intervals over images)", "",
             "| method | phrases | trained | training-free | trained - free | trained, colour "
             "not unique | free, colour not unique | head: lr, steps, train s |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        ci = {k: "[{:.1f}, {:.1f}]".format(*r[k + "_ci"])
              for k in ("trained", "free", "difference")}
        seconds = "?" if r["train_s"] is None else f"{r['train_s']:.0f}"
        lines.append(f"| {r['label']} | {r['n']} | {r['trained']:.1f} {ci['trained']} | "
                     f"{r['free']:.1f} {ci['free']} | {r['difference']:+.1f} "
                     f"{ci['difference']} | {r['trained_shared_colour']:.1f} | "
                     f"{r['free_shared_colour']:.1f} | {r['lr']:g}, {r['steps']}, {seconds} |")
    return "\n".join(lines) + "\n"


def save(out: Path, result: dict, text: str) -> None:
    """``OUT.json`` (the result) and ``OUT.md`` (its table ``text``), and the table printed."""
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="7301,7302")
    parser.add_argument("--n-test", type=int, default=500)
    parser.add_argument("--heads", default=str(assets.path("heads")))
    parser.add_argument("--cache-dir", default=".cache/otviz-features")
    parser.add_argument("--methods", default="", help="comma list (default: all eight)")
    parser.add_argument("--out", default="benchmarks/head_gain")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    names = tuple(args.methods.split(",")) if args.methods else tuple(ALIGN_METHODS)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    result = measure([int(s) for s in args.seeds.split(",")], args.n_test, args.heads,
                     args.cache_dir, names)
    result["seconds"] = round(time.perf_counter() - start, 1)
    save(Path(args.out), result, markdown(result))


if __name__ == "__main__":
    main()
