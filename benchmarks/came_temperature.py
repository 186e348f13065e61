"""How non-uniform QC-Align's CAME quotas are at each softmax temperature, on the shipped
example images and captions (``examples/``): the quota max/uniform ratio of
:mod:`otviz.eval.came_quotas`, the number the app's Align view shows next to its CAME
temperature control.

Usage::

    PYTHONPATH=. python benchmarks/came_temperature.py [--backbone DIR] [--heads DIR|training-free]
        [--temperatures 1,0.5,0.2,0.1,0.05]

run from the repository root; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys

from otviz.backbone_spec import BackboneSpec
from otviz.eval.came_quotas import TEMPERATURES, quota_ratio_table
from otviz.explain import Explainer
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite
from otviz.tiny_clip.model import DEFAULT_CHECKPOINT
from otviz.ui.examples import load_examples


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default=str(DEFAULT_CHECKPOINT))
    parser.add_argument("--heads", default="training-free",
                        help="dir of <method>/ heads (QC-Align's is read), or 'training-free'")
    parser.add_argument("--temperatures", default=",".join(f"{t:g}" for t in TEMPERATURES))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    backbone = BackboneSpec(checkpoint=args.backbone).load()
    if args.heads == "training-free":
        suite = MethodSuite.training_free(backbone, WORLD_FIT_CAPTIONS, ("qc_align",))
    else:
        suite = MethodSuite.from_heads(backbone, args.heads, ("qc_align",))
    pairs = [(str(e.image_path), e.caption) for e in load_examples()]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    text = quota_ratio_table(Explainer(backbone), suite, pairs, temperatures).markdown()
    print(text)
    return text


if __name__ == "__main__":
    main()
