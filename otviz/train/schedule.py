"""Learning-rate schedule: linear warm-up, then cosine decay to zero (ConceptOT Table 6:
"Cosine decay", "Warmup 5% of total steps")."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def warmup_steps(total_steps: int, warmup_frac: float) -> int:
    """Number of warm-up steps: ``round(warmup_frac * total_steps)``."""
    if not 0.0 <= warmup_frac < 1.0:
        raise ValueError(f"warmup_frac must be in [0, 1), got {warmup_frac}")
    return int(round(warmup_frac * total_steps))


def lr_factor(step: int, total_steps: int, n_warmup: int) -> float:
    """Multiplier of the base learning rate for optimiser step ``step`` (0-based):
    ``(step + 1) / n_warmup`` during warm-up, then ``(1 + cos(pi t)) / 2`` with ``t`` going
    from 0 to 1 over the remaining steps (the last step has a small positive rate)."""
    if step < n_warmup:
        return (step + 1) / n_warmup
    decay = max(total_steps - n_warmup, 1)
    t = min((step - n_warmup) / decay, 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * t))


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_frac: float
) -> LambdaLR:
    """A :class:`LambdaLR` following :func:`lr_factor`. Its state is plain numbers
    (``last_epoch``, ...), so it is saved as JSON; the function itself is rebuilt from the
    config on resume."""
    n_warmup = warmup_steps(total_steps, warmup_frac)
    return LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, n_warmup))
