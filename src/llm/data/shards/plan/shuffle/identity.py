"""The identity permutation: samples in storage order (shuffle=False)."""

from __future__ import annotations

import numpy as np


class IdentityPermutation:
    def __init__(self, n: int, seed: int = 0):
        self.n = n

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64)
