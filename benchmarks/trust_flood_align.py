"""The first plain Align click while a flood of Trust requests arrives (issue 50.8: 15.7 s,
14x the idle click, before), old tree against new in one run.

Each measurement runs in a fresh process with ``PYTHONPATH`` at the tree timed: it serves
the app as ``otviz.ui.app.launch`` queues it (``serve_options``) on 127.0.0.1 with the
server's compute budget as on a Space (one expensive slot), aligns the first example once
(model and suites loaded, the pair encoded, as after a person's first click), then times

* *idle*: Align clicks (all methods, explainers off) on images no click saw, median of 3;
* *flood*: ``--trust`` Trust-panel requests, each from its own session (raw API calls sent
  by a process of their own, as from other machines: the clicking person's client shares no
  interpreter with them), on the aligned pair (``same pair``) or each on an image of its own
  (``own images``), and 0.3 s after they are sent one Align click on an image no click saw.

The clients (the clicks' and the flood's processes) run in sessions of their own, so that
Linux's autogroup scheduling does not count their CPU in the server's share of a busy
machine (on a Space they are other machines); ``flood_cpu_s`` is the flood process's CPU.

The ratio is the flood's click over the same run's idle median, and over the tree's pooled
idle median (all its runs); the table gives each run's and, per tree, the median with the range
over its rounds and both floods.

Usage: ``python benchmarks/trust_flood_align.py --tree old=PATH --tree new=PATH [--rounds 2]
[--trust 34]``: the trees alternate within each round; writes
``benchmarks/trust_flood_align.json`` and the Markdown table next to it, with the load
average, after every measurement (``--render`` rewrites the table from the JSON).
``--one`` (internal) is one measurement on the tree on ``PYTHONPATH``, ``--drive``
(internal) its client side, ``--flood`` (internal) the Trust requests' process.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "trust_flood_align.json"
FLOODS = ("same pair", "own images")


def _png(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, "PNG")
    return buffer.getvalue()


def measure(n_trust: int) -> dict:
    """One measurement on the otviz importable here (module docstring): the app served in
    this process, the requests sent from another (:func:`drive`), so that the clients'
    threads take none of the server's interpreter."""
    from otviz.ui import budget as budget_module
    from otviz.ui.align import phrase_choices
    from otviz.ui.app import build_app, serve_options
    from otviz.ui.budget import ComputeBudget
    from otviz.ui.context import AppContext
    from otviz.ui.examples import load_examples

    budget_module._SERVER = ComputeBudget(slots=1)  # a Space's budget
    ctx = AppContext.default([])
    app = build_app(ctx)
    app.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True, ssr_mode=False,
               **serve_options(app))
    checkpoint, example = ctx.checkpoint_choices()[0], load_examples()[0]
    encoded = ctx.explainer(checkpoint).encode(str(example.image_path), example.caption)
    phrase = phrase_choices(encoded)[0][1]
    try:
        done = subprocess.run([sys.executable, __file__, "--drive", app.local_url, checkpoint,
                               phrase, "--trust", str(n_trust)],
                              capture_output=True, text=True, start_new_session=True)
    finally:
        app.close()
    if done.returncode:
        raise RuntimeError(f"the client side failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def drive(url: str, checkpoint: str, phrase: str, n_trust: int) -> dict:
    """The client side of :func:`measure`: an Align click on the first example (the pair
    encoded, as after a person's first click), the idle clicks, then each flood."""
    import httpx
    from gradio_client import Client, handle_file
    from PIL import Image

    from otviz.ui.examples import load_examples

    example = load_examples()[0]
    base = np.asarray(Image.open(example.image_path).convert("RGB")).copy()
    tmp = Path(tempfile.mkdtemp())
    counter = iter(range(1, 10_000))

    def fresh_image() -> str:
        """A PNG no click saw: the example with one pixel changed."""
        k = next(counter)
        rgb = base.copy()
        rgb[k // base.shape[1] % base.shape[0], k % base.shape[1]] ^= 1
        path = tmp / f"v{k}.png"
        path.write_bytes(_png(rgb))
        return str(path)

    # the default 5 s read timeout cut an old tree's upload under the flood on a loaded machine
    client = Client(url, verbose=False, download_files=False, httpx_kwargs={"timeout": 300})

    def align(path: str) -> float:
        start = time.perf_counter()
        client.predict(image=handle_file(path), caption=example.caption,
                       checkpoint=checkpoint, explainers=False, api_name="/align")
        return time.perf_counter() - start

    def uploaded(path: str) -> dict:
        with open(path, "rb") as f:
            response = httpx.post(f"{url}gradio_api/upload", timeout=60,
                                  files={"files": (Path(path).name, f, "image/png")})
        return {"path": response.json()[0], "meta": {"_type": "gradio.FileData"}}

    first = str(example.image_path)
    align(first)
    trust_data = _by_name(client, "/align_trust", caption=example.caption,
                          checkpoint=checkpoint, phrase=phrase, explainers=False)
    out: dict = {"idle_s": [align(fresh_image()) for _ in range(3)]}
    for flood in FLOODS:
        images = [uploaded(first if flood == "same pair" else fresh_image())
                  for _ in range(n_trust)]
        target = fresh_image()
        sender = subprocess.Popen([sys.executable, __file__, "--flood", url],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        sender.stdin.write(json.dumps([trust_data(image) for image in images]) + "\n")
        sender.stdin.flush()
        sender.stdout.readline()  # its requests are being sent
        time.sleep(0.3)
        seconds = align(target)
        answers = json.loads(sender.communicate()[0].strip().splitlines()[-1])
        out[flood] = {"align_s": seconds, **answers}
    return out


def flood(url: str, requests: list[list]) -> dict:
    """The Trust requests of one flood (each ``data`` list its own raw API call, from a
    thread of this process), a line on stdout once they are all being sent; how many were
    served and refused."""
    answers: list[str] = []
    threads = [threading.Thread(target=_trust, args=(url, data, answers)) for data in requests]
    for t in threads:
        t.start()
    print("sent", flush=True)
    for t in threads:
        t.join()
    return {"served": sum("event: complete" in a for a in answers),
            "refused": sum("event: error" in a for a in answers),
            "flood_cpu_s": round(time.process_time(), 2)}


def _by_name(client, endpoint: str, **values) -> Callable[[dict], list]:
    """The raw API's ``data`` list of ``endpoint`` for an uploaded image, from the values
    named (each other parameter at its default): the trees' endpoints differ in their
    parameters (the reading, ``features`` and ``image_size``, became parameters of their
    own)."""
    params = client.view_api(print_info=False, return_format="dict")["named_endpoints"][
        endpoint]["parameters"]
    return lambda image: [image if p["parameter_name"] == "image" else values.get(
        p["parameter_name"], p.get("parameter_default")) for p in params]


def _trust(url: str, data: list, answers: list[str]) -> None:
    """One Trust-panel request as a raw API call (a session of its own); its event stream
    appended to ``answers``."""
    import httpx

    post = httpx.post(f"{url}gradio_api/call/align_trust", timeout=60, json={"data": data})
    answers.append(httpx.get(f"{url}gradio_api/call/align_trust/{post.json()['event_id']}",
                             timeout=600).text)


def run_tree(path: str, n_trust: int) -> dict:
    """:func:`measure` in a fresh process importing otviz from ``path``."""
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, __file__, "--one", "--trust", str(n_trust)],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the measurement on {path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def markdown(result: dict) -> str:
    lines = [
        "# The first Align click under a flood of Trust requests",
        "",
        f"Written by `benchmarks/trust_flood_align.py` ({result['rounds']} rounds, the trees "
        f"alternating; {result['trust']} Trust requests, each from its own session, sent "
        "by a process apart from the clicking client's, each client in a session of its own "
        "(autogroup), the server's budget as on a Space: one expensive slot). Load average "
        f"{result['load_before']} before, {result['load_after']} after. Seconds of the "
        "Align click (idle: median of 3 clicks on fresh images); the ratio is to the idle "
        "median of the same run.",
        "",
        "| tree | round | idle (s) | same pair (s) | ratio | own images (s) | ratio | "
        "Trust served / refused |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for tree, runs in result["trees"].items():
        for k, r in enumerate(runs):
            idle = statistics.median(r["idle_s"])
            cells = [f"{r[f]['align_s']:.2f} | {r[f]['align_s'] / idle:.1f}x" for f in FLOODS]
            served = ", ".join(f"{r[f]['served']} / {r[f]['refused']}" for f in FLOODS)
            lines.append(f"| {tree} ({result['commits'][tree]}) | {k + 1} | {idle:.2f} | "
                         f"{' | '.join(cells)} | {served} |")
    lines += ["", "Per tree, median [min, max] over its rounds and both floods; its pooled "
              "idle click is the median of all its runs' idle clicks (a steadier denominator "
              "under load than a run's own 3).", "",
              "| tree | pooled idle (s) | flood click (s) | ratio to the run's idle | "
              "ratio to the pooled idle |", "|---|---:|---|---|---|"]
    for tree, runs in result["trees"].items():
        if runs:
            pooled = statistics.median(s for r in runs for s in r["idle_s"])
            clicks = [r[f]["align_s"] for r in runs for f in FLOODS]
            own = [r[f]["align_s"] / statistics.median(r["idle_s"]) for r in runs for f in FLOODS]
            lines.append(f"| {tree} | {pooled:.2f} | {_spread(clicks, '')} | "
                         f"{_spread(own, 'x')} | {_spread([c / pooled for c in clicks], 'x')} |")
    return "\n".join(lines) + "\n"


def _spread(values: list[float], unit: str) -> str:
    return (f"{statistics.median(values):.1f}{unit} [{min(values):.1f}, "
            f"{max(values):.1f}]")


def _commit(path: str) -> str:
    done = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trust", type=int, default=34)
    parser.add_argument("--one", action="store_true")
    parser.add_argument("--drive", nargs=3, metavar=("URL", "CHECKPOINT", "PHRASE"))
    parser.add_argument("--flood", metavar="URL")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite the Markdown table from the JSON written")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.trust)))
        return 0
    if args.drive:
        print(json.dumps(drive(*args.drive, args.trust)))
        return 0
    if args.render:
        OUT.with_suffix(".md").write_text(markdown(json.loads(OUT.read_text())))
        return 0
    if args.flood:
        print(json.dumps(flood(args.flood, json.loads(sys.stdin.readline()))))
        return 0
    trees = dict(t.split("=", 1) for t in args.tree)
    load = lambda: "/".join(f"{x:.1f}" for x in os.getloadavg())  # noqa: E731
    result = {"rounds": args.rounds, "trust": args.trust, "load_before": load(),
              "commits": {name: _commit(path) for name, path in trees.items()},
              "trees": {name: [] for name in trees}}
    for _ in range(args.rounds):
        for name, path in trees.items():
            result["trees"][name].append(run_tree(path, args.trust))
            result["load_after"] = load()  # written after every measurement
            OUT.write_text(json.dumps(result, indent=1) + "\n")
            OUT.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
