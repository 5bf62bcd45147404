"""LSH banding: how many bands of how many rows for a threshold, and the 64-bit key of each band.

Two records whose MinHash signatures agree on all `r` rows of at least one of `b`
bands become a candidate pair. With Jaccard similarity `s`, one row agrees with
probability `s`, so the pair becomes a candidate with probability

    P(s) = 1 - (1 - s**r) ** b

an S-curve whose steepest point is near `(1/b) ** (1/r)`. `choose_bands` picks the
(b, r) with b * r <= num_perm that minimises the area of mistakes around the
threshold t: the false-positive area (integral of P over [0, t]) plus ten times
the false-negative area (integral of 1 - P over [t, 1]). Missed pairs weigh ten
times more because every candidate is verified against its signatures before
anything is removed: a false positive costs one comparison, a false negative a
kept duplicate. For t = 0.8 and 128 permutations that is 14 bands of 9 rows:
P(0.8) = 0.87, P(0.85) = 0.975, P(0.9) = 0.999, P(0.5) = 0.03.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

FALSE_NEGATIVE_WEIGHT = 10.0
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def candidate_probability(s: np.ndarray | float, bands: int, rows: int) -> np.ndarray | float:
    """P(s) = 1 - (1 - s^r)^b: the chance a pair of Jaccard similarity s shares a band."""
    return 1 - (1 - np.asarray(s, dtype=np.float64) ** rows) ** bands


def _trapezoid(y: np.ndarray, x: np.ndarray) -> float:
    """The trapezoidal rule, as numpy's `trapezoid` computes it: NumPy 1.x (pyproject's floor) names it
    `trapz`, 2.x `trapezoid` (and deprecates `trapz`), so neither name works on every supported NumPy."""
    return float((np.diff(x) * (y[1:] + y[:-1]) / 2.0).sum())


# choose_bands' answers for the usual thresholds, as `search_bands` finds them (~15 ms for 128 permutations,
# ~40 ms for 256, in the driver before any worker starts); tests/data/corpus_dedup/test_stages.py recomputes each
KNOWN_BANDS = {
    (0.5, 128): (32, 4), (0.55, 128): (29, 4), (0.6, 128): (25, 5), (0.65, 128): (22, 5), (0.7, 128): (21, 6),
    (0.75, 128): (18, 7), (0.8, 128): (14, 9), (0.85, 128): (11, 11), (0.9, 128): (8, 15), (0.95, 128): (5, 25),
    (0.5, 256): (43, 4), (0.55, 256): (51, 5), (0.6, 256): (42, 6), (0.65, 256): (36, 7), (0.7, 256): (32, 8),
    (0.75, 256): (28, 9), (0.8, 256): (23, 11), (0.85, 256): (18, 14), (0.9, 256): (13, 19), (0.95, 256): (8, 32),
}


def choose_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) for a threshold: least false-positive area + 10 x false-negative area (module docstring)."""
    known = KNOWN_BANDS.get((threshold, num_perm))
    return known if known is not None else search_bands(threshold, num_perm)


@lru_cache(maxsize=64)
def search_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """choose_bands' search over every (bands, rows) with bands x rows <= num_perm."""
    grid = np.linspace(0.0, 1.0, 2001)
    below, above = grid <= threshold, grid >= threshold
    best: tuple[float, int, int] | None = None
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            p = candidate_probability(grid, bands, rows)
            fp = _trapezoid(p[below], grid[below]) if below.sum() > 1 else 0.0
            fn = _trapezoid(1 - p[above], grid[above]) if above.sum() > 1 else 0.0
            cost = float(fp + FALSE_NEGATIVE_WEIGHT * fn)
            if best is None or cost < best[0] - 1e-12:
                best = (cost, bands, rows)
    assert best is not None
    return best[1], best[2]


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, vectorised: every input bit moves every output bit (uint64 in, uint64 out)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


_ROW_WEIGHTS = mix64(np.arange(1, 1025, dtype=np.uint64))  # one odd-ish multiplier per row of a band


def all_band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(bands, n) uint64: `band_keys` of every band at once (one pass over the signatures, not one per band)."""
    part = signatures[:, : bands * rows].reshape(len(signatures), bands, rows).astype(np.uint64)
    salts = mix64(np.arange(1, bands + 1, dtype=np.uint64))
    with np.errstate(over="ignore"):
        acc = (part * _ROW_WEIGHTS[:rows]).sum(axis=2, dtype=np.uint64)
        return mix64(acc.T ^ salts[:, None])


def band_keys(signatures: np.ndarray, band: int, rows: int) -> np.ndarray:
    """The 64-bit key of one band for every signature (n, num_perm uint32) -> (n,) uint64.

    Equal band rows give equal keys; a different band with the same values gives another key.
    """
    part = signatures[:, band * rows : (band + 1) * rows].astype(np.uint64)
    with np.errstate(over="ignore"):
        acc = (part * _ROW_WEIGHTS[:rows]).sum(axis=1, dtype=np.uint64)
        return mix64(acc ^ mix64(np.uint64(band + 1) * np.ones(1, np.uint64)))
