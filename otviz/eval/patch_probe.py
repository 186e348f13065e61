"""Linear probes of what the patch tokens know: the shape and the colour of each object,
read from the backbone's patch features pooled over the object's gold box.

An object's feature is the mean of the patch tokens weighted by how much of each patch
cell its box covers (:func:`box_weights`), so even an object of two by two patches gets
a feature. A multinomial logistic regression (scikit-learn, standardised features) is fit
on the objects of one part of the scenes and scored on the objects of the others: scenes,
not objects, are split, so no scene feeds both sides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import Tensor

from otviz.backbone import Backbone
from otviz.patch_grid.tokens import TokenGeometry
from otviz.world import Sample

ATTRIBUTES: tuple[str, ...] = ("shape", "colour")


def box_weights(boxes: Tensor, geometry: TokenGeometry) -> Tensor:
    """``[n, N]`` float64: the share of each token's cell (the pixels it looks at, in the
    token geometry on the image) that pixel box ``boxes[i]`` (``[n, 4]``, half-open)
    covers."""
    cells = geometry.cells()  # [N, 4]
    b = boxes.to(torch.float64)[:, None, :]
    iw = (torch.minimum(b[..., 2], cells[:, 2]) - torch.maximum(b[..., 0], cells[:, 0])).clamp(0)
    ih = (torch.minimum(b[..., 3], cells[:, 3]) - torch.maximum(b[..., 1], cells[:, 1])).clamp(0)
    area = (cells[:, 2] - cells[:, 0]) * (cells[:, 3] - cells[:, 1])
    return iw * ih / area


def box_pooled(patches: Tensor, weights: Tensor) -> Tensor:
    """``[n, D]``: the ``weights``-weighted mean of ``patches`` (``[n, N, D]``, ``[n, N]``)."""
    w = weights.to(patches.dtype)
    return (patches * w[..., None]).sum(1) / w.sum(1, keepdim=True).clamp(min=1e-12)


@dataclass
class ObjectFeatures:
    """Box-pooled patch features of every object of some scenes: ``features [n, D]``, each
    object's ``shapes``/``colours`` and the index of its ``scene``."""

    features: np.ndarray
    shapes: list[str]
    colours: list[str]
    scene: np.ndarray

    def labels(self, attribute: str) -> list[str]:
        return self.shapes if attribute == "shape" else self.colours


@torch.no_grad()
def object_features(
    backbone: Backbone, samples: Sequence[Sample], batch_size: int = 128
) -> ObjectFeatures:
    """:class:`ObjectFeatures` of every object (distractors included) of ``samples``, from
    the backbone's patch tokens in its own feature space."""
    feats, shapes, colours, scene = [], [], [], []
    for s in range(0, len(samples), batch_size):
        chunk = samples[s : s + batch_size]
        encoded = backbone.encode([x.image for x in chunk], [x.caption for x in chunk])
        owner = [k for k, x in enumerate(chunk) for _ in x.objects]
        boxes = torch.tensor([o.box for x in chunk for o in x.objects], dtype=torch.float64)
        height, width = chunk[0].image.shape[:2]
        weights = box_weights(boxes, backbone.geometry_on(width, height))
        feats.append(box_pooled(encoded.patches[owner].double(), weights))
        shapes += [o.shape for x in chunk for o in x.objects]
        colours += [o.colour for x in chunk for o in x.objects]
        scene += [s + k for k in owner]
    return ObjectFeatures(torch.cat(feats).numpy(), shapes, colours, np.asarray(scene))


def linear_probe_accuracy(
    objects: ObjectFeatures, attribute: str, train_share: float = 0.7, seed: int = 0
) -> dict[str, float]:
    """Test accuracy of a logistic-regression probe of ``attribute`` (``"shape"`` or
    ``"colour"``) trained on the objects of the first ``train_share`` of the scenes;
    with the number of train and test objects and the majority-class rate of the test
    objects (what a constant guess scores)."""
    if attribute not in ATTRIBUTES:
        raise ValueError(f"attribute must be one of {ATTRIBUTES}, got {attribute!r}")
    labels = np.asarray(objects.labels(attribute))
    cut = int(np.ceil(train_share * (objects.scene.max() + 1)))
    train = objects.scene < cut
    if not train.any() or train.all():
        raise ValueError("need scenes on both sides of the split")
    probe = make_pipeline(StandardScaler(),
                          LogisticRegression(max_iter=2000, random_state=seed))
    probe.fit(objects.features[train], labels[train])
    test_labels = labels[~train]
    _, counts = np.unique(test_labels, return_counts=True)
    return {"accuracy": float((probe.predict(objects.features[~train]) == test_labels).mean()),
            "n_train": int(train.sum()), "n_test": int((~train).sum()),
            "majority": float(counts.max() / counts.sum())}
