"""The optimizer and learning-rate schedule: AdamW, linear warmup then cosine decay, restartable."""

from __future__ import annotations

import math

import torch


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW (betas 0.9/0.95) that decays matrices only."""
    # Decaying biases and norms' scales towards 0 hurts and helps nothing.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


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
