"""Load test of the served app: concurrent users clicking Align on loopback.

The app is built and served as ``otviz.ui.app.launch`` serves it (same queue, concurrency
and upload limit) on 127.0.0.1; ``--clients`` threads, each with its own gradio_client
``Client``, send ``--clicks`` Align requests each (all eight methods, the example images in
turn, one pixel changed per click so that every click encodes and solves afresh). The run
is repeated while a training run (FILIP on the world, capped steps) holds the server's
training slot. Latency is measured per request at the client: upload, queue, callback and
the answer.

Usage: ``python benchmarks/load_align.py [--clients 4] [--clicks 6] [--out FILE]``; prints
the JSON it writes (default ``benchmarks/load_align.json``) and writes the same as a
Markdown table next to it (``.md``), with the machine's load average while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from gradio_client import Client, handle_file
from PIL import Image

from otviz.ui.app import build_app, serve_options
from otviz.ui.context import AppContext
from otviz.ui.examples import load_examples
from otviz.ui.train_jobs import TrainingJobs, TrainRequest


def _uploads(folder: Path, n: int) -> list[tuple[str, str]]:
    """``n`` distinct (image file, caption): the examples in turn, one pixel changed."""
    examples = load_examples()
    out = []
    for k in range(n):
        e = examples[k % len(examples)]
        pixels = np.array(Image.open(e.image_path).convert("RGB"))
        pixels[0, 0] = [(k * 37) % 256, k % 256, (k * 11) % 256]
        path = folder / f"upload_{k:03d}.png"
        Image.fromarray(pixels).save(path)
        out.append((str(path), e.caption))
    return out


def _client_run(url: str, checkpoint: str, uploads: list[tuple[str, str]],
                latencies: list[float], errors: list[str]) -> None:
    client = Client(url, verbose=False, download_files=False)
    for path, caption in uploads:
        start = time.perf_counter()
        try:
            client.predict(image=handle_file(path), caption=caption, checkpoint=checkpoint,
                           method="conceptot", regions="grid", shared_scale=True,
                           lambda_local=0.5, came_temperature=1.0, api_name="/align")
            latencies.append(time.perf_counter() - start)
        except Exception as e:  # counted, not fatal: the load test reports errors
            errors.append(f"{type(e).__name__}: {e}")


def load_round(url: str, checkpoint: str, uploads: list[tuple[str, str]], clients: int
               ) -> dict:
    """All clients at once, each on its share of ``uploads``; p50/p95 in seconds."""
    latencies: list[float] = []
    errors: list[str] = []
    share = len(uploads) // clients
    threads = [threading.Thread(target=_client_run, args=(
        url, checkpoint, uploads[c * share:(c + 1) * share], latencies, errors))
        for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {
        "requests": len(latencies) + len(errors),
        "errors": len(errors),
        "first_errors": errors[:3],
        "p50_s": float(np.percentile(latencies, 50)) if latencies else None,
        "p95_s": float(np.percentile(latencies, 95)) if latencies else None,
        "wall_s": wall,
    }


def markdown(result: dict) -> str:
    lines = [
        f"Load test: {result['clients']} concurrent gradio_client users, Align clicks on "
        f"loopback ({result['clicks_per_client']} each, fresh uploads), load average "
        f"{result['loadavg']}; {result['platform']}.",
        "",
        "| scenario | requests | errors | p50 (s) | p95 (s) | wall (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in result["scenarios"].items():
        p50 = f"{r['p50_s']:.2f}" if r["p50_s"] is not None else "-"
        p95 = f"{r['p95_s']:.2f}" if r["p95_s"] is not None else "-"
        lines.append(f"| {name} | {r['requests']} | {r['errors']} | {p50} | {p95} | "
                     f"{r['wall_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--clicks", type=int, default=6, help="Align clicks per client")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/load_align.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ctx = AppContext.default()
        jobs = TrainingJobs(ctx, root / "runs", root / "features", evaluate=False)
        app = build_app(ctx, jobs)
        app.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True,
                   ssr_mode=False, **serve_options(app))
        url, checkpoint = app.local_url, ctx.checkpoint_choices()[0]
        n = args.clients * args.clicks
        uploads = _uploads(root, 3 * n)
        try:
            load_round(url, checkpoint, uploads[:args.clients], args.clients)  # warm-up
            scenarios = {"idle server": load_round(url, checkpoint, uploads[n:2 * n],
                                                   args.clients)}
            job = jobs.start(TrainRequest(methods=["filip"], n_train=512, max_steps=100000,
                                          batch_size=32, hard_negatives=2), checkpoint)
            while job.status().step < 1 and not job.finished.is_set():
                time.sleep(0.1)
            scenarios["training run in progress"] = load_round(
                url, checkpoint, uploads[2 * n:], args.clients)
            jobs.stop(job.id)
            job.finished.wait(120)
        finally:
            app.close()
    result = {
        "clients": args.clients,
        "clicks_per_client": args.clicks,
        "scenarios": scenarios,
        "loadavg": "/".join(f"{x:.1f}" for x in os.getloadavg()),
        "platform": f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
                    f"{platform.platform()}",
    }
    text = json.dumps(result, indent=2)
    print(text)
    args.out.write_text(text + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
