"""``otviz explain``: per-word heatmaps of an image and a caption, from a file or from one
of the examples shipped with the package (``--example N``, so the command works after a
``pip install`` as well as in a checkout). With ``--heads DIR``, each trained head's
per-word maps instead, at the reading the heads were trained on (``otviz app --heads`` reads
the same folders); heads trained on other weights or read another way are refused with a
message naming both."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from otviz.backbone import Backbone
    from otviz.backbone_spec import BackboneSpec
    from otviz.checkpoints.head_folders import HeadFolder
    from otviz.suite import MethodSuite

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
    p.add_argument("--model", default=None, metavar="NAME",
                   help="an open_clip architecture instead of the tiny CLIP (with --pretrained)")
    p.add_argument("--pretrained", default=None, metavar="SOURCE",
                   help="the --model's weights: an open_clip tag (downloaded), a local weight "
                   "file or a Hugging Face snapshot folder (read with no hub call)")
    p.add_argument("--heads", default=None, metavar="DIR",
                   help="trained method heads (a folder as otviz train --publish DIR writes, "
                   "or a snapshot folder of them): draw each head's per-word maps, at the "
                   "reading they were trained on")
    p.add_argument("--features", type=feature_source_text, default=None,
                   metavar="|".join(FEATURE_SOURCE_NAMES),
                   help="where the patch features come from: the last block, block K "
                   "(negative from the end) or a dense last-block path (default: last, or "
                   "the one the --heads were trained on)")
    p.add_argument("--image-size", type=at_least(int, 0), default=None, metavar="N",
                   help="run the image tower at N x N px (0: its native size; ViTs only; "
                   "default: native, or the one the --heads were trained on)")
    p.add_argument("--proxy", default=None, metavar="NAME[:SOURCE]",
                   help="the second backbone of --features proxy (ProxyCLIP): a timm ViT NAME "
                   "(its tag's weights from the hub), NAME:FILE (a local weight file) or "
                   "NAME:random")
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
    if (args.model is None) != (args.pretrained is None) or (args.model and args.checkpoint):
        p.error("--model and --pretrained come together, instead of --checkpoint")
    from otviz.backbone_spec import BackboneSpec
    from otviz.checkpoints.head_folders import trained_reading
    from otviz.errors import UserInputError
    from otviz.explain import Explainer
    from otviz.viz.heatmaps import heatmap_grid_figure, word_similarity_figure

    try:
        spec = BackboneSpec.from_fields(args, features="last", image_size=None, proxy=None)
        backbone = _backbone(args, spec)
        native = backbone.image_size
        features, side = args.features or "last", args.image_size or None
        heads = _heads(args, backbone) if args.heads else None
        if heads is not None:
            features, side = trained_reading(heads.backbone)
        backbone = replace(spec, features=features, image_size=None if side == native else side,
                           proxy=args.proxy).read(backbone)
        suite = _suite(backbone, heads) if heads else None
    except UserInputError as e:
        p.error(str(e))
    explainer = Explainer(backbone)
    encoded = explainer.encode(str(chosen.image_path), chosen.caption)
    if suite is None:
        fig = word_similarity_figure(encoded, explainer.word_similarity(encoded),
                                     encoded.kept_words, suptitle=f'"{encoded.caption}"')
    else:
        words = encoded.kept_words
        maps = {m: explainer.method_word_maps(encoded, suite, m) for m in heads.heads}
        fig = heatmap_grid_figure(
            encoded.image, [maps[m][k].numpy() for m in maps for k in words],
            [f"{m}: {encoded.words[k].text}" for m in maps for k in words],
            geometry=encoded.geometry, shared_scale=False, columns=min(len(words), 8),
            suptitle=f'"{encoded.caption}" (heads {heads.name}, {features})')
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


def _backbone(args: argparse.Namespace, spec: BackboneSpec) -> Backbone:
    """The backbone the flags name at its native reading (``spec``): the tiny CLIP
    (``--checkpoint``, default the shipped one) or an open_clip ``--model`` with
    ``--pretrained`` weights (a local file or snapshot folder as the app reads it)."""
    from otviz.ui.model_sources import ModelSource, load_local

    source = ModelSource(args.model, args.pretrained) if args.model else None
    return load_local(source) if source and source.is_local else spec.load()


def _heads(args: argparse.Namespace, backbone: Backbone) -> HeadFolder:
    """The head set of ``--heads`` trained on ``backbone``'s weights (the first such group;
    none: the weights mismatch, naming both), refused (naming both readings) where
    ``--features`` / ``--image-size`` ask for another reading than it was trained on."""
    from otviz.checkpoints.head_folders import read_head_folder, trained_reading, weights_mismatch
    from otviz.checkpoints.identity import backbone_fingerprint, describe_choice
    from otviz.errors import UserInputError

    loaded = backbone_fingerprint(backbone)
    groups = read_head_folder(args.heads)
    fits = [g for g in groups if not weights_mismatch(g.backbone, loaded, "")]
    if not fits:
        raise UserInputError(str(weights_mismatch(groups[0].backbone, loaded,
                                                  f"{backbone.name} from the flags")))
    heads = fits[0]
    features, side = trained_reading(heads.backbone)
    asked_side = side if args.image_size is None else args.image_size or None
    asked = (args.features or features, None if asked_side == backbone.image_size else asked_side)
    if asked != (features, side):
        raise UserInputError(
            f"--heads {heads.name} were trained on {describe_choice(heads.backbone)}, not on "
            f"{describe_choice({'features': asked[0], 'image_size': asked[1]})}: leave out "
            "--features / --image-size to read them as trained, or leave out --heads for "
            "the word maps")
    return heads


def _suite(backbone: Backbone, heads: HeadFolder) -> MethodSuite:
    """The trained methods of ``heads`` on ``backbone`` (read as they were trained; a head
    that does not fit it raises a ``CheckpointError``)."""
    from otviz.checkpoints.identity import backbone_identity
    from otviz.suite import MethodSuite, load_head

    identity = backbone_identity(backbone)  # the weights hashed once
    methods = {m: load_head(path, identity) for m, path in heads.heads.items()}
    return MethodSuite(backbone, methods, f"heads {heads.name}")
