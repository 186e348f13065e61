"""Grad-CAM's concurrency story (otviz/explainers/private.py): two server threads running
Grad-CAM on one backbone at once, while a third runs the shared model's own forward (an
Align click), get the maps they get one after the other, and no hook outlives a call, on the
shared model or on Grad-CAM's private copy."""

from __future__ import annotations

import threading

import open_clip
import torch
import torch.nn.functional as F
from open_clip.model import CLIPTextCfg, CLIPVisionCfg

from otviz.explainers import private
from otviz.explainers.gradcam import GradCamExplainer

ROUNDS = 4


def _hooks(module: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               for m in module.modules())


def test_two_threads_running_gradcam_at_once_get_their_sequential_maps():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = open_clip.CLIP(16, CLIPVisionCfg(layers=2, width=32, head_width=16, patch_size=8,
                                             image_size=32),
                           CLIPTextCfg(context_length=8, vocab_size=64, width=32, heads=2,
                                       layers=1)).eval()
    g = torch.Generator().manual_seed(1)
    pixels = [torch.randn(2, 3, 32, 32, generator=g) for _ in range(2)]
    texts = [F.normalize(torch.randn(2, 16, generator=g), dim=-1) for _ in range(2)]
    sequential = [GradCamExplainer(model).explain(p, t) for p, t in zip(pixels, texts,
                                                                          strict=True)]
    with torch.no_grad():
        clicks = model.encode_image(pixels[0])
    start = threading.Barrier(3)
    results: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    others: list[torch.Tensor] = []
    errors: list[BaseException] = []

    def explain(k: int) -> None:
        try:
            start.wait()
            for _ in range(ROUNDS):
                results[k].append(GradCamExplainer(model).explain(pixels[k], texts[k]))
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    def click() -> None:
        start.wait()
        with torch.no_grad():
            for _ in range(4 * ROUNDS):
                others.append(model.encode_image(pixels[0]))

    threads = [threading.Thread(target=explain, args=(k,)) for k in (0, 1)]
    threads.append(threading.Thread(target=click))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for k in (0, 1):
        assert len(results[k]) == ROUNDS
        assert all(torch.equal(m, sequential[k]) for m in results[k])
    assert all(torch.equal(o, clicks) for o in others)
    assert _hooks(model) == 0 and _hooks(private._PRIVATE[model]) == 0
    assert not private.HOOKS.locked()
