"""End-to-end latency of the Align view through Gradio's own client (upload, queue,
callback, answer, on loopback): an Align click, a phrase change and a method change, on the
embedded backbone with its shipped trained heads and the example's features cached (one
warm-up click first), by one user and by 4 concurrent users (one ``Client`` each).

Usage: ``python benchmarks/latency_client.py [--repeats 10] [--users 4] [--out FILE]``;
writes JSON (default ``benchmarks/latency_client.json``) and Markdown beside it.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from gradio_client import Client, handle_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import (  # noqa: E402
    EVENTS,
    latency_main,
    percentiles,
)

from otviz.ui.align import DEFAULT_SHARED_SCALE  # noqa: E402
from otviz.ui.examples import load_examples  # noqa: E402

PHRASES = ("span:0:4", "span:1:2", "span:2:4")
METHODS = ("conceptot", "dense_uot", "balanced_ot")


def _user(url: str, checkpoint: str, repeats: int, samples: dict[str, list[float]]) -> None:
    example = load_examples()[0]
    client = Client(url, verbose=False, download_files=False)
    image = handle_file(str(example.image_path))
    pair = {"image": image, "caption": example.caption, "checkpoint": checkpoint,
            "regions": "grid", "came_temperature": 1.0}
    align = {**pair, "method": "conceptot", "shared_scale": DEFAULT_SHARED_SCALE,
             "lambda_local": 0.5}
    client.predict(**align, api_name="/align")  # warm-up: features and plans cached
    for k in range(repeats):
        calls = {
            "align_click": (align, "/align"),
            "phrase_change": ({**pair, "shared_scale": DEFAULT_SHARED_SCALE,
                               "phrase": PHRASES[k % 3]}, "/align_phrase"),
            "method_change": ({**pair, "method": METHODS[k % 3], "token": 0}, "/align_plan"),
        }
        for event, (named, api) in calls.items():
            start = time.perf_counter()
            client.predict(**named, api_name=api)
            samples[event].append(time.perf_counter() - start)


def measure(url: str, checkpoint: str, users: int, repeats: int) -> dict[str, dict]:
    samples: dict[str, list[float]] = {e: [] for e in EVENTS}
    threads = [threading.Thread(target=_user, args=(url, checkpoint, repeats, samples))
               for _ in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {e: percentiles(s) for e, s in samples.items() if s}  # (browser-only events)


def main(argv: list[str] | None = None) -> int:
    return latency_main(
        argv, __doc__, measure, 10, Path(__file__).resolve().parent / "latency_client.json",
        "Align latency through gradio_client",
        "Client-side time per request on loopback (upload, queue, callback, answer); "
        "embedded backbone, trained heads, features cached; the app in a process of its own.")


if __name__ == "__main__":
    sys.exit(main())
