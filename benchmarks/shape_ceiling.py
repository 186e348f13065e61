"""How much shape the world's pixels allow: a small CNN trained WITH shape labels on object
crops (evaluation only, never used to train otviz's models, which see captions alone).

Each object of a world scene (distractors included) is cropped by its gold box with a
2-pixel margin at the world's own resolution, padded to a square and resized to 32 x 32;
a 3-layer CNN is trained on the objects of the train-split scenes and tested on those of
the test split (other scenes, the same renderer). Its test accuracy is the ceiling that
the embedded model's box-pooled shape probe and zero-shot shape are read against.

Usage::

    python benchmarks/shape_ceiling.py [--n-train 3000] [--n-test 500] [--epochs 20]
        [--seed 0] [--out benchmarks/shape_ceiling]

writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from otviz.world import World, WorldConfig
from otviz.world.vocab import SHAPES

CROP = 32
MARGIN = 2


def object_crops(
    split: str, n_scenes: int, seed: int, config: WorldConfig
) -> tuple[Tensor, Tensor]:
    """``(crops [n, 3, CROP, CROP] in [0, 1], shape labels [n])`` of every object."""
    crops, labels = [], []
    for sample in World(config, split=split, seed=seed).samples(0, n_scenes):
        image = torch.from_numpy(np.ascontiguousarray(sample.image)).permute(2, 0, 1).float() / 255
        _, h, w = image.shape
        for obj in sample.objects:
            x0, y0, x1, y1 = (int(round(v)) for v in obj.box)
            x0, y0 = max(0, x0 - MARGIN), max(0, y0 - MARGIN)
            x1, y1 = min(w, x1 + MARGIN), min(h, y1 + MARGIN)
            crop = image[:, y0:y1, x0:x1]
            side = max(crop.shape[1:])
            crop = F.pad(crop, (0, side - crop.shape[2], 0, side - crop.shape[1]), value=0.5)
            crops.append(F.interpolate(crop[None], size=(CROP, CROP), mode="bilinear",
                                       align_corners=False)[0])
            labels.append(SHAPES.index(obj.shape))
    return torch.stack(crops), torch.tensor(labels)


def small_cnn(n_classes: int) -> nn.Module:
    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(),
                nn.MaxPool2d(2)]

    return nn.Sequential(*block(3, 32), *block(32, 64), *block(64, 128),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, n_classes))


def train_and_test(train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], epochs: int,
                   seed: int, batch_size: int = 128) -> float:
    """Test accuracy of :func:`small_cnn` trained with Adam on ``train``."""
    torch.manual_seed(seed)
    model = small_cnn(len(SHAPES))
    optimiser = torch.optim.Adam(model.parameters(), lr=2e-3)
    x, y = train
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(x)).split(batch_size):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    model.eval()
    with torch.no_grad():
        predicted = torch.cat([model(part).argmax(1) for part in test[0].split(512)])
    return float((predicted == test[1]).float().mean())


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-train", type=int, default=3000, help="train-split scenes")
    parser.add_argument("--n-test", type=int, default=500, help="test-split scenes")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/shape_ceiling")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    config = WorldConfig(negatives=False)
    train = object_crops("train", args.n_train, args.seed, config)
    test = object_crops("test", args.n_test, args.seed, config)
    accuracy = train_and_test(train, test, args.epochs, args.seed)
    result = {"shape_accuracy": accuracy, "n_train_objects": len(train[1]),
              "n_test_objects": len(test[1]), "majority": float(
                  torch.bincount(test[1]).max() / len(test[1])),
              "seconds": time.perf_counter() - t0, **vars(args)}
    Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out + ".md").write_text(
        "# Shape ceiling of the world's pixels\n\n"
        f"`python benchmarks/shape_ceiling.py --n-train {args.n_train} --n-test {args.n_test} "
        f"--epochs {args.epochs} --seed {args.seed}`\n\n"
        f"A 3-layer CNN trained with shape labels on {result['n_train_objects']} object crops "
        f"({CROP} x {CROP}, from train-split scenes) classifies the shapes of "
        f"{result['n_test_objects']} test-split objects with **{100 * accuracy:.1f} %** "
        f"accuracy (majority class {100 * result['majority']:.1f} %; "
        f"{result['seconds']:.0f} s on {args.threads} threads). Evaluation only: no otviz "
        "model is trained with these labels.\n")
    print(Path(args.out + ".md").read_text())
    return result


if __name__ == "__main__":
    main()
