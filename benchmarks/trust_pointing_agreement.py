"""Does the trust table's pointing equal the grounding table's? Per row (method, explainer,
baseline), per head set and world test seed: the grounding table's pointing
(:func:`otviz.eval.alignment_tables.grounding_table`), the trust table's under the tie rule
(:func:`otviz.eval.trust.metrics.trust_scores`, the localisation columns only: a row's
pointing does not depend on the other metrics) and, on the same maps, Quantus 0.6.0's pointing
game as the trust table computed it before the tie rule (a tie for the peak a hit when any tied
pixel is in the gold mask; a batch flat as a whole refused).

Usage::

    python benchmarks/trust_pointing_agreement.py --seeds 27183,16181 --n-test 20 \\
        --heads training-free,shipped --explainers all [--out benchmarks/trust_pointing_agreement]

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
from otviz.eval import alignment_tables as A
from otviz.eval.runner import build_suite, load_backbone
from otviz.eval.trust.adapter import heatmap_sources, trust_inputs, world_phrases
from otviz.eval.trust.localisation import empty_masks
from otviz.eval.trust.metrics import TrustSettings, require_quantus, trust_scores
from otviz.eval.world_set import EvalSet, world_config_of
from otviz.explainers import explainer_names
from otviz.suite import ALIGN_METHODS
from otviz.world import World


def quantus_pointing(maps: np.ndarray, masks: np.ndarray) -> float:
    """The trust table's pointing before the tie rule: Quantus' pointing game on the batch,
    NaN for a batch flat as a whole (refused), mean over the rows."""
    if np.ptp(maps) == 0:
        return float("nan")
    quantus = require_quantus()
    hits = quantus.PointingGame(disable_warnings=True, display_progressbar=False)(
        model=None, x_batch=np.zeros_like(maps), y_batch=np.zeros(len(maps), dtype=int),
        a_batch=maps, s_batch=masks, channel_first=True)
    return float(np.mean(np.asarray(hits, dtype=np.float64)))


def one_run(heads: str, seed: int, n_test: int, explainers: list[str], cache: str) -> dict:
    """Every row's pointing in both tables (and Quantus') on one head set and seed."""
    backbone = load_backbone()
    suite = build_suite(backbone, heads, ALIGN_METHODS)
    start = time.perf_counter()
    grounding = A.grounding_table(suite, EvalSet.build(backbone, n_test, "test", seed, cache),
                                  explainers=explainers)
    world = World(world_config_of(backbone, negatives=False), "test", seed)
    samples = [world.sample(i) for i in range(n_test)]
    inputs = trust_inputs(backbone, [s.image for s in samples],
                          [world_phrases(s) for s in samples])
    ground = {r["name"]: r.get("pointing") for r in grounding.rows}
    rows = []
    for source in heatmap_sources(suite.methods, explainers):
        scores = trust_scores(inputs.scorer, source, inputs.pixels, inputs.targets,
                              inputs.masks, TrustSettings(seed=seed), metrics=["pointing"])
        rows.append({"name": source.name, "label": source.label, "kind": source.kind,
                     "grounding": ground.get(source.name),
                     "trust": float(np.nanmean(scores.values["pointing"])),
                     "quantus": quantus_pointing(scores.maps, inputs.masks)})
    return {"heads": heads, "seed": seed, "n_test": n_test, "phrases": len(inputs.targets),
            "grounding_phrases": int(grounding.rows[0].get("n", 0)),
            "empty_regions": int(empty_masks(inputs.masks).sum()),
            "wall_s": time.perf_counter() - start, "rows": rows}


def markdown(runs: list[dict], command: str) -> str:
    out = ["# Trust pointing vs grounding pointing", "", f"`{command}`", ""]
    for run in runs:
        gaps = [abs(r["trust"] - r["grounding"]) for r in run["rows"]
                if r["grounding"] is not None]
        out += [f"## heads {run['heads']}, world test seed {run['seed']} ({run['n_test']} "
                f"images, {run['phrases']} phrases; {run['empty_regions']} gold regions with "
                f"no token; {run['wall_s']:.0f} s)", "",
                f"largest |trust - grounding|: {100 * max(gaps):.2f} points", "",
                "| row | kind | grounding | trust (tie rule) | Quantus (before) |",
                "| --- | --- | ---: | ---: | ---: |"]
        for r in run["rows"]:
            cells = [r["grounding"], r["trust"], r["quantus"]]
            text = ["-" if v is None or not np.isfinite(v) else f"{100 * v:.1f}" for v in cells]
            out.append(f"| {r['label']} | {r['kind']} | " + " | ".join(text) + " |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="27183")
    p.add_argument("--n-test", type=int, default=20)
    p.add_argument("--heads", default="training-free,shipped",
                   help="comma list: training-free, shipped, or head directories")
    p.add_argument("--explainers", default="all")
    p.add_argument("--cache-dir", default=".cache/otviz-features")
    p.add_argument("--out", default="benchmarks/trust_pointing_agreement")
    args = p.parse_args()
    torch.set_num_threads(1)
    explainers = explainer_names(args.explainers)
    runs = []
    for heads in args.heads.split(","):
        where = str(assets.path("heads")) if heads == "shipped" else heads
        for seed in (int(s) for s in args.seeds.split(",")):
            run = one_run(where, seed, args.n_test, explainers, args.cache_dir)
            runs.append({**run, "heads": heads})
            print(markdown([runs[-1]], ""), flush=True)
    command = ("python benchmarks/trust_pointing_agreement.py --seeds " + args.seeds
               + f" --n-test {args.n_test} --heads {args.heads} --explainers {args.explainers}")
    Path(args.out + ".json").write_text(json.dumps(runs, indent=1), encoding="utf-8")
    Path(args.out + ".md").write_text(markdown(runs, command), encoding="utf-8")


if __name__ == "__main__":
    main()
