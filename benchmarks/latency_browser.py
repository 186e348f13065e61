"""End-to-end latency of the Align view as a person feels it: headless Chromium (Playwright)
on the served app, timed in the page from the user's press to the last output drawn (every
status tracker of the view hidden again, every image loaded, two animation frames for the
paint), for an Align click, a phrase change, a method change and an Align click with the
explainers' panels on (otviz.ui.explainer_panels); one user, then 4 users at
once (one page each, all acting together). Embedded backbone with its shipped trained
heads, the first example's features cached by a warm-up click.

The clock starts at the press, the ``pointerdown`` event the page receives (for a dropdown:
on the option, the list already open), as a person's latency starts when they press.
Playwright takes 150-300 ms on this machine between being asked to click and pressing
(actionability checks: visible, stable over two frames, hit target), which a person does
not wait for; an earlier version started the clock before that and counted it.

Usage: ``python benchmarks/latency_browser.py [--repeats 8] [--users 4] [--out FILE]``;
writes JSON (default ``benchmarks/latency_browser.json``) and Markdown beside it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from playwright.async_api import Page, async_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import (  # noqa: E402
    EVENTS,
    latency_main,
    percentiles,
)

#: The browser the tests use (tests/test_browser.py): $OTVIZ_CHROMIUM, else Debian's headless
#: shell (``make test`` installs it), else its full Chromium.
CHROMIUM = os.environ.get("OTVIZ_CHROMIUM") or next(
    (c for c in ("/usr/bin/chromium-headless-shell", "/usr/bin/chromium") if Path(c).exists()),
    "/usr/bin/chromium")
VIEWPORT = {"width": 1400, "height": 900}
TIMEOUT_MS = 120_000
METHODS = ("Dense UOT", "Balanced OT", "ConceptOT")

#: Arms a clock and a MutationObserver on the Align tab; ``window.__drawn`` resolves with the
#: ms from the press (the next ``pointerdown``) to the last output drawn: a status tracker
#: came and went, or (a change the page makes alone, as a phrase pick swapping in a
#: prefetched grid) what the view shows changed; then every image loaded, two frames.
ARM = """() => {
  const tab = document.querySelector('#tab-align');
  const busy = () => Array.from(tab.querySelectorAll('[data-testid="status-tracker"]'))
      .some(e => !e.classList.contains('hide'));
  const imagesLoaded = () => Array.from(tab.querySelectorAll('img')).every(i => i.complete);
  const shown = () => Array.from(tab.querySelectorAll('img, .js-plotly-plot'),
                                 e => e.src || e.outerHTML.length).join();
  const before = shown();
  let t0 = null;
  document.addEventListener('pointerdown', e => { t0 = e.timeStamp; },
                            {capture: true, once: true});
  window.__drawn = new Promise(resolve => {
    let seen = false;
    const check = () => {
      if (busy()) { seen = true; return; }
      if (t0 === null || !(seen || shown() !== before) || !imagesLoaded()) return;
      observer.disconnect();
      clearInterval(poll);
      requestAnimationFrame(() => requestAnimationFrame(() => resolve(performance.now() - t0)));
    };
    const observer = new MutationObserver(check);
    observer.observe(tab, {subtree: true, attributes: true, childList: true});
    const poll = setInterval(check, 5);  // image loads change no attribute
  });
}"""


async def _timed(page: Page, action) -> float:
    await page.evaluate(ARM)
    await action()
    return await page.evaluate("window.__drawn") / 1000.0


async def _pick(page: Page, dropdown: str, option: str | None = None, index: int = 0) -> float:
    """Open ``dropdown`` (untimed), then time picking ``option`` (or the ``index``-th)."""
    await page.locator(f"#{dropdown} input").click()
    target = (page.get_by_role("option", name=option, exact=True).first if option
              else page.get_by_role("option").nth(index))
    await target.wait_for()
    return await _timed(page, target.click)


async def _open(browser, url: str) -> Page:
    page = await browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(TIMEOUT_MS)
    await page.goto(url)
    await page.locator('[data-testid="dataset-cell-0-0"]').click()
    await page.wait_for_selector("#shared-image img")
    await page.get_by_role("tab", name="Align", exact=True).click()
    await _timed(page, _align_button(page))  # warm-up: features and plans cached
    return page


def _align_button(page: Page):
    return lambda: page.get_by_role("button", name="Align", exact=True).click()


async def _user(page: Page, repeats: int, samples: dict[str, list[float]],
                start: asyncio.Event) -> None:
    await start.wait()
    for k in range(repeats):
        samples["align_click"].append(await _timed(page, _align_button(page)))
        samples["phrase_change"].append(await _pick(page, "align-phrase", index=k % 4))
        samples["method_change"].append(await _pick(page, "align-method", METHODS[k % 3]))
    # the Align click with the explainers' panels on (the toggle re-runs the click once)
    await _timed(page, lambda: page.locator("#align-explainers input").check())
    for _ in range(repeats):
        samples["align_click_explainers"].append(await _timed(page, _align_button(page)))
    await _timed(page, lambda: page.locator("#align-explainers input").uncheck())


async def measure(url: str, users: int, repeats: int) -> dict[str, dict]:
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        pages = [await _open(browser, url) for _ in range(users)]
        samples: dict[str, list[float]] = {e: [] for e in EVENTS}
        start = asyncio.Event()
        tasks = [asyncio.create_task(_user(page, repeats, samples, start)) for page in pages]
        start.set()
        await asyncio.gather(*tasks)
        await browser.close()
    return {e: percentiles(s) for e, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    return latency_main(
        argv, __doc__, lambda url, _checkpoint, users, repeats: asyncio.run(
            measure(url, users, repeats)),
        8, Path(__file__).resolve().parent / "latency_browser.json",
        "Align latency in a browser",
        "Headless Chromium (Playwright), 1400-px viewport, timed in the page from the press "
        "(pointerdown) to the last output drawn (status trackers hidden or, for a change the "
        "page makes alone, what the view shows changed; images loaded, two animation "
        "frames); embedded backbone, trained heads, features cached; the app in a process of "
        "its own.",
        extra={"viewport": VIEWPORT})


if __name__ == "__main__":
    sys.exit(main())
