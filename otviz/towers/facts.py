"""What an image-tower family tells the explainers and the trust metrics about itself, as
plain data and callables (no explainer object: :mod:`otviz.towers` sits below them).

* :class:`CamTarget`: the module whose output Grad-CAM reads, and how that output becomes a
  ``[B, C, h, w]`` map (:meth:`otviz.towers.base.ImageTower.cam_target`);
* :class:`AttentionReader`: the tower's forward with every block's softmax attention written
  out as a tensor of the graph, the tower's own readout of a layer's tokens, and the row of a
  token-to-token matrix the pooled output reads
  (:meth:`~otviz.towers.base.ImageTower.attention_reader`; used by LeGrad and Chefer
  relevance);
* the blocks a randomisation check resets, bottom first
  (:meth:`~otviz.towers.base.ImageTower.randomisation_blocks`).

A family without one of them raises :class:`FamilyUnsupportedError` with the reason; the
caller names itself in front of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from otviz.errors import UserInputError

Reshape = Callable[[Tensor], Tensor]


class FamilyUnsupportedError(UserInputError, ValueError):
    """The tower family does not give this fact (the message says why)."""


@dataclass(frozen=True)
class CamTarget:
    """A Grad-CAM target: the module whose output is the activation map, and how to turn that
    output into ``[B, C, h, w]`` (``None``: it already is a conv map)."""

    layer: nn.Module
    reshape: Reshape | None


def tokens_to_map(grid: tuple[int, int]) -> Reshape:
    """``[B, T, C]`` tokens (prefix tokens first, then the ``grid`` row-major) ->
    ``[B, C, h, w]``, the prefix (class / register tokens) dropped."""
    h, w = grid

    def reshape(tokens: Tensor) -> Tensor:
        patches = tokens[:, tokens.shape[1] - h * w :]
        return patches.reshape(tokens.shape[0], h, w, -1).permute(0, 3, 1, 2)

    return reshape


@dataclass
class AttentionTrace:
    """A forward of the tower with its attention written out.

    tokens: the first block's input, then each block's output (``L + 1`` tensors
        ``[B, T, D]``; the patches are the last ``h * w`` tokens, prefix tokens first).
    maps: each block's softmax attention (``L`` tensors ``[B, heads, T, T]``).
    """

    tokens: list[Tensor]
    maps: list[Tensor]


class AttentionReader(ABC):
    """What the attention explainers read of one transformer tower: re-run from the model's
    current weights at every call (no hook, no copy, no state changed on the shared model)."""

    @property
    @abstractmethod
    def grid(self) -> tuple[int, int]:
        """``(h, w)`` the tower's patch grid."""

    @abstractmethod
    def trace(self, pixels: Tensor) -> AttentionTrace:
        """The tower's forward on ``pixels`` with every block's tokens and attention map, in
        the graph (the caller enables gradients and makes ``pixels`` a leaf)."""

    @abstractmethod
    def readout(self, tokens: Tensor) -> Tensor:
        """``[B, E]`` the tower's pooled, projected embedding of one layer's ``tokens``."""

    @abstractmethod
    def pooled_row(self, tokens: Tensor, matrix: Tensor) -> Tensor:
        """``[B, T]`` the row of a token-to-token ``matrix`` ``[B, T, T]`` that the pooled
        output reads, for the last layer's ``tokens``."""

    def layer_readout(self, tokens: Tensor) -> Tensor:
        """``[B, E]`` LeGrad's reading of an intermediate layer's ``tokens`` as an image
        embedding: the tower's own :meth:`readout` unless the family says otherwise."""
        return self.readout(tokens)
