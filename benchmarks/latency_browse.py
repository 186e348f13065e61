"""Latency of the Browse view on the embedded backbone with the shipped trained heads: the
first load of a world split (encode through the feature cache, every method on every
phrase) and then page turns of 12 rows (kept results: filter, sort, draw), timed as the
callback alone and end to end through ``gradio_client`` on a loopback server (Gradio's
pre/postprocessing, the queue, the JPEG raster and the table).

Usage: ``python benchmarks/latency_browse.py [--images 96] [--methods 4] [--out FILE]``;
prints the JSON it writes (default ``benchmarks/latency_browse.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import numpy as np

from otviz.eval.browse import ALL_ROWS, IOU_UP, BrowseCache
from otviz.suite import ALIGN_METHODS
from otviz.ui.app import CONCURRENCY, QUEUE_SIZE, build_app
from otviz.ui.browse_tab import (
    DEFAULT_A,
    DEFAULT_B,
    WORLD_SOURCE,
    BrowseSources,
    browse_view,
    load_table,
)
from otviz.ui.context import AppContext

BAR_MS = 1000.0  # a page of 12 images


def _stats(samples_s: list[float]) -> dict[str, float]:
    ms = 1000 * np.asarray(samples_s)
    return {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95)),
            "n": len(samples_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=96)
    parser.add_argument("--methods", type=int, default=4, help="methods drawn per row")
    parser.add_argument("--out", default="benchmarks/latency_browse.json")
    args = parser.parse_args()
    from gradio_client import Client

    ctx = AppContext.default()
    checkpoint = ctx.checkpoint_choices()[-1]
    root = Path(tempfile.mkdtemp(prefix="otviz-bench-browse-"))
    methods = list(ALIGN_METHODS[: args.methods]) if args.methods < 8 else list(ALIGN_METHODS)
    methods = sorted(set(methods) | {DEFAULT_A, DEFAULT_B}, key=ALIGN_METHODS.index)

    # callback alone: a fresh in-memory cache, features already on disk after a warm-up
    sources = BrowseSources(BrowseCache(), root / "features", root / "uploads")
    load_table(ctx, sources, checkpoint, WORLD_SOURCE, args.images, "test")
    sources.cache = BrowseCache()
    t0 = time.perf_counter()
    table = load_table(ctx, sources, checkpoint, WORLD_SOURCE, args.images, "test")
    first_s = time.perf_counter() - t0
    pages = []
    for page in range(1, 9):
        t0 = time.perf_counter()
        table = load_table(ctx, sources, checkpoint, WORLD_SOURCE, args.images, "test")
        browse_view(table, methods, DEFAULT_A, DEFAULT_B, ALL_ROWS, [], IOU_UP, page, 12)
        pages.append(time.perf_counter() - t0)

    # end to end through gradio_client on loopback
    app = build_app(ctx, browse=BrowseSources(BrowseCache(), root / "features", root / "up"))
    app.queue(default_concurrency_limit=CONCURRENCY, max_size=QUEUE_SIZE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
               ssr_mode=False)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
        form = [checkpoint, "last", 0, WORLD_SOURCE, args.images, "test", None, methods,
                DEFAULT_A, DEFAULT_B, ALL_ROWS, [], IOU_UP]
        t0 = time.perf_counter()
        client.predict(*form, 1, 12, api_name="/browse")
        client_first_s = time.perf_counter() - t0
        client_pages = []
        for page in list(range(1, 9)) * 2:
            t0 = time.perf_counter()
            client.predict(*form, page, 12, api_name="/browse_page")
            client_pages.append(time.perf_counter() - t0)
    finally:
        app.close()
    result = {
        "images": args.images, "phrases": len(table), "methods_drawn": methods,
        "rows_per_page": 12, "bar_ms": BAR_MS,
        "callback": {"first_load_ms": 1000 * first_s, "page": _stats(pages)},
        "gradio_client": {"first_load_ms": 1000 * client_first_s, "page": _stats(client_pages)},
        "load_average": os.getloadavg(), "cpus": os.cpu_count(),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
