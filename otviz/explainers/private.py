"""A private copy of a model for the explainers that hook it, and the hooks they use.

Two explainers need hooks on the model they run, which :mod:`otviz.towers` (whose feature
sources re-run the blocks from the live weights, with no hook and no copy) does not:
Grad-CAM, because the grad-cam library (pytorch-grad-cam) reads the target layer's
activations and gradients through forward hooks it registers itself; and the attention
traces of timm trunks (:mod:`otviz.explainers.attention`), which read the softmax attention
where timm computes it (the ``attn_drop`` after the softmax, with the unfused path switched
on), because EVA's rotary attention is timm's to apply. On the shared model that state would
reach every forward another server thread makes meanwhile (an Align click, another
explainer): its activations would land in the hooks, or a trace's edited attention in its
result. So the hooked calls run one at a time (:data:`HOOKS`) on a copy of the model that only
they run (:func:`private_model`), kept per model and refreshed from the model's current
weights at every call: an in-place change, ``load_state_dict`` or ``.to(dtype / device)``
of the shared model reaches the next hooked call.
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
    """The copy of ``model`` only the hooked callers run (frozen, in eval mode; call it
    under :data:`HOOKS`), its weights and buffers those of ``model`` now: copied into the
    kept copy where the layout (names, shapes, dtypes, devices) is unchanged, else a new copy.
    It costs one more copy of the model's weights in memory, shared by every hooked caller,
    and one weight copy per call."""
    clone = _PRIVATE.get(model)
    state = model.state_dict()
    if clone is None or not _same_layout(clone.state_dict(), state):
        clone = _PRIVATE[model] = copy.deepcopy(model).eval().requires_grad_(False)
        return clone
    with torch.no_grad():
        for name, tensor in clone.state_dict().items():
            tensor.copy_(state[name])
    return clone


def _same_layout(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        (x.shape, x.dtype, x.device) == (b[k].shape, b[k].dtype, b[k].device)
        for k, x in a.items())


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
