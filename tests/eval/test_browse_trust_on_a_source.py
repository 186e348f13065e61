"""Browse and its trust metrics on a non-default feature source (issue 41: one choice,
honoured everywhere): the evaluation set caches the source's own patch features, Browse's
maps are computed from them (they differ from ``last``'s), and the trust metrics score
those maps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from otviz.backbone import Backbone
from otviz.eval.browse import browse_table, world_queries
from otviz.eval.trust.browse import browse_trust_values
from otviz.eval.trust.metrics import TrustSettings
from otviz.eval.world_set import EvalSet
from otviz.suite import WORLD_FIT_CAPTIONS, MethodSuite
from otviz.towers.sources import FeatureSource
from tests.helpers import random_tiny_clip

SOURCE = "sclip"


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """The Browse table of 3 world images under ``last`` and under :data:`SOURCE`, with the
    evaluation sets they were read from."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("source")
    backbone = Backbone.from_checkpoint(random_tiny_clip(root / "bb", 6))
    out = {}
    for reading in (backbone, backbone.with_features(SOURCE)):
        suite = MethodSuite.training_free(reading, WORLD_FIT_CAPTIONS[:20], ("filip",))
        data = EvalSet.build(reading, 3, "test", 0, str(root / "cache"))
        table = browse_table(suite, data, world_queries(data),
                             torch.tensor([[80, 80]]).expand(3, 2),
                             lambda j, data=data: data.samples[j].image, methods=("filip",))
        out[str(reading.features)] = (reading, suite, data, table)
    return out


def test_the_set_caches_the_sources_own_patches(tables):
    reading, _, data, _ = tables[SOURCE]
    pixels = reading.image_tensor([s.image for s in data.samples])
    own, _ = reading.image_tower.encode(pixels, FeatureSource(SOURCE))
    cached = torch.from_numpy(np.asarray(data.features("width").patches[:3], np.float32))
    assert torch.allclose(cached, own.to(cached.dtype), atol=2e-2)  # cached as float16
    last = torch.from_numpy(np.asarray(tables["last"][2].features("width").patches[:3],
                                       np.float32))
    assert not torch.allclose(cached, last, atol=1e-2)


def test_browse_maps_and_their_trust_scores_follow_the_source(tables):
    *_, last = tables["last"]
    _, suite, _, chosen = tables[SOURCE]
    assert len(chosen.items) == len(last.items)
    assert not torch.allclose(chosen.heatmaps, last.heatmaps, atol=1e-4)
    fast = TrustSettings(regions=2)
    mass = browse_trust_values(suite, chosen, "filip", "mass", fast)
    assert bool(torch.isfinite(mass).all())
    again = browse_trust_values(suite, chosen, "filip", "mass", fast)
    assert torch.equal(mass, again)  # deterministic on one source
    mass_last = browse_trust_values(tables["last"][1], last, "filip", "mass", fast)
    assert not torch.allclose(mass, mass_last)
