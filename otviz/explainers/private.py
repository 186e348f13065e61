"""A private copy of a model for the explainers that hook it.

Grad-CAM (through the grad-cam library) and the attention traces of timm towers
(:mod:`otviz.explainers.attention`) put forward hooks on the model they run for the length
of a call, and the timm traces switch its attention to the unfused path. On the shared model
that state would reach every forward another server thread makes meanwhile (an Align click,
another explainer): its activations would land in the hooks, or a trace's edited attention in
its result. So the hooked calls run one at a time (:data:`HOOKS`) on a copy of the model that
only they run (:func:`private_model`), made once per model.
"""

from __future__ import annotations

import copy
import threading
import weakref

from torch import nn

#: One hooked call at a time, whichever explainer makes it.
HOOKS = threading.Lock()
_PRIVATE: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def private_model(model: nn.Module) -> nn.Module:
    """The copy of ``model`` only the hooked explainers run (made on the first call, frozen,
    in eval mode; call it under :data:`HOOKS`). It costs one more copy of the model's
    weights in memory, shared by every hooked explainer."""
    clone = _PRIVATE.get(model)
    if clone is None:
        clone = _PRIVATE[model] = copy.deepcopy(model).eval().requires_grad_(False)
    return clone
