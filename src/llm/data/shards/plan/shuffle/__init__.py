"""Seeded permutations of sample ids, one algorithm per file, chosen by name."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from llm.data.shards.plan.shuffle.feistel import FeistelPermutation
from llm.data.shards.plan.shuffle.identity import IdentityPermutation
from llm.data.shards.plan.shuffle.windowed import WindowedPermutation

Permutation = Callable[[np.ndarray], np.ndarray]

SHUFFLES: dict[str, Callable[[int, int], Permutation]] = {
    "none": IdentityPermutation,
    "feistel": FeistelPermutation,
}


def make_permutation(name: str, n: int, seed: int) -> Permutation:
    """A bijection of [0, n) fixed by `seed`, by algorithm name."""
    try:
        return SHUFFLES[name](n, seed)
    except KeyError:
        raise ValueError(f"unknown shuffle {name!r}; valid names: {', '.join(sorted(SHUFFLES))}") from None


def make_windowed(sample_starts: np.ndarray, window: int, seed: int, algorithm: str = "feistel",
                  straddles: np.ndarray | None = None) -> WindowedPermutation:
    """Shards in a seeded order, samples shuffled within windows of `window` shards (see windowed.py);
    `straddles` (order version 2) moves each two-shard block to the later of its shards' windows."""
    make_permutation(algorithm, 0, seed)  # an unknown name fails here, naming the valid ones
    return WindowedPermutation(sample_starts, window, seed, make_permutation, algorithm, straddles)
