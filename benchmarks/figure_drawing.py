"""CPU of drawing the app's matplotlib figures to the page's WebP, the way the views draw them
now and the way they drew them before (each figure's layout engine left as the placeholder
``"none"``, which made ``savefig`` draw every figure twice; empty ticks on the heatmap
panels instead of hidden axis artists), interleaved in one run. Figures: the Words view's
word grid and phrase figure and the Probe view's score bars and win matrix, of the shipped
examples on the embedded model. Prints the median seconds per figure kind, old and new.

    python benchmarks/figure_drawing.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from collections.abc import Iterator

import numpy as np
import torch
from matplotlib.figure import Figure
from PIL import Image

from otviz.ui import probe_tab, words_tab
from otviz.ui.context import AppContext
from otviz.ui.examples import load_examples
from otviz.viz import heatmaps, probe
from otviz.viz.style import WEBP_OPTIONS, figure_bytes


def empty_ticks(ax, *, x: bool = True, y: bool = True) -> None:
    """The panels' ticks as they were set before ``no_ticks``."""
    if x:
        ax.set_xticks([])
    if y:
        ax.set_yticks([])


def drawn_before(fig: Figure) -> bytes:
    """``fig`` to WebP as before: its layout run, the placeholder engine left on it."""
    fig.get_layout_engine().execute(fig)
    fig.set_layout_engine("none")
    buf = io.BytesIO()
    fig.savefig(buf, format="webp", pil_kwargs=WEBP_OPTIONS)
    return buf.getvalue()


@contextlib.contextmanager
def ticks_before() -> Iterator[None]:
    saved = heatmaps.no_ticks, probe.no_ticks
    heatmaps.no_ticks = probe.no_ticks = empty_ticks
    try:
        yield
    finally:
        heatmaps.no_ticks, probe.no_ticks = saved


def figures(ctx: AppContext, checkpoint: str, rgb: np.ndarray, caption: str
            ) -> dict[str, Figure]:
    explainer, suite = ctx.explainer(checkpoint), ctx.suite(checkpoint)
    words, phrase = words_tab.words_figures(explainer, rgb, caption, None)
    bars, matrix = probe_tab.probe_figures(probe_tab.run_probe(explainer, suite, rgb, caption))
    return {"words grid": words, "words phrase": phrase, "probe bars": bars,
            "probe win matrix": matrix}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = AppContext.default()
    checkpoint = ctx.checkpoint_choices()[0]
    examples = [(np.asarray(Image.open(e.image_path).convert("RGB")), e.caption)
                for e in load_examples()[:3]]
    seconds: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for rgb, caption in examples:
            for way in ("before", "now"):
                with ticks_before() if way == "before" else contextlib.nullcontext():
                    made = figures(ctx, checkpoint, rgb, caption)
                draw = drawn_before if way == "before" else (lambda f: figure_bytes(f, "webp"))
                for kind, fig in made.items():
                    start = time.process_time()
                    draw(fig)
                    seconds.setdefault((kind, way), []).append(time.process_time() - start)
    print("| figure | before (s CPU) | now (s CPU) | now / before |\n|---|---|---|---|")
    for kind in dict.fromkeys(k for k, _ in seconds):
        old, new = (statistics.median(seconds[(kind, w)]) for w in ("before", "now"))
        print(f"| {kind} | {old:.3f} | {new:.3f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
