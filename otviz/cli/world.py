"""``otviz world``: render samples of the synthetic world as PNGs, a ``captions.json`` and a
contact sheet, or write them as a grounding data set or as webdataset shards (``--as``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from otviz.cli.args import at_least, parser


def build_parser(prog: str = "otviz world") -> argparse.ArgumentParser:
    from otviz.world.vocab import SPLITS

    p = parser(prog, "Render samples of the synthetic world (PNGs, captions.json and a "
               "contact sheet with the gold boxes).")
    p.add_argument("--n", type=at_least(int, 1), default=8, help="how many samples")
    p.add_argument("--split", default="test", choices=SPLITS, help="world split")
    p.add_argument("--seed", type=at_least(int, 0), default=0, metavar="N", help="world seed")
    p.add_argument("--scale", type=at_least(int, 1), default=3, metavar="N",
                   help="nearest-neighbour upscaling of the 80-px renders")
    p.add_argument("--out", default="world_samples", help="output folder")
    p.add_argument("--as", dest="as_format",
                   choices=("flickr30k", "refcoco", "vg", "webdataset"), default="",
                   help="instead: samples 0..n-1 written as this grounding data set, in its "
                   "published layout (for otviz eval --dataset KIND:OUT), or as webdataset "
                   "shards OUT/000000.tar, ... (KEY.png + KEY.txt, for otviz train --data OUT)")
    p.add_argument("--per-shard", type=at_least(int, 1), default=1000, metavar="N",
                   help="with --as webdataset: samples per shard")
    p.add_argument("--lossless", action="store_true",
                   help="with --as: PNG images instead of the published JPEG")
    return p


def main(argv: list[str], prog: str = "otviz world") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.as_format == "webdataset":
        from otviz.world.export import export_shards

        shards = export_shards(args.out, args.n, args.split, args.seed, args.per_shard)
        print(f"wrote {args.n} world {args.split} samples as {len(shards)} webdataset "
              f"shard(s) in {args.out}")
        return 0
    if args.as_format:
        from otviz.data.grounding_sets.export import export_draw

        root = export_draw(args.as_format, args.out, args.n, args.split, args.seed,
                           args.lossless)
        print(f"wrote {args.n} world {args.split} samples as {args.as_format} in {root}")
        return 0
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
