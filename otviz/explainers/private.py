"""The one place that hooks a model: a private copy of the model for Grad-CAM, and the lock
its calls take.

Grad-CAM needs hooks: the grad-cam library (pytorch-grad-cam) reads the target layer's
activations and gradients through forward hooks it registers itself on the module it is
given. Nothing else in otviz hooks a model: the feature sources (:mod:`otviz.towers.dense`)
and the attention traces of LeGrad and Chefer relevance
(:meth:`otviz.towers.base.ImageTower.attention_reader`) re-run the blocks from the live
weights with the attention written out.

The concurrency story. The app serves clicks on server threads that share one model. A hook
on that model would see every forward another thread makes meanwhile (an Align click,
another explainer): their activations would land in the library's lists and mix with the
call's own. So a Grad-CAM call

1. takes :data:`HOOKS` (one hooked call at a time in the process; the other threads'
   unhooked forwards on the shared model go on meanwhile),
2. runs on :func:`private_model`, a copy of the model that only hooked calls run, kept per
   model and refreshed from the model's current weights at the start of every call (an
   in-place change, ``load_state_dict`` or ``.to(dtype / device)`` of the shared model
   reaches the next call), and
3. removes its hooks before it lets go of the lock (the library's ``release``), so no hook
   outlives the call, on the copy or on the shared model (which is never hooked).

Two threads running Grad-CAM on one backbone at once thus get what they would get one after
the other (``tests/explainers/test_gradcam_threads.py``).
"""

from __future__ import annotations

import copy
import threading
import weakref

import torch
from torch import nn

#: One hooked call at a time in the process.
HOOKS = threading.Lock()
_PRIVATE: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def private_model(model: nn.Module) -> nn.Module:
    """The copy of ``model`` only the hooked calls run (frozen, in eval mode; call it under
    :data:`HOOKS`), its weights and buffers those of ``model`` now: copied into the kept copy
    where the layout (names, shapes, dtypes, devices) is unchanged, else a new copy. It costs
    one more copy of the model's weights in memory and one weight copy per call."""
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
