"""Peak memory of Browse's trust sort: ``browse_trust_values`` of one map and one metric over
the first ``--images`` images of a world split, on the embedded tiny CLIP with its shipped
heads, in a fresh process; the peak resident memory (``ru_maxrss``) before the call (backbone,
suite, table loaded) and after it, and the call's wall time.

Usage: ``python benchmarks/trust_sort_memory.py --images 100 [--map chefer]
[--metric max_sensitivity] [--label before]``; run it with ``PYTHONPATH`` at the tree to
measure (``/work/main`` for *before*). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=100, help="world images in the table")
    parser.add_argument("--map", default="chefer", help="method, explainer or baseline")
    parser.add_argument("--metric", default="max_sensitivity", help="trust metric key")
    parser.add_argument("--split", default="test", help="world split")
    parser.add_argument("--label", default="", help="what is measured (before / after)")
    args = parser.parse_args()

    import torch

    import otviz
    from otviz import assets
    from otviz.backbone_spec import BackboneSpec
    from otviz.eval.browse import world_browse
    from otviz.eval.trust.browse import browse_trust_values
    from otviz.suite import MethodSuite

    torch.manual_seed(0)
    backbone = BackboneSpec().load()
    suite = MethodSuite.from_heads(backbone, assets.path("heads"))
    with tempfile.TemporaryDirectory() as cache:
        table = world_browse(suite, args.images, args.split, cache_dir=cache)
        loaded = _peak_mb()
        start = time.perf_counter()
        values = browse_trust_values(suite, table, args.map, args.metric)
        seconds = time.perf_counter() - start
    print(json.dumps({
        "label": args.label, "otviz": os.path.dirname(otviz.__file__), "images": args.images,
        "rows": len(table.items), "map": args.map, "metric": args.metric,
        "peak_rss_mb_loaded": round(loaded), "peak_rss_mb_after": round(_peak_mb()),
        "growth_mb": round(_peak_mb() - loaded), "seconds": round(seconds, 1),
        "finite": int(torch.isfinite(values).sum()), "mean": float(values.nanmean()),
        "threads": torch.get_num_threads(), "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
