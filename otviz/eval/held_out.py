"""Held-out retrieval of a tiny CLIP on the synthetic world's ``test`` split: the metric
pre-training reports (``otviz pretrain``; :func:`otviz.train.pretrain.pretrain` takes
:class:`HeldOutRetrieval` as its ``held_out``), Recall@1/5/10 both ways
(:func:`otviz.eval.retrieval.recall_at_k`, ConceptOT App. G.4) of the global embeddings,
beside two facts of the test pairs that bound it: the share of ambiguous captions and the
best text->image R@1 any model can reach (:func:`otviz.world.retrieval_ceiling`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from otviz.data.rendered import RenderedSplit, normalise, split_from_samples
from otviz.eval.retrieval import recall_at_k
from otviz.world import World, WorldConfig, ambiguous_caption_share, retrieval_ceiling


@torch.no_grad()
def embed_split(
    model: nn.Module, data: RenderedSplit, mean: tuple[float, ...], std: tuple[float, ...],
    batch_size: int = 250,
) -> tuple[Tensor, Tensor]:
    """L2-normalised global embeddings ``(images [n, E], texts [n, E])`` of a rendered split
    (on the model's device); the model's train/eval mode is left as it was."""
    was_training = model.training
    model.eval()
    device = model.logit_scale.device
    imgs, txts = [], []
    for s in range(0, len(data), batch_size):
        images = data.images[s : s + batch_size].to(device)
        imgs.append(model.encode_image(normalise(images, mean, std), normalize=True))
        txts.append(model.encode_text(data.ids[s : s + batch_size].to(device), normalize=True))
    model.train(was_training)
    return torch.cat(imgs), torch.cat(txts)


class HeldOutRetrieval:
    """The first ``n_test`` pairs of the world's ``test`` split at ``seed``, tokenised to
    ``context_length``; calling it on a tiny CLIP gives its Recall@K (1:1 pairs, ties
    against the match).

    Attributes:
        data: the rendered test pairs.
        ceiling: ``ambiguous_caption_share`` and ``t2i_r1_ceiling`` of those pairs.
    """

    def __init__(self, world: WorldConfig, seed: int, n_test: int, context_length: int) -> None:
        samples = [World(world, split="test", seed=seed).sample(i) for i in range(n_test)]
        self.data = split_from_samples(samples, context_length)
        self.ceiling = {
            "ambiguous_caption_share": ambiguous_caption_share(samples),
            "t2i_r1_ceiling": retrieval_ceiling(samples),
        }

    def __call__(self, model: nn.Module) -> dict[str, float]:
        """``{"i2t_r1", "i2t_r5", "i2t_r10", "t2i_r1", ...}`` of ``model`` on the pairs."""
        pp = model.visual.preprocess_cfg
        images, texts = embed_split(model, self.data, tuple(pp["mean"]), tuple(pp["std"]))
        return recall_at_k(images @ texts.T)
