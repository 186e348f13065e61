"""ConceptOT's anchors kept at (or near) the training-free k-means anchors while a head
started from the backbone trains its projections' residual.

A ConceptOT head started from the backbone (:meth:`otviz.methods.conceptot.ConceptOT.
start_from_backbone`) begins with its anchors ``P`` at the k-means centroids of the
training-free configuration (ConceptOT App. G.1 initialises them at random instead). Left
free, Eq. 10's local loss moves them away and the plans stop pointing at the phrase's object
(docs/reproduced.md). Two tethers, chosen by :class:`otviz.train.config.TrainConfig`:

* held (``anchor_hold``): ``P`` is not trained at all, so after any number of steps it is
  bit-equal to ``P_0``, the anchors at the start;
* pulled (``anchor_pull = lambda_A > 0``): Eq. 10's objective gains
  ``R_A(P) = lambda_A ||P - P_0||_F^2`` on the anchor parameter (whose gradient is
  ``2 lambda_A (P - P_0)``), so the anchors move only as far as the local loss pays for.
"""

from __future__ import annotations

from torch import Tensor, nn

from otviz.errors import InputError
from otviz.methods.base import AlignmentMethod
from otviz.methods.start import BACKBONE
from otviz.train.config import TrainConfig


def tethered_anchors(method: AlignmentMethod, config: TrainConfig) -> nn.Parameter | None:
    """The anchor parameter ``P`` of ``method`` when ``config`` tethers it (``anchor_hold``
    or ``anchor_pull > 0``), else None.

    Raises:
        InputError: a tether asked for where it means nothing: a method without anchors, a
            head not started from the backbone (its anchors start random, not at the
            k-means anchors), or both tethers at once.
    """
    if not config.anchor_hold and config.anchor_pull == 0:
        return None
    knob = "--anchor-hold" if config.anchor_hold else "--anchor-pull"
    if config.anchor_hold and config.anchor_pull > 0:
        raise InputError("--anchor-hold keeps the anchors fixed, so --anchor-pull has nothing "
                         "to pull: give one of them")
    anchors = getattr(method, "anchors", None)
    if not isinstance(anchors, nn.Parameter):
        raise InputError(f"{knob} tethers concept anchors, and {config.method} has none "
                         "(only conceptot does)")
    if method.config.start != BACKBONE:
        raise InputError(f"{knob} keeps the anchors near the training-free k-means anchors, "
                         f"which only a head started from the backbone has (this one starts "
                         f"{method.config.start!r}): use --start backbone or auto")
    return anchors


def hold_anchors(method: AlignmentMethod, config: TrainConfig) -> None:
    """With ``config.anchor_hold``, take the anchors out of training (no gradient, so the
    optimiser never sees them and they stay bit-equal to their start)."""
    anchors = tethered_anchors(method, config)
    if anchors is not None and config.anchor_hold:
        anchors.requires_grad_(False)


class AnchorPull(nn.Module):
    """``R_A(P) = lambda_A ||P - P_0||_F^2`` (module docstring) with ``P_0`` the anchors
    given here, kept as a buffer (so it follows the objective's device and resume state)."""

    def __init__(self, weight: float, start: Tensor) -> None:
        super().__init__()
        self.weight = weight
        self.register_buffer("start", start.detach().clone())

    def forward(self, anchors: Tensor) -> Tensor:
        return self.weight * (anchors - self.start).pow(2).sum()


def anchor_pull(method: AlignmentMethod, config: TrainConfig) -> AnchorPull | None:
    """The pull of ``config.anchor_pull > 0`` toward ``method``'s anchors as they are now
    (call it at the start, before any step), else None."""
    anchors = tethered_anchors(method, config)
    if anchors is None or config.anchor_pull == 0:
        return None
    return AnchorPull(config.anchor_pull, anchors)
