"""The ``otviz`` command line: ``world``, ``pretrain``, ``explain``, ``bench``.

Every subcommand is a thin wrapper over a function of the package; knobs of configuration
dataclasses become flags (``--batch-size`` for ``batch_size``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _cmd_world(args: argparse.Namespace) -> int:
    from PIL import Image

    from otviz.world import World, export_samples, render_grid

    records = export_samples(args.out, args.n, split=args.split, seed=args.seed, scale=args.scale)
    world = World(split=args.split, seed=args.seed)
    sheet = render_grid([world.sample(r["index"]) for r in records], boxes=True)
    sheet_path = Path(args.out) / "contact_sheet.png"
    Image.fromarray(sheet).save(sheet_path)
    for r in records:
        print(f"{r['file']}: {r['caption']}")
    print(f"wrote {len(records)} samples and {sheet_path}")
    return 0


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from otviz.cli_args import dataclass_from_args
    from otviz.train.pretrain import PretrainConfig, pretrain

    metrics = pretrain(dataclass_from_args(PretrainConfig, args))
    for key, value in metrics.items():
        print(f"{key}: {value}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from otviz.backbone import Backbone
    from otviz.pipeline import Explainer
    from otviz.viz.heatmaps import heatmap_grid_figure
    from otviz.viz.style import SIMILARITY_CMAP

    backbone = Backbone.from_checkpoint(args.checkpoint) if args.checkpoint else (
        Backbone.from_checkpoint()
    )
    explainer = Explainer(backbone)
    encoded = explainer.encode(args.image, args.caption)
    maps = explainer.word_similarity(encoded)
    kept = sorted({int(w) for w in encoded.features.token_word[0][encoded.features.token_mask[0]]})
    fig = heatmap_grid_figure(
        encoded.image,
        [maps[k].numpy() for k in kept],
        [encoded.words[k].text for k in kept],
        cmap=SIMILARITY_CMAP,
        colorbar_label="cosine similarity",
        zero_floor=False,
        suptitle=f'"{encoded.caption}"',
    )
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from otviz.bench import main as bench_main

    return bench_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    from otviz.cli_args import add_dataclass_flags

    parser = argparse.ArgumentParser(prog="otviz", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    world = sub.add_parser("world", help="render samples of the synthetic world")
    world.add_argument("--n", type=int, default=8, help="how many samples")
    world.add_argument("--split", default="test", choices=["train", "test", "compositional"])
    world.add_argument("--seed", type=int, default=0)
    world.add_argument("--scale", type=int, default=3, help="nearest-neighbour upscaling")
    world.add_argument("--out", default="world_samples", help="output folder")
    world.set_defaults(run=_cmd_world)

    pre = sub.add_parser("pretrain", help="train the tiny CLIP backbone on the world")
    from otviz.train.pretrain import PretrainConfig

    add_dataclass_flags(pre, PretrainConfig)
    pre.set_defaults(run=_cmd_pretrain)

    explain = sub.add_parser("explain", help="per-word heatmaps of an image and a caption")
    explain.add_argument("image", help="image file (any format PIL reads)")
    explain.add_argument("caption")
    explain.add_argument("--out", default="explain.png", help="figure path (.png, .pdf, .svg)")
    explain.add_argument("--checkpoint", default=None, help="backbone checkpoint folder")
    explain.set_defaults(run=_cmd_explain)

    bench = sub.add_parser("bench", help="benchmark the methods against POT (see --help)",
                           add_help=False)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(run=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"otviz {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
