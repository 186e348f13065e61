"""The app in a real browser: headless Chromium (Debian's ``chromium-headless-shell``, else
its ``chromium``) driven by Playwright opens the served app, picks an example and runs the
views; the figures must render (the heatmap grid as an image of the computed size, the plan
as a plotly heatmap of patches x tokens, trees, curves). A screenshot of each view goes to
``$OTVIZ_SCREENSHOT_DIR`` (``make screenshots`` writes ``docs/screenshots/``), else to a
temp dir.

Without Chromium or Playwright the tests skip and say how to install them; with
``OTVIZ_REQUIRE_BROWSER=1`` (CI) they fail instead.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from otviz.ui.align import align_view, phrase_choices, phrase_view
from otviz.ui.examples import load_examples
from otviz.ui.phrase_grids import SWAP_JS, encode_jpeg
from otviz.ui.reading_controls import best_block, control_state, reading_of

#: Chromium's headless shell (the browser without its window system: a page load took 1.7-1.9 s
#: of CPU against 2.3-3.2 s for the full browser, measured on the 2-core machine), else the
#: full browser in headless mode; ``$OTVIZ_CHROMIUM`` names another.
CHROMIUM_CANDIDATES = ("/usr/bin/chromium-headless-shell", "/usr/bin/chromium")
CHROMIUM = os.environ.get("OTVIZ_CHROMIUM") or next(
    (path for path in CHROMIUM_CANDIDATES if Path(path).is_file()), CHROMIUM_CANDIDATES[0])
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1400, "height": 900}  # the app's width
SCREENSHOT_WIDTH = 900  # px of the committed screenshots
TIMEOUT_MS = 120_000


def _missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is not installed: pip install -e '.[test]'"
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        return (f"Chromium not found at {CHROMIUM}: as root `apt-get install -y "
                "chromium-headless-shell` (`make test` does it), or set OTVIZ_CHROMIUM")
    return None


@pytest.fixture(scope="module", autouse=True)
def browser_available() -> None:
    """Skip without a browser; fail instead where ``OTVIZ_REQUIRE_BROWSER=1`` (CI)."""
    missing = _missing()
    if missing and os.environ.get("OTVIZ_REQUIRE_BROWSER") == "1":
        pytest.fail(f"OTVIZ_REQUIRE_BROWSER=1 but {missing}", pytrace=False)
    if missing:
        pytest.skip(missing)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def example_page(browser, url: str):
    """A new page on the app with the first example picked (image and caption filled)."""
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(url)
    page.locator('[data-testid="dataset-cell-0-0"]').click()
    page.wait_for_function(
        "document.querySelector('#shared-caption textarea').value.length > 0"
    )
    page.wait_for_selector("#shared-image img")
    return page


@pytest.fixture(scope="module")
def page(browser, live_app):
    """One page for the module's tests; a test that changes a view's settings takes
    ``own_page`` instead, so that the others, in any order, read the defaults."""
    page = example_page(browser, live_app.url)
    yield page
    page.close()


@pytest.fixture
def own_page(browser, live_app):
    """A page of the test's own."""
    page = example_page(browser, live_app.url)
    yield page
    page.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    out = os.environ.get("OTVIZ_SCREENSHOT_DIR")
    path = Path(out) if out else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def screenshot(page, tab: str, path: Path) -> None:
    """The view's panel as a PNG: for the docs (``$OTVIZ_SCREENSHOT_DIR``, ``make
    screenshots``) a small one (scaled to :data:`SCREENSHOT_WIDTH`, 128 colours); else as the
    browser captured it, left in the run's temp dir (scaling and quantising it took 0.6 s of
    CPU a view, for a file in a temp dir)."""
    if not os.environ.get("OTVIZ_SCREENSHOT_DIR"):
        page.locator(f"#{tab}").screenshot(path=str(path))
        return
    raw = path.with_suffix(".raw.png")
    page.locator(f"#{tab}").screenshot(path=str(raw))
    image = Image.open(raw).convert("RGB")
    height = round(image.height * SCREENSHOT_WIDTH / image.width)
    small = image.resize((SCREENSHOT_WIDTH, height), Image.Resampling.LANCZOS)
    small.quantize(128, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    raw.unlink()


def open_tab(page, title: str) -> None:
    page.get_by_role("tab", name=title, exact=True).click()


def open_dropdown(page, dropdown: str) -> list[str]:
    """Focuses the dropdown ``#dropdown`` and returns its options' labels, in list order."""
    page.locator(f"#{dropdown} input").click()
    options = page.get_by_role("option")
    options.first.wait_for(state="attached")
    return options.evaluate_all("os => os.map(o => o.getAttribute('aria-label'))")


def press_option(page, dropdown: str, index: int) -> None:
    """Picks the ``index``-th option of the open dropdown by keyboard (Home, Down, Enter).

    Gradio floats the option list at fixed coordinates taken when it opens: when the page's
    layout moves after that, the list can stay outside the viewport, where a click never
    lands (CI failed so); the keys select without reading where the list is."""
    box = page.locator(f"#{dropdown} input")
    box.press("Home")
    for _ in range(index):
        box.press("ArrowDown")
    box.press("Enter")


def pick_option(page, dropdown: str, *, nth: int | None = None, name: str | None = None) -> None:
    """Picks the option of ``#dropdown`` called ``name``, or its ``nth``."""
    labels = open_dropdown(page, dropdown)
    press_option(page, dropdown, labels.index(name) if name is not None else nth)


#: Gradio's answer to an event started while a file is still uploading (the event is not sent).
UPLOAD_PENDING = ("[...document.querySelectorAll('.toast-body')]"
                  ".filter(t => t.innerText.includes('finish uploading')).length")


def click_once_uploaded(page, button, tries: int = 40) -> None:
    """Click ``button`` as a person does after an upload: Gradio does not send an event while
    a file is still uploading ("Waiting for file(s) to finish uploading, please retry.", a
    toast), so click again, a moment later, until the click is not refused."""
    for _ in range(tries):
        refused = page.evaluate(UPLOAD_PENDING)
        button.click()
        page.wait_for_timeout(700)  # the refusal's toast appears at once where there is one
        if page.evaluate(UPLOAD_PENDING) == refused:
            return
    raise AssertionError("the upload never finished: every click was refused")


def plotly_data(page, element: str) -> list[dict]:
    """The traces of the plotly figure in ``#element`` once it has rendered."""
    page.wait_for_function(
        f"(document.querySelector('#{element} .js-plotly-plot') || {{}}).data !== undefined"
    )
    # plotly.js holds decoded arrays (typed arrays per row): plain lists for Python
    return page.evaluate(
        f"Array.from(document.querySelector('#{element} .js-plotly-plot')._fullData, "
        "t => ({type: t.type, x: t.x && Array.from(t.x), y: t.y && Array.from(t.y), "
        "z: t.z && Array.from(t.z, r => Array.from(r))}))"
    )


def rendered_image(page, selector: str) -> tuple[int, int]:
    """Natural ``(width, height)`` of the loaded ``<img>`` under ``selector`` (Gradio may
    keep hidden copies: the first one that has loaded)."""
    loaded = (f"Array.from(document.querySelectorAll('{selector} img'))"
              ".find(i => i.complete && i.naturalWidth > 0)")
    page.wait_for_function(f"!!{loaded}")
    return tuple(page.evaluate(f"(() => {{ const i = {loaded}; "
                               "return [i.naturalWidth, i.naturalHeight]; })()"))


#: For every labelled block of a view: the boxes of its label badge and of what it shows
#: (image, plotly plot, table), as ``[label, badge, content]``.
BADGES_AND_CONTENT = """tab => Array.from(document.querySelectorAll(`#${tab} .block`))
  .map(block => {
    const badge = block.querySelector('[data-testid="block-label"]');
    const content = block.querySelector('img, .js-plotly-plot .main-svg, table');
    if (!badge || !content || badge.offsetParent === null) return null;
    const box = e => { const r = e.getBoundingClientRect();
                       return [r.left, r.top, r.right, r.bottom]; };
    return [badge.textContent.trim(), box(badge), box(content)];
  }).filter(x => x !== null)"""


def assert_badges_cover_nothing(page, tab: str) -> None:
    """No label badge of the view overlaps the figure, image or table under it (where the
    figure's own title is drawn)."""
    blocks = page.evaluate(BADGES_AND_CONTENT, tab)
    assert blocks, f"no labelled figure in #{tab}"
    for label, (bl, bt, br, bb), (cl, ct, cr, cb) in blocks:
        overlap = min(br, cr) > max(bl, cl) and min(bb, cb) > max(bt, ct)
        assert not overlap, f"the {label!r} badge covers its content in #{tab}"


def assert_not_blank(page, selector: str, min_std: float = 12.0) -> None:
    """The element's pixels vary (a heatmap drawn, not an empty or flat panel)."""
    shot = page.locator(selector).screenshot()
    pixels = np.asarray(Image.open(io.BytesIO(shot)).convert("L"), dtype=float)
    assert pixels.std() > min_std, f"{selector} looks blank (pixel std {pixels.std():.1f})"


def assert_all_columns_visible(page, selector: str) -> None:
    """Every header cell of the table lies inside the table's visible block (nothing clipped
    or scrolled out of view horizontally)."""
    page.wait_for_selector(f"{selector} th")
    edges = page.evaluate(f"""() => {{
        const block = document.querySelector('{selector}').getBoundingClientRect();
        return [block.left, block.right, Array.from(
            document.querySelectorAll('{selector} th'), th => {{
                const r = th.getBoundingClientRect();
                return [th.textContent.trim(), r.left, r.right]; }})]; }}""")
    left, right, headers = edges
    assert headers
    hidden = [name for name, lo, hi in headers if lo < left - 1 or hi > right + 1]
    assert not hidden, f"columns cut off in {selector}: {hidden}"


def test_align_shows_the_heatmap_grid_and_the_plan(page, live_app, shots):
    open_tab(page, "Align")
    page.get_by_role("button", name="Align", exact=True).click()
    width, height = rendered_image(page, "#align-grid")
    traces = plotly_data(page, "align-plan")
    plotly_data(page, "align-convergence")
    # the same click computed in-process on the same context (cached features), on the
    # picker's default entry: the shipped trained heads
    example = load_examples()[0]
    checkpoint = live_app.ctx.default_checkpoint()
    assert page.locator("#shared-checkpoint input").input_value() == checkpoint
    view = align_view(live_app.ctx.explainer(checkpoint), live_app.ctx.suite(checkpoint),
                      np.asarray(Image.open(example.image_path).convert("RGB")),
                      example.caption)
    assert (height, width) == view.grid.shape[:2]  # all eight panels, as computed
    heat = traces[0]
    assert heat["type"] == "heatmap"
    np.testing.assert_allclose(np.asarray(heat["z"], dtype=float), view.plan.data.plan,
                               rtol=1e-5, atol=1e-7)
    assert_not_blank(page, "#align-grid img")
    assert_not_blank(page, "#align-token-map img")
    assert_badges_cover_nothing(page, "tab-align")
    assert_all_columns_visible(page, "#align-scores")
    # the tallest convergence bar's value label lies inside the plot area
    labels = page.evaluate("""() => {
        const plot = document.querySelector('#align-convergence .js-plotly-plot');
        const area = plot.querySelector('.nsewdrag').getBoundingClientRect();  // plot area
        return Array.from(plot.querySelectorAll('.bartext'), t => {
            const r = t.getBoundingClientRect(); return [r.top, area.top]; }); }""")
    assert labels and all(top >= area_top - 1 for top, area_top in labels)
    screenshot(page, "tab-align", shots / "align.png")


def test_align_at_a_picked_reading_draws_that_reading(own_page, live_app):
    """The features picker feeds ``/align``'s ``features`` and ``image_size`` (issue 53.4):
    after a pick of another source the checkpoint picker still names the model and head set
    only, the page's Align click is served, and its plan is the in-process view's at that
    reading."""
    page = own_page
    features = "document.querySelector('#shared-features input').value"
    default, shown = (page.locator("#shared-checkpoint input").input_value(),
                      page.evaluate(features))
    pick_option(page, "shared-features", nth=1)  # the first source after "last"
    page.wait_for_function(f"{features} !== {shown!r}")
    # the controls' server answer (it shows the block slider) has landed, so the answer
    # awaited after the Align click below is the click's own, not this pick's
    page.wait_for_selector("#shared-layer", state="visible")
    assert page.locator("#shared-checkpoint input").input_value() == default
    tower = live_app.ctx.explainer(default).backbone.image_tower
    # the reading the controls now show (block K: the slider's start), as the views read it
    value = control_state(live_app.ctx, default,
                          reading_of(tower.sources()[1], best_block(tower.depth), None)).value
    open_tab(page, "Align")
    example = load_examples()[0]
    view = align_view(live_app.ctx.explainer(value), live_app.ctx.suite(value),
                      np.asarray(Image.open(example.image_path).convert("RGB")),
                      example.caption)
    with page.expect_response(is_prefetch_answer):  # after this click's results (not the
        page.get_by_role("button", name="Align", exact=True).click()  # example's) landed
    rendered_image(page, "#align-grid")
    # the plan shown until the click's own lands may be the page load's (a loaded machine
    # answers that one late): wait for the reading's plan, a bounded time, then compare
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while True:
        plan = np.asarray(plotly_data(page, "align-plan")[0]["z"], dtype=float)
        if (plan.shape == view.plan.data.plan.shape
                and np.allclose(plan, view.plan.data.plan, rtol=1e-5, atol=1e-7)
                or time.monotonic() > deadline):
            break
        time.sleep(0.5)
    np.testing.assert_allclose(plan, view.plan.data.plan, rtol=1e-5, atol=1e-7)


#: Changed when an output is redrawn: an image's source, a plotly figure's markup size.
DRAWN = "e => e.src || e.outerHTML.length"


def is_prefetch_answer(response) -> bool:
    """The answer to a request served outside the queue (here: the phrase grids' prefetch)."""
    return response.url.split("?")[0].endswith("/run/predict")


def test_the_explainer_toggle_adds_their_panels_to_the_grid(page, live_app, shots):
    """Ticking "explainers" redraws the Align grid with one more panel per registered
    explainer (the grid grows by rows of panels), drawn, not blank; unticking gives the
    methods' grid back, the same size as before."""
    open_tab(page, "Align")
    with page.expect_response(is_prefetch_answer):  # the click's prefetch, not the toggle's
        page.get_by_role("button", name="Align", exact=True).click()
        width, height = rendered_image(page, "#align-grid")
    src = "document.querySelector('#align-grid img').src"
    before = page.evaluate(src)
    toggle = page.locator("#align-explainers input")
    with page.expect_response(is_prefetch_answer):  # the grids' prefetch that follows a redraw
        toggle.check()
        page.wait_for_function(f"before => {src} !== before", arg=before)
    wide, tall = rendered_image(page, "#align-grid")
    assert wide == width and tall > height, (width, height, wide, tall)
    assert_not_blank(page, "#align-grid img")
    screenshot(page, "tab-align", shots / "align-explainers.png")
    with_explainers = page.evaluate(src)
    with page.expect_response(is_prefetch_answer):  # landed before the next test counts calls
        toggle.uncheck()
        page.wait_for_function(f"before => {src} !== before", arg=with_explainers)
    assert rendered_image(page, "#align-grid") == (width, height)


@pytest.mark.parametrize(("dropdown", "output"), [("align-phrase", "#align-grid img"),
                                                  ("align-method", "#align-plan .js-plotly-plot")])
def test_a_pick_in_a_dropdown_is_one_server_call(own_page, dropdown, output):
    """Gradio's dropdown dispatches ``input`` twice per pick; the views listen to the one
    event that fires once (otviz.ui.events), so a pick sends one request through the queue
    and redraws. (The phrase grids' prefetch an earlier redraw set off is served outside the
    queue and may still be landing: it is not the pick's.)"""
    page = own_page  # the pick changes the view's method or phrase
    open_tab(page, "Align")
    if not page.locator(output).count():
        page.get_by_role("button", name="Align", exact=True).click()
        rendered_image(page, "#align-grid")
    before = page.locator(output).evaluate(DRAWN)
    joins: list[str] = []

    def record(request) -> None:
        if request.url.split("?")[0].endswith("/queue/join"):
            joins.append(request.post_data or "")

    open_dropdown(page, dropdown)
    page.on("request", record)
    press_option(page, dropdown, 2)
    page.wait_for_function(
        f"""before => {{ const e = document.querySelector('{output}');
            return e && ({DRAWN})(e) !== before && !document.querySelector(
                '#tab-align [data-testid="status-tracker"]:not(.hide)'); }}""", arg=before)
    page.wait_for_timeout(500)  # a second dispatch would have gone out by now
    page.remove_listener("request", record)
    assert len(joins) == 1, f"{dropdown}: {len(joins)} server calls for one pick"


def test_a_phrase_pick_swaps_in_the_prefetched_grid(own_page, live_app):
    """After an Align click the page holds the caption's phrase grids: a pick shows the
    server's own grid of that phrase (the same JPEG bytes) without drawing it on the server,
    and a prefetch of another pair (another token) is never swapped in."""
    page = own_page  # the pick changes the view's phrase
    open_tab(page, "Align")
    page.get_by_role("button", name="Align", exact=True).click()
    rendered_image(page, "#align-grid")
    example = load_examples()[0]
    checkpoint = live_app.ctx.default_checkpoint()
    tools = live_app.ctx.explainer(checkpoint), live_app.ctx.suite(checkpoint)
    image = np.asarray(Image.open(example.image_path).convert("RGB"))
    choices = phrase_choices(tools[0].encode(image, example.caption))
    src = "document.querySelector('#align-grid img').src"
    for attempt in range(40):  # until the prefetch (drawn at idle priority) has landed
        pick_option(page, "align-phrase", nth=1 + attempt % 2)
        page.wait_for_timeout(250)
        if page.evaluate(src).startswith("data:image/jpeg"):
            break
    shown = page.evaluate(src)
    assert shown.startswith("data:image/jpeg"), "no pick was swapped in from the prefetch"
    picked = choices[1 + attempt % 2][1]
    grid, _ = phrase_view(*tools, image, example.caption, picked)
    assert base64.b64decode(shown.split(",", 1)[1]) == encode_jpeg(grid)
    # a payload of another pair, or drawn at the other scale setting, is not taken
    for token, scale in (("another-pair", False), (None, True)):
        kept = page.evaluate(f"""token => {{
            const shownToken = document.querySelector('#align-token textarea').value;
            const payload = {{token: token || shownToken, shared_scale: {str(scale).lower()},
                             grids: {{'{picked}': 'data:image/jpeg;base64,AAAA'}}}};
            return ({SWAP_JS})('{picked}', false, payload, shownToken); }}""", token)
        assert kept == "" and page.evaluate(src) == shown


def test_align_bad_input_is_a_message_in_the_page(browser, live_app):
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(live_app.url)
    page.get_by_role("button", name="Align", exact=True).click()
    toast = page.locator(".toast-body").first
    toast.wait_for()
    assert "no image" in toast.inner_text()
    page.close()


#: The page's visible elements whose whole text is a bare "Error", outside the toasts (whose
#: title is "Error" above their message) and the screen readers' announcement (``sr-only``).
BARE_ERRORS = """() => [...document.querySelectorAll('*')].filter(e => e.children.length === 0
    && e.textContent.trim() === 'Error' && e.offsetParent !== null
    && !e.closest('[class*="toast"], .sr-only')).length"""


def test_a_refusal_is_its_message_without_bare_error_marks(browser, live_app, tmp_path):
    """A refused Align and a refused upload each show their readable toast and no bare
    "Error" beside it (Gradio marked all 11 outputs of the refused Align so)."""
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(Path(load_examples()[0].image_path).read_bytes()[:300])
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(live_app.url)
    page.get_by_role("button", name="Align", exact=True).click()
    page.locator(".toast-body").first.wait_for()
    page.wait_for_timeout(500)
    assert page.evaluate(BARE_ERRORS) == 0
    page.locator("#shared-image input[type=file]").set_input_files(str(truncated))
    page.wait_for_function("() => [...document.querySelectorAll('.toast-body')].some(t => "
                           "t.innerText.includes('truncated.png is not an image'))")
    page.wait_for_timeout(1000)  # the outputs' status settled
    assert page.evaluate(BARE_ERRORS) == 0
    page.close()


def test_hostile_upload_and_caption_are_plain_messages(browser, live_app, tmp_path):
    """Through the browser: a truncated PNG and a caption carrying HTML give a readable
    message in which the caption's markup is shown as text, never rendered as elements."""
    example = load_examples()[0]
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(Path(example.image_path).read_bytes()[:300])
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(live_app.url)
    page.locator("#shared-image input[type=file]").set_input_files(str(truncated))
    caption = page.locator("#shared-caption textarea")
    caption.fill('<h1 id="injected">big</h1> a red <img src=x id="injected-img"> circle')
    page.get_by_role("button", name="Align", exact=True).click()
    toast = page.locator(".toast-body").first
    toast.wait_for()
    text = toast.inner_text()
    assert text.strip() and text.strip().lower() != "error"
    assert page.locator("#injected, #injected-img").count() == 0
    page.close()


def downloads_arrive(page, box: str, name: str) -> None:
    """The view's downloads, written after its pictures, reach its Downloads box ``box``."""
    page.wait_for_function("([box, name]) => document.querySelector(box) && document"
                           ".querySelector(box).innerText.replace(/\\s+/g, '').includes(name)",
                           arg=[box, name])  # the page shows a file's stem and suffix apart


def test_anchors_view(page, shots):
    open_tab(page, "Anchors")
    page.get_by_role("button", name="Show anchors").click()
    width, height = rendered_image(page, "#anchors-matrix")  # matplotlib, as a PNG
    assert width > 200 and height > 200
    rendered_image(page, "#anchors-maps")
    assert_not_blank(page, "#anchors-maps img")
    downloads_arrive(page, "#anchors-bank-downloads", "anchor_word_map_PCA.html")
    downloads_arrive(page, "#anchors-maps-downloads", "anchor_maps.png")
    assert_badges_cover_nothing(page, "tab-anchors")
    screenshot(page, "tab-anchors", shots / "anchors.png")


def test_phrases_and_regions_view(page, shots):
    open_tab(page, "Phrases & regions")
    page.get_by_role("button", name="Show phrases & regions").click()
    rendered_image(page, "#phrases-tree")
    rendered_image(page, "#phrases-regions")
    page.wait_for_function(  # the per-node table lists the caption's noun phrases
        "Array.from(document.querySelectorAll('#phrases-nodes td'))"
        ".some(td => td.textContent.trim() === 'NP')"
    )
    # the tree spans the page: each caption word gets at least ~40 px
    tree_width, _ = rendered_image(page, "#phrases-tree")
    shown = page.locator("#phrases-tree img").first.bounding_box()
    words = len(load_examples()[0].caption.split())
    assert shown["width"] >= 40 * words or shown["width"] >= tree_width
    downloads_arrive(page, "#phrases-downloads", "powerset_scores.json")
    assert_badges_cover_nothing(page, "tab-phrases")
    assert_all_columns_visible(page, "#phrases-nodes")
    screenshot(page, "tab-phrases", shots / "phrases.png")


def test_train_view_trains_a_few_steps(page, live_app, shots):
    open_tab(page, "Train small model")
    panel = page.locator("#tab-train")
    for label, value in (("n_train", "64"), ("batch_size", "32"), ("hard_negatives", "2"),
                         ("max_steps", "3")):  # the form's boxes: TrainConfig's fields
        panel.get_by_label(label, exact=True).fill(value)
    panel.get_by_role("button", name="Start training").click()
    page.wait_for_selector('#train-progress [data-state="finished"]', timeout=240_000)
    traces = plotly_data(page, "train-curves")
    assert [t["x"] for t in traces] == [[1, 2, 3], [1, 2, 3]]  # loss and local term
    # a short run still draws its points (markers), not an empty plot
    assert page.locator("#train-curves .point").count() >= 6
    metrics = plotly_data(page, "train-metrics")
    assert [t["type"] for t in metrics] == ["bar", "bar"]  # training-free vs trained
    entry = live_app.jobs.current().status().picker_entry
    assert entry and entry in live_app.ctx.checkpoint_choices()
    page.locator("#shared-checkpoint input").click()
    page.get_by_role("option", name=entry).wait_for()
    page.keyboard.press("Escape")
    assert_all_columns_visible(page, "#tab-train")
    screenshot(page, "tab-train", shots / "train.png")


@pytest.mark.parametrize(
    ("title", "button", "element", "download"),
    [
        ("Probe", "Score the caption and its edits", "#probe-bars", "probe_scores.json"),
        ("Zero-shot", "Classify", "#zeroshot-accuracy", "zero_shot.json"),
        ("Words", "Show word heatmaps", "#words-grid", None),
    ],
)
def test_other_views_render(page, shots, title, button, element, download):
    open_tab(page, title)
    page.get_by_role("button", name=button, exact=True).click()
    rendered_image(page, element)
    if download:
        downloads_arrive(page, f"#{element[1:].split('-')[0]}-downloads", download)
    tab = "tab-" + title.split()[0].lower()
    assert_badges_cover_nothing(page, tab)
    if page.locator(f"#{tab} th").count():
        assert_all_columns_visible(page, f"#{tab}")
    screenshot(page, tab, shots / f"{tab.removeprefix('tab-')}.png")


def test_browse_pages_and_a_row_click_opens_align(own_page, shots):
    """Browse: the world's first page draws heatmaps and a table with every column; a click
    on a row switches to Align with that row's phrase picked and its heatmaps drawn."""
    page = own_page  # the row click puts another image and caption in the inputs
    open_tab(page, "Browse")
    page.get_by_role("button", name="Load", exact=True).click()
    rendered_image(page, "#browse-grid")
    page.wait_for_function("document.querySelector('#browse-status').innerText.length > 0")
    assert_not_blank(page, "#browse-grid img")
    assert_all_columns_visible(page, "#browse-table")
    assert_badges_cover_nothing(page, "tab-browse")
    screenshot(page, "tab-browse", shots / "browse.png")
    cell = page.locator('#browse-table [data-testid="cell-0-2"]')  # first row's phrase
    phrase = cell.inner_text()
    sources = "Array.from(document.querySelectorAll('#align-grid img'), i => i.src).join()"
    before = page.evaluate(sources)
    cell.click()
    page.wait_for_function(
        "document.querySelector('#tab-align') && "
        "document.querySelector('#tab-align').offsetParent !== null")
    page.wait_for_function(
        "q => document.querySelector('#align-phrase input').value.includes(q)",
        arg=phrase.strip())
    page.wait_for_function(f"b => ({sources}) !== b", arg=before)  # drawn anew for the row
    rendered_image(page, "#align-grid")
    assert_not_blank(page, "#align-grid img")


def test_align_trust_panel_and_browse_sort_by_a_trust_metric(own_page, live_app, shots):
    """The Trust panel (closed, computed on demand) fills its table with one row per method
    and the two model-free references, localisation included for an example's gold phrase, the
    slow metrics' columns marked;
    Browse then sorts its rows by a trust metric of Method A, best first, as a column."""
    page = own_page  # the first example's gold phrase, whatever others picked; sorts Browse
    from otviz.suite import ALIGN_METHODS

    open_tab(page, "Align")
    page.get_by_role("button", name="Align", exact=True).click()
    rendered_image(page, "#align-grid")
    page.locator("#align-trust").get_by_text("Trust:", exact=False).first.click()
    page.locator("#align-trust-run").click()
    page.wait_for_function("document.querySelector('#align-trust-status')"
                           ".innerText.includes('scored against')", timeout=600_000)
    rows = ("document.querySelectorAll('#align-trust-table [data-testid^=\"cell-\"]"
            "[data-testid$=\"-0\"]').length")
    assert page.evaluate(rows) == len(ALIGN_METHODS) + 2
    headers = page.evaluate("Array.from(document.querySelectorAll('#align-trust-table th'),"
                            " th => th.textContent.trim())")
    assert any(h.startswith("Pointing") for h in headers)  # an example's gold phrase
    assert any(h.startswith("MPRT") and "(slow)" in h for h in headers)  # filled last
    status = page.locator("#align-trust-status").inner_text()
    assert "No localisation" not in status and "slow metrics" in status
    screenshot(page, "tab-align", shots / "align-trust.png")

    open_tab(page, "Browse")
    page.get_by_role("button", name="Load", exact=True).click()
    rendered_image(page, "#browse-grid")
    pick_option(page, "browse-trust-metric", name="Relevance mass ↑")
    page.wait_for_function("Array.from(document.querySelectorAll('#browse-table th'))"
                           ".some(th => th.textContent.includes('Relevance mass'))",
                           timeout=300_000)
    values = page.evaluate("""() => {
        const ths = Array.from(document.querySelectorAll('#browse-table th'));
        const k = ths.findIndex(th => th.textContent.includes('Relevance mass'));
        return Array.from(document.querySelectorAll(
            `#browse-table [data-testid^="cell-"][data-testid$="-${k}"]`),
            td => parseFloat(td.innerText)); }""")
    finite = [v for v in values if v == v]
    assert finite and finite == sorted(finite, reverse=True)


# ----------------------------------------------------------------------- errors in the page
def _toast(page) -> str:
    """The text of the first error toast, once one is visible."""
    toast = page.locator(".toast-body").first
    toast.wait_for(state="visible", timeout=30_000)
    return toast.inner_text()


def _type_phrase(page, text: str) -> None:
    box = page.locator("#align-phrase input")
    box.click()
    box.fill(text)
    page.keyboard.press("Enter")
    page.locator("#shared-caption textarea").click()  # the blur that ends the edit


def _phrase_not_in_caption(page) -> None:
    open_tab(page, "Align")
    page.get_by_role("button", name="Align", exact=True).click()
    rendered_image(page, "#align-grid")
    _type_phrase(page, "zebra")


def _method_before_align(page) -> None:
    """A method picked for a caption no Align click has computed (another test may have
    aligned the example's own)."""
    page.locator("#shared-caption textarea").fill(f"a blue star never aligned {os.getpid()}")
    open_tab(page, "Align")
    pick_option(page, "align-method", nth=2)


#: Align's reads of an Align click's results, which were served outside the queue, where
#: Gradio's page shows nothing for an error (issue 19): how the page makes each fail, and
#: what its message says. Every event still served outside the queue must never fail in the
#: page (the phrase grids' prefetch skips on any error; the server draws each pick instead).
FAILING_READS = {
    "AlignCallbacks.on_phrase": (_phrase_not_in_caption, "is not in the caption"),
    "AlignCallbacks.on_plan": (_method_before_align, "click Align"),
}
NEVER_FAILS_IN_THE_PAGE = {"AlignCallbacks.on_prefetch",
                           "Examples.create.<locals>.load_example"}


def outside_the_queue(blocks) -> set[str]:
    """The callbacks of the app's events served outside the queue."""
    import inspect

    return {inspect.unwrap(blocks.fns[d["id"]].fn).__qualname__
            for d in blocks.config["dependencies"]
            if d["queue"] is False and blocks.fns[d["id"]].fn is not None}


def test_every_event_outside_the_queue_never_fails_in_the_page(live_app):
    assert outside_the_queue(live_app.blocks) <= NEVER_FAILS_IN_THE_PAGE


@pytest.mark.parametrize("callback", list(FAILING_READS))
def test_errors_of_the_align_reads_reach_the_page(browser, live_app, callback):
    """A failing input of a read of an Align click (a phrase typed that is not in the
    caption, a method picked before any Align click) shows its message in the page."""
    act, expected = FAILING_READS[callback]
    page = example_page(browser, live_app.url)
    act(page)
    assert expected in _toast(page)
    page.close()


def test_a_bad_upload_after_an_example_is_a_message(browser, live_app, tmp_path):
    """Picking an example rebuilds the image input (Gradio copies the component): a
    truncated PNG uploaded after it is the same readable message as on a fresh page."""
    example = load_examples()[0]
    truncated = tmp_path / "cut.png"
    truncated.write_bytes(Path(example.image_path).read_bytes()[:300])
    page = example_page(browser, live_app.url)
    clear = page.locator("#shared-image button[aria-label='Clear'], "
                         "#shared-image button[title='Clear']")
    if clear.count():
        clear.first.click()
    page.locator("#shared-image input[type=file]").first.set_input_files(str(truncated))
    assert "cut.png is not an image this app can read" in _toast(page)
    page.close()


class LogRecords(logging.Handler):
    """The records of the server's loggers (uvicorn's own do not reach the root)."""

    LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.asgi", "gradio")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> LogRecords:
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *_: object) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)


def test_a_refused_upload_clears_its_preview_and_logs_no_traceback(browser, live_app,
                                                                   tmp_path):
    """A file that is no image, uploaded through the browser: its message, no preview left
    in the input (no broken picture), and nothing in the server log at warning level or
    above (the page's fetch of the preview once met the file half removed: an ASGI
    FileNotFoundError traceback)."""
    notes = tmp_path / "notes.png"
    notes.write_bytes(b"these are notes, not an image " * 40)
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(live_app.url)
    with LogRecords() as log:
        page.locator("#shared-image input[type=file]").set_input_files(str(notes))
        assert "notes.png is not an image this app can read" in _toast(page)
        page.wait_for_function("() => !document.querySelector('#shared-image img')")
        page.wait_for_timeout(1500)  # any late fetch of the preview answered
    assert [r.getMessage() for r in log.records if r.exc_info or r.levelno >= logging.ERROR
            ] == []
    page.close()


def test_browse_a_flickr30k_entities_upload_shows_gold_hit_marks(own_page, tmp_path):
    """Browse: a world draw uploaded as a Flickr30k Entities .zip is read as a grounding
    set; the table's method columns carry hit marks (✓/✗ and the IoU), not the dash of a
    folder without boxes."""
    import zipfile

    from otviz.data.grounding_sets.export import export_flickr30k, world_draw

    root = export_flickr30k(world_draw(3, "test", 0), tmp_path / "flickr")
    archive = tmp_path / "flickr.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in sorted(root.rglob("*")):
            if f.is_file():
                z.write(f, f"flickr/{f.relative_to(root)}")
    page = own_page
    open_tab(page, "Browse")
    page.locator("#tab-browse").get_by_label("uploaded folder").check()
    page.locator("#tab-browse input[type=file]").first.set_input_files(str(archive))
    try:
        # the file row may render the name's stem and extension as two elements (the text
        # then reads "flickr\n.zip"): compare without white space
        page.wait_for_function("document.querySelector('#tab-browse').innerText"
                               ".replace(/\\s/g, '').includes('flickr.zip')")
    except Exception as error:  # say what the page showed instead
        shown = page.evaluate("document.querySelector('#tab-browse').innerText")
        raise AssertionError(f"the upload is not listed; the Browse tab shows:\n"
                             f"{shown[:3000]}") from error
    click_once_uploaded(page, page.get_by_role("button", name="Load", exact=True))
    try:
        page.wait_for_function("/[✓✗] [0-9.]+/.test(document.querySelector('#browse-table')"
                               ".innerText)")
    except Exception as error:  # say what the page showed instead
        shown = page.evaluate("document.querySelector('#tab-browse').innerText")
        raise AssertionError(f"no hit marks; the Browse tab shows:\n{shown[:3000]}") from error
    rendered_image(page, "#browse-grid")
    assert_not_blank(page, "#browse-grid img")
