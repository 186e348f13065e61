"""A tower's token geometry derived from its architecture (the contract:
:class:`otviz.patch_grid.tokens.TokenGeometry`).

Every layer that changes the spatial resolution (a convolution or a pooling with a stride)
maps its output index ``o`` to the centre of its window on its input,
``o * stride - padding + dilation * (kernel - 1) / 2`` (in input indices, per axis); the
tower's tokens sit at the composition of these maps along the path from the pixels to the
token grid. :func:`trace_geometry` finds that path by running the tower once on a blank
input with hooks on its convolutions and poolings, in the order they run (only the calling
thread's forward is recorded: another server thread's forward of the same tower meanwhile,
at any input size, passes the hooks unrecorded and unchanged): a layer whose
input has the current resolution and whose output is coarser is the next step (a parallel
branch that downsamples the same input again, such as a residual shortcut, reads a
resolution already passed and is skipped: for the towers otviz serves both branches agree).
timm's ``*Same`` layers pad asymmetrically (TensorFlow's ``SAME``) and are read with that
padding. What the hooks do not see (a patch merging that concatenates 2x2 neighbours, as in
Swin) is closed by an even, cell-centred split of the rest of the resolution.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import torch
from torch import Tensor, nn

from otviz.patch_grid.tokens import TokenGeometry

SPATIAL = (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)


def _pair(v: object) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, tuple | list) else (int(v), int(v))  # type: ignore[index]


def _same_padding(size: int, kernel: int, stride: int, dilation: int) -> int:
    """The leading pad of TensorFlow's ``SAME`` padding (timm's ``pad_same``)."""
    total = max((math.ceil(size / stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2


def layer_step(layer: nn.Module, in_size: tuple[int, int]) -> tuple[tuple[float, float],
                                                                     tuple[float, float]]:
    """``((stride_y, stride_x), (shift_y, shift_x))`` of one spatial layer: output index
    ``o`` looks at input index ``o * stride + shift`` (its window's centre)."""
    kernel, stride = _pair(layer.kernel_size), _pair(layer.stride or layer.kernel_size)
    dilation = _pair(getattr(layer, "dilation", 1))
    padding = getattr(layer, "padding", 0)
    same = type(layer).__name__.endswith("Same")
    steps, shifts = [], []
    for axis in range(2):
        k, s, d = kernel[axis], stride[axis], dilation[axis]
        if same:
            p = _same_padding(in_size[axis], k, s, d)
        elif isinstance(padding, str):  # "same" in torch keeps the size at stride 1
            p = d * (k - 1) // 2 if padding == "same" else 0
        else:
            p = _pair(padding)[axis]
        steps.append(float(s))
        shifts.append(d * (k - 1) / 2 - p)
    return (steps[0], steps[1]), (shifts[0], shifts[1])


def trace_geometry(
    tower: nn.Module, forward: Callable[[Tensor], tuple[int, int]], input_size: tuple[int, int]
) -> TokenGeometry:
    """The token geometry of ``tower`` on a ``(width, height)`` input, from the strides,
    kernels and paddings of the layers between the pixels and the token grid.

    Args:
        tower: the module whose convolutions and poolings are read (hooked).
        forward: runs the tower on ``[1, 3, H, W]`` pixels and returns the token grid
            ``(rows, cols)``.
        input_size: ``(width, height)`` of the model input.
    """
    events: list[tuple[nn.Module, tuple[int, int], tuple[int, int]]] = []
    caller = threading.get_ident()

    def hook(module: nn.Module, args: tuple, out: Tensor) -> None:
        x = args[0]
        if (threading.get_ident() == caller and isinstance(x, Tensor) and x.dim() == 4
                and isinstance(out, Tensor)):
            events.append((module, tuple(x.shape[-2:]), tuple(out.shape[-2:])))

    handles = [m.register_forward_hook(hook) for m in tower.modules() if isinstance(m, SPATIAL)]
    try:
        param = next(tower.parameters())
        pixels = torch.zeros(1, 3, input_size[1], input_size[0], dtype=param.dtype,
                             device=param.device)
        with torch.no_grad():
            grid = tuple(int(g) for g in forward(pixels))
    finally:
        for h in handles:
            h.remove()
    size = (input_size[1], input_size[0])  # (rows, cols) of the current resolution
    scale, shift = [1.0, 1.0], [0.0, 0.0]  # input index of current index o: o * scale + shift
    for module, in_size, out_size in events:
        if in_size != size or out_size == size or any(o > i for o, i in zip(out_size, in_size,
                                                                                strict=True)):
            continue
        steps, shifts = layer_step(module, in_size)
        for axis in range(2):
            shift[axis] += scale[axis] * shifts[axis]
            scale[axis] *= steps[axis]
        size = out_size
    for axis in range(2):  # what the hooks did not see: an even, cell-centred split
        rest = size[axis] / grid[axis]
        if rest != 1:
            shift[axis] += scale[axis] * (rest - 1) / 2
            scale[axis] *= rest
    return TokenGeometry(
        (grid[0], grid[1]), (input_size[0], input_size[1]),
        (scale[1], scale[0]), (shift[1] + 0.5, shift[0] + 0.5),
    )
