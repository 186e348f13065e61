"""Streamed training from webdataset shards against the feature cache, in one run: pairs/s
and peak memory, on this machine's CPU.

World training samples are written as shards once (``otviz.world.export.export_shards``,
1000 pairs a shard); each measured run is its own process (:func:`otviz.train.loop.train_method`,
ConceptOT), whose peak resident memory is sampled every 100 ms over the process and its
DataLoader workers together (proportional set size, psutil: shared pages count once), and
whose own peak resident memory (``VmHWM``) is read at its end.

* cached vs streamed on the same pairs: the world's first ``--cached-pairs`` train samples
  through the feature cache (built in the run: its encoding time is reported apart) and the
  same pairs as shards, streamed; the tiny CLIP (shipped checkpoint) and a random-weight
  open_clip ViT-B/16 (a few batches only: 2 CPU cores);
* streamed runs of the same steps on each of ``--sizes`` pairs (10k and 100k): the memory
  bound (what grows with the data is the shard index and the captions).

Shards are written to ``--shards`` (a temporary folder by default) unless it already holds
enough of them (an export by ``otviz world --as webdataset --split train``). Each row carries
the load average before and after it (the machine is shared). Writes ``<out>.json`` and
``<out>.md`` after every row::

    python benchmarks/streamed_training.py --out benchmarks/streamed_training \
        --shards /tmp/shards-100k --cached-pairs 20000 --sizes 10000,100000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PER_SHARD = 1000


def _memory(proc) -> tuple[int, int, int]:
    """The proportional set size of ``proc`` and its children together (a page a forked
    DataLoader worker shares with its parent counts once, not twice as in a sum of RSS), and
    the children's (the workers') summed resident and unique set sizes."""
    tree = rss = uss = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except Exception:  # a worker that ended between the listing and the read
            continue
        tree += info.pss
        if p.pid != proc.pid:
            rss, uss = rss + info.rss, uss + info.uss
    return tree, rss, uss


def child(spec: dict) -> dict:
    """One measured run (in its own process)."""
    import psutil
    import torch

    from otviz.train.config import TrainConfig
    from otviz.train.loop import ENCODING, INDEXING, train_method

    torch.set_num_threads(spec["threads"])
    proc, peak, done = psutil.Process(), [0, 0, 0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[:] = map(max, peak, _memory(proc))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    phases: dict[str, list[float]] = {}
    t0 = time.perf_counter()

    def progress(step: int, total: int, metrics: dict) -> None:
        key = ENCODING if ENCODING in metrics else INDEXING if INDEXING in metrics else "steps"
        phases.setdefault(key, [time.perf_counter() - t0, 0.0])[1] = time.perf_counter() - t0

    result = train_method(TrainConfig(**spec["config"]), progress)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    steps = result.history[1:] or result.history  # the first starts the workers, warms up
    hwm = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("VmHWM"))
    return {
        "name": spec["name"],
        "status": result.status,
        "steps": result.steps,
        "pairs_per_s_steps": sum(h["pairs"] for h in steps) / sum(h["seconds"] for h in steps),
        "encode_s": phases.get(ENCODING, [0, 0])[1],
        "index_s": phases.get(INDEXING, [0, 0])[1],
        "wall_s": wall,
        "peak_pss_tree_mb": peak[0] / 2**20,
        "peak_rss_workers_mb": peak[1] / 2**20,
        "peak_uss_workers_mb": peak[2] / 2**20,
        "peak_rss_main_mb": hwm / 1024,
        "data_summary": result.data_summary,
    }


def run_child(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)],
                         capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": str(spec["threads"])})
    if out.returncode:
        raise RuntimeError(f"{spec['name']} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/streamed_training")
    p.add_argument("--cached-pairs", type=int, default=20000)
    p.add_argument("--sizes", default="10000,100000",
                   help="comma-separated pair counts of the streamed memory-bound rows")
    p.add_argument("--shards", default="", help="shard folder (reused if it holds enough)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--vit-steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--child", default="")
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    from otviz.world.export import export_shards

    sizes = [int(n) for n in args.sizes.split(",")]
    exported = max([args.cached_pairs, *sizes])
    work = Path(tempfile.mkdtemp(prefix="streamed-bench-"))
    folder = Path(args.shards) if args.shards else work / "shards"
    export_s = None  # None: the shards were there already
    if len(list(folder.glob("*.tar"))) < exported // PER_SHARD:
        t0 = time.perf_counter()
        export_shards(folder, exported, "train", seed=0, per_shard=PER_SHARD)
        export_s = time.perf_counter() - t0

    def shards(n: int) -> str:
        return str(folder / f"{{000000..{n // PER_SHARD - 1:06d}}}.tar")

    base = dict(method="conceptot", batch_size=args.batch_size, max_steps=args.steps,
                threads=args.threads, workers=args.workers, device="cpu", log_every=0,
                checkpoint_every=0, world_seed=0)
    vit = dict(base, open_clip_model="ViT-B-16", batch_size=8, max_steps=args.vit_steps)
    specs = [
        ("tiny CLIP, cached", dict(base, data="world", n_train=args.cached_pairs)),
        ("tiny CLIP, streamed", dict(base, data=shards(args.cached_pairs))),
        *((f"tiny CLIP, streamed {n // 1000}k", dict(base, data=shards(n))) for n in sizes),
        ("ViT-B/16 (random), cached", dict(vit, data="world",
                                           n_train=8 * args.vit_steps)),
        ("ViT-B/16 (random), streamed", dict(vit, data=shards(PER_SHARD))),
    ]
    meta = {"export_s": export_s, "exported_pairs": exported, "per_shard": PER_SHARD,
            "batch_size": args.batch_size, "steps": args.steps, "vit_steps": args.vit_steps,
            "threads": args.threads, "workers": args.workers, "cpu_count": os.cpu_count(),
            "torch_threads_note": "2-core machine shared with other jobs"}
    rows = []
    for k, (name, config) in enumerate(specs):
        config = dict(config, out=str(work / f"run{k}"), cache_dir=str(work / f"cache{k}"))
        load_before = os.getloadavg()[0]
        row = run_child({"name": name, "threads": args.threads, "config": config})
        row["load_1min"] = [load_before, os.getloadavg()[0]]
        row["pairs"] = config["n_train"] if config["data"] == "world" else int(
            row["data_summary"].split(", ")[1].split(" ")[0])
        cache = work / f"cache{k}"
        row["cache_mb"] = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20
        row["cache_written"] = cache.exists()
        rows.append(row)
        print(json.dumps(row), flush=True)
        Path(f"{args.out}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        Path(f"{args.out}.md").write_text(markdown(meta, rows))


def markdown(meta: dict, rows: list[dict]) -> str:
    export = ("by `otviz world --as webdataset` before the run" if meta["export_s"] is None
              else f"in {meta['export_s']:.0f} s")
    lines = [
        "# Streamed vs cached training (CPU)", "",
        f"World train samples written as {meta['exported_pairs']} pairs of webdataset shards "
        f"({meta['per_shard']} a shard) {export}. ConceptOT head, batch "
        f"{meta['batch_size']} (ViT-B/16: 8), {meta['threads']} torch thread(s), "
        f"{meta['workers']} DataLoader worker(s), {meta['cpu_count']} CPU cores shared with "
        "other jobs. pairs/s: training steps after the first (streamed: decode + backbone "
        "encode + head step; cached: head step on cached features). Cache build s / index s: "
        "from the start to the end of building the cache / indexing the shards (the "
        "backbone's loading included). Peak PSS: the training process and its workers "
        "together (proportional set size, sampled every 100 ms); main RSS: the process's own "
        "VmHWM (mapped cache pages included), the steadier figure: PSS divides a shared "
        "library's pages among every process mapping it, other jobs' too. workers RSS / USS: "
        "the DataLoader workers' peak resident set (pages shared with the main process "
        "included) and unique set (pages only they hold: what a worker copied). load: the "
        "machine's 1-minute load average before / after the row (2 cores shared with other jobs: "
        "pairs/s move with it).", "",
        "| run | pairs | steps | pairs/s (steps) | cache build s | index s | wall s | "
        "peak PSS MB (all) | peak RSS MB (main) | workers RSS / USS MB | feature cache MB | "
        "load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cache = f"{r['cache_mb']:.1f}" if r["cache_written"] else "none"
        lines.append(
            f"| {r['name']} | {r['pairs']} | {r['steps']} | {r['pairs_per_s_steps']:.1f} | "
            f"{r['encode_s']:.1f} | {r['index_s']:.1f} | {r['wall_s']:.1f} | "
            f"{r['peak_pss_tree_mb']:.0f} | {r['peak_rss_main_mb']:.0f} | "
            f"{r['peak_rss_workers_mb']:.0f} / {r['peak_uss_workers_mb']:.0f} | "
            f"{cache} | {r['load_1min'][0]:.1f} / {r['load_1min'][1]:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
