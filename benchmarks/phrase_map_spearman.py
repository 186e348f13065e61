"""Do a method's phrase maps depend on the phrase? For every image, the Spearman rank
correlation between the maps of each two different gold phrases of its caption (the grounding
table's own heatmaps, :func:`otviz.eval.alignment_tables.phrase_heatmaps`), summarised by the
median over pairs with a 95 % bootstrap interval over images, next to the pointing game of the
same maps (95 % bootstrap interval over images), shipped heads and training-free.

A map that ignores the phrase (the same blob for every phrase of an image) has Spearman 1 for
every pair; issue 42 asks PowerCLIP's for a median below 0.5.

Usage::

    python benchmarks/phrase_map_spearman.py [--seeds 86311,90217] [--n-test 300]
        [--heads DIR] [--methods powerclip] [--out benchmarks/phrase_map_spearman]

writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from otviz import assets
from otviz.eval.alignment_tables import phrase_heatmaps, phrase_queries
from otviz.eval.grounding_metrics import pointing_hits
from otviz.eval.runner import build_suite, load_backbone
from otviz.eval.seeds import group_bootstrap
from otviz.eval.world_set import EvalSet
from otviz.suite import METHOD_LABELS

CONFIGS = ("trained", "free")
DRAWS = 2000


def pair_correlations(heat: np.ndarray, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rho [Q], image [Q])``: Spearman's rho of the maps ``heat [P, N]`` of every two
    phrases of one image (``image [P]``), and that image. A constant map has no ranks: its
    pairs get rho 1 (it is the same map whatever the phrase)."""
    rhos, groups = [], []
    for j in np.unique(image):
        rows = np.flatnonzero(image == j)
        for a, b in itertools.combinations(rows, 2):
            flat = np.ptp(heat[a]) == 0 or np.ptp(heat[b]) == 0
            rhos.append(1.0 if flat else float(spearmanr(heat[a], heat[b]).statistic))
            groups.append(j)
    return np.asarray(rhos), np.asarray(groups)


def median_interval(values: np.ndarray, groups: np.ndarray, level: float = 0.95,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the median of ``values`` over bootstrap resamples of whole
    ``groups`` (images: the pairs of one image move together)."""
    rng = np.random.default_rng(seed)
    ids = np.unique(groups)
    by_group = [values[groups == g] for g in ids]
    medians = [np.median(np.concatenate([by_group[i] for i in rng.integers(0, len(ids),
                                                                            len(ids))]))
               for _ in range(DRAWS)]
    tail = 100 * (1 - level) / 2
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def measure(seeds: list[int], n_test: int, heads: str, names: tuple[str, ...]) -> dict:
    backbone = load_backbone()
    suites = {"trained": build_suite(backbone, heads, names),
              "free": build_suite(backbone, "training-free", names)}
    parts: dict[tuple[str, str], dict[str, list[np.ndarray]]] = {}
    for seed in seeds:
        data = EvalSet.build(backbone, n_test, "test", seed)
        q = phrase_queries(data)
        image = q.image.numpy() + seed * 10**6  # images of different seeds never pair
        for config, suite in suites.items():
            for name in names:
                heat = phrase_heatmaps(suite.methods[name], data, q.image,
                                       data.positives[q.image], q.select)
                hits = pointing_hits(heat, data.geometry, q.boxes).double().numpy()
                rho, pair_image = pair_correlations(heat.numpy(), image)
                got = parts.setdefault((name, config), {k: [] for k in
                                                        ("hits", "image", "rho", "pair_image")})
                for key, value in (("hits", hits), ("image", image), ("rho", rho),
                                   ("pair_image", pair_image)):
                    got[key].append(value)
    rows = []
    for (name, config), got in parts.items():
        hits, image, rho, pair_image = (np.concatenate(got[k]) for k in
                                        ("hits", "image", "rho", "pair_image"))
        rows.append({
            "method": name, "label": METHOD_LABELS[name], "config": config,
            "phrases": len(hits), "images": len(np.unique(image)), "pairs": len(rho),
            "pointing": 100 * hits.mean(),
            "pointing_ci": [100 * v for v in group_bootstrap(hits, image)],
            "median_rho": float(np.median(rho)),
            "median_rho_ci": list(median_interval(rho, pair_image)),
            "share_above_half": 100 * float((rho > 0.5).mean()),
        })
    return {"seeds": seeds, "n_test": n_test, "heads": heads, "rows": rows}


def markdown(result: dict) -> str:
    lines = [f"**Do the phrase maps depend on the phrase?** (heads: {result['heads']}; world "
             f"test seeds {', '.join(map(str, result['seeds']))}, {result['n_test']} images "
             "each; Spearman's rho between the maps of two different gold phrases of one "
             "image; 95 % bootstrap intervals over images)", "",
             "| method | heads | phrases | phrase pairs | pointing | median rho | pairs with "
             "rho > 0.5 |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['label']} | {r['config']} | {r['phrases']} | {r['pairs']} | "
                     "{:.1f} [{:.1f}, {:.1f}] | ".format(r["pointing"], *r["pointing_ci"])
                     + "{:.3f} [{:.3f}, {:.3f}] | ".format(r["median_rho"], *r["median_rho_ci"])
                     + f"{r['share_above_half']:.1f} % |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="86311,90217")
    parser.add_argument("--n-test", type=int, default=300)
    parser.add_argument("--heads", default=str(assets.path("heads")))
    parser.add_argument("--methods", default="powerclip", help="comma list")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/phrase_map_spearman")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    result = measure([int(s) for s in args.seeds.split(",")], args.n_test, args.heads,
                     tuple(args.methods.split(",")))
    result["seconds"] = round(time.perf_counter() - start, 1)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
