"""Pointing of the same heatmaps read with the tower's token geometry and with the old
assumption (every token centred on an even split of the image into cells), paired per
phrase, with 95 % bootstrap intervals over images.

The heatmaps are computed once per method (shipped heads, or ``--heads training-free``) on
world test draws; only where the hottest token is placed differs, so the difference is the
geometry's alone. For otviz's convolutional stem the tower's geometry puts token (i, j) at
(8 j + 0.5, 8 i + 0.5), the old assumption at (8 j + 4, 8 i + 4).

Usage::

    python benchmarks/geometry_pointing.py [--seeds 4242,4243] [--n-test 500]
        [--heads DIR | training-free] [--out benchmarks/geometry_pointing]

writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from head_gain import save  # noqa: E402

from otviz import assets  # noqa: E402
from otviz.backbone_spec import BackboneSpec  # noqa: E402
from otviz.eval.alignment_tables import phrase_heatmaps, phrase_queries  # noqa: E402
from otviz.eval.grounding_metrics import pointing_hits  # noqa: E402
from otviz.eval.runner import build_suite  # noqa: E402
from otviz.eval.seeds import group_bootstrap  # noqa: E402
from otviz.eval.world_set import EvalSet  # noqa: E402
from otviz.patch_grid.tokens import TokenGeometry  # noqa: E402
from otviz.suite import ALIGN_METHODS  # noqa: E402


def measure(seeds: list[int], n_test: int, heads: str, cache: str) -> dict:
    backbone = BackboneSpec().load()
    suite = build_suite(backbone, heads or str(assets.path("heads")), ALIGN_METHODS)
    hits: dict[str, dict[str, list[np.ndarray]]] = {}
    groups: list[np.ndarray] = []
    tower = None
    for seed in seeds:
        data = EvalSet.build(backbone, n_test, "test", seed, cache)
        q = phrase_queries(data)
        tower = data.geometry
        naive = TokenGeometry.cell_centred(tower.grid, tower.size)
        groups.append(q.image.numpy() + seed * 10**6)
        for name, entry in suite.methods.items():
            if not entry.method.has_plan:
                continue
            heat = phrase_heatmaps(entry, data, q.image, data.positives[q.image], q.select)
            row = hits.setdefault(name, {"tower": [], "cell": []})
            row["tower"].append(pointing_hits(heat, tower, q.boxes).double().numpy())
            row["cell"].append(pointing_hits(heat, naive, q.boxes).double().numpy())
    group = np.concatenate(groups)
    rows = []
    for name, row in hits.items():
        new, old = np.concatenate(row["tower"]), np.concatenate(row["cell"])
        rows.append({
            "method": name, "n": len(new),
            "cell_centred": 100 * old.mean(),
            "cell_centred_ci": [100 * v for v in group_bootstrap(old, group)],
            "tower_geometry": 100 * new.mean(),
            "tower_geometry_ci": [100 * v for v in group_bootstrap(new, group)],
            "difference": 100 * (new - old).mean(),
            "difference_ci": [100 * v for v in group_bootstrap(new - old, group)],
        })
    assert tower is not None
    return {"seeds": seeds, "n_test": n_test, "heads": heads or "shipped",
            "geometry": {"stride": tower.stride, "origin": tower.origin, "grid": tower.grid},
            "rows": rows}


def markdown(result: dict) -> str:
    g = result["geometry"]
    lines = [f"**Pointing, the same heatmaps read two ways** (heads: {result['heads']}; world "
             f"test seeds {', '.join(map(str, result['seeds']))}, {result['n_test']} images "
             f"each; 95 % bootstrap intervals over images)", "",
             f"Tower geometry: stride {g['stride']}, token (0, 0) at {g['origin']} px.", "",
             "| method | phrases | cell-centred (old) | tower geometry | difference |",
             "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        ci = {k: "[{:.1f}, {:.1f}]".format(*r[k + "_ci"])
              for k in ("cell_centred", "tower_geometry", "difference")}
        lines.append(f"| {r['method']} | {r['n']} | {r['cell_centred']:.1f} {ci['cell_centred']}"
                     f" | {r['tower_geometry']:.1f} {ci['tower_geometry']}"
                     f" | {r['difference']:+.1f} {ci['difference']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="4242,4243")
    parser.add_argument("--n-test", type=int, default=500)
    parser.add_argument("--heads", default="")
    parser.add_argument("--cache-dir", default=".cache/otviz-features")
    parser.add_argument("--out", default="benchmarks/geometry_pointing")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    result = measure([int(s) for s in args.seeds.split(",")], args.n_test, args.heads,
                     args.cache_dir)
    result["seconds"] = round(time.perf_counter() - start, 1)
    save(Path(args.out), result, markdown(result))


if __name__ == "__main__":
    main()
