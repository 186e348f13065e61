"""Pointing of the MaskCLIP-style map (cosine of each patch's joint-space feature with the
phrase's pooled, unit text embedding) per feature source on the embedded model, each map and
its negation: is the MaskCLIP explainer's below-chance pointing its path's or the pooled
embedding's? World test draw of seed 555, 150 images; prints the pointing (%) per source.

    python benchmarks/pooled_text_pointing.py [--n-test 150] [--seed 555]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from otviz.backbone_spec import BackboneSpec
from otviz.eval.alignment_tables import phrase_queries
from otviz.eval.grounding_metrics import pointing_hits
from otviz.eval.world_set import EvalSet
from otviz.explainers.run import phrase_embeddings
from otviz.towers.sources import FeatureSource

SOURCES = ("maskclip", "last", "clearclip", "sclip")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-test", type=int, default=150)
    parser.add_argument("--seed", type=int, default=555)
    args = parser.parse_args()
    torch.set_num_threads(1)
    backbone = BackboneSpec().load()
    data = EvalSet.build(backbone, args.n_test, "test", args.seed, ".cache/otviz-features")
    q = phrase_queries(data)
    images = [data.samples[int(j)].image for j in q.image]
    text = phrase_embeddings(backbone, q.texts)
    tower = backbone.image_tower
    print(f"{len(q.texts)} phrases")
    with torch.no_grad():
        for source in SOURCES:
            parts = []
            for s in range(0, len(images), 32):
                patches, _ = tower.encode(backbone.image_tensor(images[s : s + 32]),
                                          FeatureSource(source))
                f = F.normalize(tower.project(patches), dim=-1)
                parts.append((f * text[s : s + 32, None]).sum(-1).double())
            maps = torch.cat(parts)
            hit, negated = (100 * float(pointing_hits(m, data.geometry, q.boxes).mean())
                            for m in (maps, -maps))
            print(f"{source}: {hit:.1f} (negated {negated:.1f})")


if __name__ == "__main__":
    main()
