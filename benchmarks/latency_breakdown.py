"""Where the time of a phrase change and a method change goes, as a person feels it: the
browser's timeline of one change (headless Chromium, Playwright), from the press
(``pointerdown``) to the request leaving the page, the answer arriving, the output in the
page and its images loaded; and the server's own share, a phrase read sent as raw HTTP
through Gradio's queue as the page sends it (the image already uploaded, nothing but the
request and its answer). The app is served in
a process of its own; embedded backbone, trained heads, features cached by an Align click.

Usage: ``python benchmarks/latency_breakdown.py [--repeats 8] [--out FILE]``; writes JSON
(default ``benchmarks/latency_breakdown.json``) and Markdown beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from gradio_client import Client, handle_file
from playwright.async_api import async_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency_browser import CHROMIUM, _open  # noqa: E402
from served import load_average, machine, served_app  # noqa: E402

from otviz.ui.examples import load_examples  # noqa: E402

#: Records, relative to the press: when the output changed in the page and when every image
#: of the Align tab had loaded again.
ARM = """() => {
  const tab = document.querySelector('#tab-align');
  const marks = {};
  window.__marks = marks;
  document.addEventListener('pointerdown', e => { marks.press = e.timeStamp; },
                            {capture: true, once: true});
  const observer = new MutationObserver(muts => {
    if (marks.press === undefined || marks.output !== undefined) return;
    if (muts.some(m => (m.type === 'attributes' && m.target.tagName === 'IMG') ||
                       (m.type === 'childList' && Array.from(m.addedNodes).some(
                          n => n.classList && n.classList.contains('js-plotly-plot')))))
      marks.output = performance.now();
  });
  observer.observe(tab, {subtree: true, attributes: true, attributeFilter: ['src'],
                         childList: true});
  const poll = setInterval(() => {
    if (marks.output === undefined) return;
    if (Array.from(tab.querySelectorAll('img')).every(i => i.complete)) {
      marks.loaded = performance.now(); clearInterval(poll); observer.disconnect();
    }
  }, 2);
}"""

#: The request of the change among the page's resource timings (ms after the press).
REQUEST = """() => {
  const m = window.__marks;
  const r = performance.getEntriesByType('resource').filter(
      e => e.startTime >= m.press && /run\\/predict|queue\\/join/.test(e.name))[0];
  return {sent: r.startTime - m.press, answered: r.responseEnd - m.press,
          output: m.output - m.press, loaded: m.loaded - m.press};
}"""

DROPDOWNS = {"phrase_change": "align-phrase", "method_change": "align-method"}
STAGES = ("sent", "answered", "output", "loaded")


async def browser_timeline(url: str, repeats: int) -> dict[str, dict[str, float]]:
    """Median ms after the press of each stage, per event."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = await _open(browser, url)
        out = {}
        for event, dropdown in DROPDOWNS.items():
            rows = []
            for k in range(repeats):
                await page.locator(f"#{dropdown} input").click()
                option = page.get_by_role("option").nth(1 + k % 3)
                await option.wait_for()
                await page.evaluate(ARM)
                await option.click()
                await page.wait_for_function("window.__marks.loaded !== undefined")
                rows.append(await page.evaluate(REQUEST))
            out[event] = {s: statistics.median(r[s] for r in rows) for s in STAGES}
        await browser.close()
    return out


def queued_call(http: httpx.Client, url: str, body: dict) -> None:
    """One request through Gradio's queue as the page sends it: join, then read the event
    stream until the answer."""
    http.post(url + "gradio_api/queue/join", json=body).raise_for_status()
    with http.stream("GET", url + "gradio_api/queue/data",
                     params={"session_hash": body["session_hash"]}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    if not message.get("success"):
                        raise RuntimeError(f"the phrase read failed: {message.get('output')}")
                    return
    raise RuntimeError("the event stream ended without an answer")


def server_round_trip(url: str, checkpoint: str, repeats: int) -> float:
    """Median ms of a phrase change the page cannot swap in, sent as the page sends it (one
    request through the queue, the image already uploaded; after the first four, the
    server's grid cache holds the phrases)."""
    example = load_examples()[0]
    Client(url, verbose=False, download_files=False).predict(
        image=handle_file(str(example.image_path)), caption=example.caption,
        checkpoint=checkpoint, method="conceptot", regions="grid", shared_scale=False,
        came_temperature=1.0, api_name="/align")
    with httpx.Client(timeout=120) as http:
        with open(example.image_path, "rb") as f:
            path = http.post(url + "gradio_api/upload", files={"files": f}).json()[0]
        fn = next(d["id"] for d in http.get(url + "config").json()["dependencies"]
                  if d.get("api_name") == "align_phrase")
        image = {"path": path, "meta": {"_type": "gradio.FileData"}}
        times = []
        for k in range(repeats + 1):
            body = {"data": [image, example.caption, checkpoint, "last", 0, "grid", False,
                             f"span:{k % 4}:{k % 4 + 1}", 1.0, False, None], "fn_index": fn,
                    "session_hash": f"breakdown-{k}", "trigger_id": None, "event_data": None}
            start = time.perf_counter()
            queued_call(http, url, body)
            times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times[1:])  # the first warms the endpoint up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "latency_breakdown.json")
    args = parser.parse_args(argv)
    before = load_average()
    with served_app() as (url, checkpoint):
        server_ms = server_round_trip(url, checkpoint, 4 * args.repeats)
        timeline = asyncio.run(browser_timeline(url, args.repeats))
    result = {"server_round_trip_ms": {"phrase_change": server_ms}, "browser_ms": timeline,
              "repeats": args.repeats, "load_before": before, "load_after": load_average(),
              "machine": machine()}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    lines = ["# Where a change's time goes", "", __doc__.split("\n\n")[0].replace("\n", " "),
             "", f"Raw HTTP phrase change through the queue (server's share): {server_ms:.0f} ms "
             "(median).", "",
             "| event | request sent | request's HTTP answer | output in page | images loaded |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for event, row in timeline.items():
        lines.append(f"| {event.replace('_', ' ')} | "
                     + " | ".join(f"{row[s]:.0f}" for s in STAGES) + " |")
    lines += ["", "Milliseconds after the press, medians of "
              f"{args.repeats} changes; load average {before} before, "
              f"{result['load_after']} after. The changes go through Gradio's queue: the "
              "request's HTTP answer is the queue's acknowledgement, the result arrives on "
              "the page's event stream (output in page). A phrase pick the page swaps in from "
              "the prefetched grids shows its output before its (no-op) request is sent."]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
