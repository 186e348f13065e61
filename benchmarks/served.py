"""What the end-to-end latency benchmarks share: the app served as ``otviz.ui.app.launch``
serves it (same queue and limits) on 127.0.0.1 in a process of its own, the three Align
events they time, percentiles, the machine's load and the JSON + Markdown report.

The server has its own process as ``python app.py`` has: served from the benchmark's own
process, the clients' Python threads and the server's shared one interpreter lock, which
added 20-50 ms to every request on this 2-core machine."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from otviz.ui.app import build_app, serve_options
from otviz.ui.context import AppContext
from otviz.ui.phrase_grids import DRAWER

#: Seconds the server process gets to load the model and start listening.
START_TIMEOUT_S = 600

#: p50 bars of the issue (ms), embedded model and cached features, and the 4-user p95 bar.
BARS_MS = {"align_click": 250.0, "phrase_change": 100.0, "method_change": None,
           "align_click_explainers": 600.0}
CONCURRENT_P95_BAR_MS = 1000.0
EVENTS = tuple(BARS_MS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, ready: multiprocessing.Queue, stop: multiprocessing.Event) -> None:
    """The server process: build and serve the app, report its default checkpoint, serve
    until ``stop``."""
    ctx = AppContext.default()
    app = build_app(ctx)
    # as otviz.ui.app.launch does, and waited for: the worker re-imports this process's main
    # module (a benchmark script importing the whole app, ~8 s), which app.py keeps light
    DRAWER.start().submit(int).result()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
               quiet=True, ssr_mode=False, **serve_options(app))
    ready.put(ctx.default_checkpoint())
    stop.wait()
    app.close()


@contextmanager
def served_app() -> Iterator[tuple[str, str]]:
    """The app on a free loopback port in a process of its own: ``(url, the default
    checkpoint's name)``."""
    spawn = multiprocessing.get_context("spawn")
    ready, stop, port = spawn.Queue(), spawn.Event(), free_port()
    # not a daemon: the app starts a worker process of its own (otviz.ui.phrase_grids)
    server = spawn.Process(target=_serve, args=(port, ready, stop))
    server.start()
    try:
        checkpoint = ready.get(timeout=START_TIMEOUT_S)
        yield f"http://127.0.0.1:{port}/", checkpoint
    finally:
        stop.set()
        server.join(timeout=30)
        if server.is_alive():
            server.kill()


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ms = 1000 * np.asarray(samples_s)
    return {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95)),
            "n": len(samples_s), "samples_ms": [round(float(x)) for x in ms]}


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def machine() -> dict:
    return {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": f"torch {torch.__version__}, {platform.platform()}"}


def write_report(result: dict, out: Path, title: str, how: str) -> None:
    """``result["latency_ms"][users][event]`` percentiles as JSON at ``out`` and as a
    Markdown table beside it, with the bars and the load average."""
    out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"# {title}", "", how, "",
             f"Load average (1/5/15 min) {result['load_before']} before, "
             f"{result['load_after']} after, on a shared {result['machine']['cpus']}-CPU "
             f"machine that other jobs keep busy; {result['machine']['platform']}.", "",
             "| users | event | p50 (ms) | p95 (ms) | n | bar | meets bar |",
             "| ---: | --- | ---: | ---: | ---: | --- | --- |"]
    for users, events in result["latency_ms"].items():
        for event, row in events.items():
            if int(users) == 1 and BARS_MS[event] is not None:
                bar, ok = f"p50 <= {BARS_MS[event]:.0f}", row["p50"] <= BARS_MS[event]
            elif int(users) > 1:
                bar, ok = f"p95 <= {CONCURRENT_P95_BAR_MS:.0f}", row["p95"] <= CONCURRENT_P95_BAR_MS
            else:
                bar, ok = "", None
            lines.append(f"| {users} | {event.replace('_', ' ')} | {row['p50']:.0f} | "
                         f"{row['p95']:.0f} | {row['n']} | {bar} | "
                         f"{'' if ok is None else ('yes' if ok else 'no')} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


#: ``measure(url, checkpoint, users, repeats)``: percentiles per event for that many users.
Measure = Callable[[str, str, int, int], dict]


def latency_main(
    argv: list[str] | None, doc: str, measure: Measure, repeats: int, out: Path, title: str,
    how: str, extra: dict | None = None,
) -> int:
    """The command line both latency benchmarks share: ``--repeats``, ``--users`` (one user,
    then that many at once), ``--out``; the app served once, the report written and shown."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--out", type=Path, default=out)
    args = parser.parse_args(argv)
    load_before = load_average()
    started = time.time()
    with served_app() as (url, checkpoint):
        latency = {str(n): measure(url, checkpoint, n, args.repeats) for n in (1, args.users)}
    result = {"checkpoint": checkpoint, "repeats_per_user": args.repeats, **(extra or {}),
              "load_before": load_before, "load_after": load_average(),
              "wall_s": round(time.time() - started, 1), "machine": machine(),
              "latency_ms": latency}
    write_report(result, args.out, title, how)
    print(args.out.with_suffix(".md").read_text())
    return 0
