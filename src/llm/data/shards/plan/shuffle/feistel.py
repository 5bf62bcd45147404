"""A global shuffle in O(1) memory: a keyed Feistel bijection on [0, n) with cycle walking.

Trade-off: any position maps to its sample in a few vectorised integer operations,
so resuming at position p costs nothing and no permutation array is ever built
(a Python list or `np.random.permutation` needs 8 bytes per sample and O(n) time
per epoch). The price is locality: consecutive positions land on unrelated
samples, which is what a global shuffle means and is cheap on memory-mapped local
shards; for remote data a windowed shuffle over shards keeps the cache small.
"""

from __future__ import annotations

import hashlib

import numpy as np

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a cheap, well-distributed 64-bit hash (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class FeistelPermutation:
    """position -> sample id, a bijection of [0, n) fixed by the seed."""

    def __init__(self, n: int, seed: int):
        self.n = int(n)
        bits = max(2, int(self.n - 1).bit_length())
        bits += bits % 2  # balanced halves
        self.half = np.uint64(bits // 2)
        self.mask = np.uint64((1 << (bits // 2)) - 1)
        digest = hashlib.sha256(f"feistel:{seed}".encode()).digest()
        self.keys = [np.uint64(int.from_bytes(digest[4 * r : 4 * r + 8], "little")) for r in range(_ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        with np.errstate(over="ignore"):
            for key in self.keys:
                left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << self.half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        x = np.asarray(positions, dtype=np.uint64)
        if x.size and int(x.max()) >= self.n:
            raise IndexError(f"position {int(x.max())} out of range for {self.n} samples")
        y = self._encrypt(x)
        # Cycle walking: the domain is at most 4n, so a few rounds map everything into [0, n).
        outside = np.flatnonzero(y >= self.n)
        while outside.size:
            y[outside] = self._encrypt(y[outside])
            outside = outside[y[outside] >= self.n]
        return y.astype(np.int64)
