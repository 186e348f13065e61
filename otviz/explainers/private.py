"""A private copy of a model for the callers that hook it, and the hooks they use.

Grad-CAM (through the grad-cam library), the attention traces of timm towers
(:mod:`otviz.explainers.attention`) and the dense feature sources of timm towers
(:mod:`otviz.towers.timm_tower`) put forward hooks on the model they run for the length
of a call, and the timm ones switch its attention to the unfused path. On the shared model
that state would reach every forward another server thread makes meanwhile (an Align click,
another explainer): its activations would land in the hooks, or a trace's edited attention in
its result. So the hooked calls run one at a time (:data:`HOOKS`) on a copy of the model that
only they run (:func:`private_model`), made once per model.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

#: One hooked call at a time, whichever explainer makes it.
HOOKS = threading.Lock()
_PRIVATE: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def private_model(model: nn.Module) -> nn.Module:
    """The copy of ``model`` only the hooked callers run (made on the first call, frozen,
    in eval mode; call it under :data:`HOOKS`). It costs one more copy of the model's
    weights in memory, shared by every hooked caller."""
    clone = _PRIVATE.get(model)
    if clone is None:
        clone = _PRIVATE[model] = copy.deepcopy(model).eval().requires_grad_(False)
    return clone


def timm_attention(block: nn.Module) -> nn.Module | None:
    """The block's attention module when it has timm's unfused path (``fused_attn`` and the
    ``attn_drop`` right after the softmax), else ``None``."""
    attn = getattr(block, "attn", None)
    if attn is None or not hasattr(attn, "fused_attn") or not isinstance(
            getattr(attn, "attn_drop", None), nn.Module):
        return None
    return attn


@contextmanager
def unfused(attns: list[nn.Module]) -> Iterator[None]:
    """timm's attention modules on their unfused path (the softmax written out) meanwhile."""
    before = [a.fused_attn for a in attns]
    try:
        for a in attns:
            a.fused_attn = False
        yield
    finally:
        for a, fused in zip(attns, before, strict=True):
            a.fused_attn = fused


@contextmanager
def hooked(*handles: torch.utils.hooks.RemovableHandle) -> Iterator[None]:
    """The hooks ``handles`` stay on meanwhile and are removed after."""
    with ExitStack() as stack:
        for handle in handles:
            stack.callback(handle.remove)
        yield
