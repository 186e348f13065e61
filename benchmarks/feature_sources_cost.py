"""What each feature source and a larger input cost on a real-size model: the encode of one
image and caption (what an Align click computes before the methods run) on a random-weight
open_clip ViT-B/16 (the compute of the real one), per source at 224 px and at 448 px, in
one process, CPU.

    python benchmarks/feature_sources_cost.py --threads 1 --repeats 3 \
        --out benchmarks/feature_sources_cost

Writes ``OUT.json`` and ``OUT.md``: median wall time over ``--repeats`` (after one warm-up),
and the process's peak resident memory after each configuration (``ru_maxrss``, monotone:
a row's growth over the previous one is what that configuration added).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from otviz.backbone import Backbone

CONFIGS = [(s, None) for s in ("last", "layer:6", "maskclip", "sclip", "clearclip", "naclip")]
CONFIGS += [("last", 448), ("naclip", 448)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/feature_sources_cost")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    backbone = Backbone.from_pretrained("ViT-B-16", None)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 400, 3), np.uint8))
    rows = []
    for source, size in CONFIGS:
        view = backbone.with_features(source, size)
        view.encode([image], ["a red cube left of a blue ball"])  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            view.encode([image], ["a red cube left of a blue ball"])
            times.append(1000 * (time.perf_counter() - start))
        rows.append({"features": source, "image_size": view.image_size, "grid": list(view.grid),
                     "ms": round(statistics.median(times), 1),
                     "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                          / 1024, 1)})
        print(rows[-1], flush=True)
    base = rows[0]["ms"]
    lines = [f"**Encode of one image and caption, random ViT-B/16, CPU, {args.threads} "
             f"thread(s), median of {args.repeats}**", "",
             "| features | input | grid | ms | x last@224 | peak RSS (MB) |",
             "|---|---:|---|---:|---:|---:|"]
    lines += [f"| {r['features']} | {r['image_size']} | {r['grid'][0]} x {r['grid'][1]} | "
              f"{r['ms']} | {r['ms'] / base:.2f} | {r['peak_rss_mb']} |" for r in rows]
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"threads": args.threads, "repeats":
                                                     args.repeats, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
