"""``otviz world``: render samples of the synthetic world as PNGs, a ``captions.json`` and a
contact sheet."""

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
    return p


def main(argv: list[str], prog: str = "otviz world") -> int:
    args = build_parser(prog).parse_args(argv)
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
