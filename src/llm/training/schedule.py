"""The learning-rate schedule: linear warmup, then cosine decay, restartable for extended runs."""

from __future__ import annotations

import math


class WarmupCosine:
    """LR factor: linear warmup, then cosine from 1 down to `min_ratio` at `total` steps.

    `cycle_start` lets a finished run be extended with a fresh cycle. An object rather
    than a lambda so that LambdaLR's state_dict carries these numbers into checkpoints.
    """

    def __init__(self, warmup: int, total: int, min_ratio: float, cycle_start: int = 0):
        self.warmup = warmup
        self.total = total
        self.min_ratio = min_ratio
        self.cycle_start = cycle_start

    def __call__(self, step: int) -> float:
        s = step - self.cycle_start
        if s < self.warmup:
            return (s + 1) / self.warmup  # never 0: the first step already learns
        span = max(1, self.total - self.cycle_start - self.warmup)
        progress = min(1.0, (s - self.warmup) / span)
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
