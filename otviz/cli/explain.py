"""``otviz explain``: per-word heatmaps of an image and a caption, from a file or from one
of the examples shipped with the package (``--example N``, so the command works after a
``pip install`` as well as in a checkout)."""

from __future__ import annotations

import argparse
from pathlib import Path

from otviz.cli.args import at_least, feature_source_text, parser
from otviz.knobs import FEATURE_SOURCE_NAMES
from otviz.ui.examples import Example, load_examples


def build_parser(prog: str = "otviz explain") -> argparse.ArgumentParser:
    count = len(load_examples())
    p = parser(prog, "Per-word heatmaps of an image and a caption: each word's similarity "
               "to every image patch, saved as one figure.")
    p.add_argument("image", nargs="?", help="image file (any format PIL reads); leave out "
                   "with --example")
    p.add_argument("caption", nargs="?", help="the caption (with --example: default the "
                   "example's own)")
    p.add_argument("--example", type=int, choices=range(count), metavar="N", default=None,
                   help=f"use the shipped example N (0-{count - 1}) instead of an image file")
    p.add_argument("--out", default="explain.png", help="figure path (.png, .pdf, .svg)")
    p.add_argument("--checkpoint", default=None,
                   help="backbone checkpoint folder (default: the shipped tiny CLIP)")
    p.add_argument("--features", type=feature_source_text, default="last",
                   metavar="|".join(FEATURE_SOURCE_NAMES),
                   help="where the patch features come from: the last block, block K "
                   "(negative from the end) or a dense last-block path")
    p.add_argument("--image-size", type=at_least(int, 0), default=0, metavar="N",
                   help="run the image tower at N x N px (0: its native size; ViTs only)")
    return p


def pair(args: argparse.Namespace, p: argparse.ArgumentParser) -> Example:
    """The image path and caption the flags name; ``p.error`` (exit 2) on a wrong call,
    before any model is loaded."""
    if args.example is not None:
        if args.image is not None and args.caption is not None:
            p.error("with --example give at most the caption, not an image")
        example = load_examples()[args.example]
        return Example(example.image_path, args.image or example.caption)
    if args.image is None:
        p.error("the following arguments are required: image (or --example N)")
    image = Path(args.image)
    if not image.exists():
        p.error(f"no such file: {args.image}")
    if not image.is_file():
        p.error(f"not a file: {args.image}")
    if args.caption is None:
        p.error("the following arguments are required: caption")
    return Example(image, args.caption)


def main(argv: list[str], prog: str = "otviz explain") -> int:
    p = build_parser(prog)
    args = p.parse_args(argv)
    chosen = pair(args, p)
    from otviz.backbone import Backbone
    from otviz.explain import Explainer
    from otviz.viz.heatmaps import word_similarity_figure

    backbone = Backbone.from_checkpoint(args.checkpoint) if args.checkpoint else (
        Backbone.from_checkpoint()
    )
    backbone = backbone.with_features(args.features, args.image_size or None)
    explainer = Explainer(backbone)
    encoded = explainer.encode(str(chosen.image_path), chosen.caption)
    fig = word_similarity_figure(encoded, explainer.word_similarity(encoded),
                                 encoded.kept_words, suptitle=f'"{encoded.caption}"')
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0
