"""Fast paths that never read an accelerator's memory back to the host.

A solver may skip work when a flag tensor is all False (no underflowed sum to repair, no
masked entry, no failed factorisation). Reading the flag is free on the CPU but a device
synchronisation on a GPU, one per call, which stalls a forward pass. :func:`known_false`
answers the question only where it costs nothing; elsewhere the caller takes its
branch-free path (``torch.where`` over both results), which gives the same values.
"""

from __future__ import annotations

from torch import Tensor

#: Device types whose tensors the host reads without a synchronisation (a test empties it
#: to run the accelerator's branch-free paths on the CPU).
HOST_DEVICES = ("cpu",)


def on_host(x: Tensor) -> bool:
    """Whether the host reads ``x`` without a device synchronisation (:data:`HOST_DEVICES`)."""
    return x.device.type in HOST_DEVICES


def known_false(flag: Tensor) -> bool:
    """True when ``flag`` has no True entry and reading it needs no device
    synchronisation (:func:`on_host`); False otherwise (any True entry, or a tensor on an
    accelerator, where the caller must take its branch-free path)."""
    return on_host(flag) and not bool(flag.any())
