"""The page at 760 px (issue 50.7): the checkpoint picker's value is readable to its end
with a reading picked (it was cut at "… · features layer", the size hidden; since issue 53.4
the value names the model and head set only, the controls show the reading) and the block
slider's label stays on one line; the examples gallery shows its inline thumbnails. Headless
Chromium, as tests/test_browser.py drives it."""

from __future__ import annotations

import pytest

from tests import test_browser

#: tests/test_browser.py's fixtures: its browser, skipped where there is none
browser, browser_available = test_browser.browser, test_browser.browser_available

NARROW = {"width": 760, "height": 900}

MEASURE = """() => {
  const input = document.querySelector('#shared-checkpoint input');
  const label = document.querySelector('#shared-layer label > span');
  const line = parseFloat(getComputedStyle(label).lineHeight) || 20;
  return {value: input.value, shown: input.clientWidth, needed: input.scrollWidth,
          size: document.querySelector('#shared-image-size input').value,
          labelLines: label.getBoundingClientRect().height / line,
          thumbnails: [...document.querySelectorAll('[data-testid^="dataset-cell"] img')]
                        .map(img => img.naturalWidth)};
}"""


def pick(page, elem_id: str, *keys: str) -> None:
    """Pick an option of a dropdown by keyboard (``keys``, then Enter)."""
    page.locator(f"#{elem_id} input").click()
    for key in (*keys, "Enter"):
        page.keyboard.press(key)


@pytest.mark.slow
def test_at_760_px_the_picker_value_and_the_block_label_are_readable(browser, live_app):
    page = browser.new_page(viewport=NARROW)
    page.set_default_timeout(test_browser.TIMEOUT_MS)
    try:
        page.goto(live_app.url)
        page.wait_for_selector("#shared-checkpoint input")
        entry = page.locator("#shared-checkpoint input").input_value()
        pick(page, "shared-features", "Home", "ArrowDown")  # block K: the entry after "last"
        page.wait_for_selector("#shared-layer label > span", state="visible")
        pick(page, "shared-image-size", "End")
        page.wait_for_function("!document.querySelector('#shared-image-size input').value"
                               ".includes('native')")
        seen = page.evaluate(MEASURE)
    finally:
        page.close()
    assert seen["value"] == entry == live_app.ctx.default_checkpoint(), seen
    assert seen["size"].endswith(" px"), seen
    assert seen["needed"] <= seen["shown"], seen
    assert seen["labelLines"] < 1.5, seen
    assert seen["thumbnails"] and all(w > 0 for w in seen["thumbnails"]), seen
