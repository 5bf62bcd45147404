"""Mixture weights: checked once, turned into integer quotas per period and a smooth, rotated slot table.

Each block of `period` schedule slots holds exactly `quota[s]` slots of source s
(largest-remainder rounding of its share). The period is about PERIOD, longer where a
small share needs it (up to MAX_PERIOD, see `period_for`), so a small but positive
weight is served in proportion instead of rounding to nothing; a share below
1 / MAX_PERIOD is refused with its value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

PERIOD = 1000
MAX_PERIOD = 100_000  # the smallest share served is 1 / MAX_PERIOD; the slot table is O(period)


def check_weights(weights: object, sizes: Sequence[int], names: Sequence[str]) -> list[float]:
    """Shares summing to 1 (None: proportional to `sizes`), or one ValueError naming the weight or source."""
    n = len(sizes)
    given = weights is not None
    if weights is None:
        weights = [int(s) for s in sizes]
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ValueError(f"weights must be a list of {n} numbers >= 0, one per dataset, got {weights!r}")
    if len(weights) != n:
        raise ValueError(f"weights has {len(weights)} entries but there are {n} datasets; give one weight per dataset")
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"weights[{i}] is {w!r}, expected a finite number >= 0 (0 leaves {names[i]} out)")
        if w > 0 and int(sizes[i]) == 0:
            raise ValueError(f"datasets[{i}] ({names[i]}) has no samples but weights[{i}] is {w!r}; "
                             "give it weight 0 or leave it out")
    top = max(float(w) for w in weights)
    if top <= 0:
        raise ValueError(f"weights are all zero ({list(weights)}); give at least one dataset a positive weight")
    scaled = [float(w) / top for w in weights]  # first to <= 1: 1e308 + 1e308 must not overflow
    shares = [w / sum(scaled) for w in scaled]
    for i, share in enumerate(shares):
        if weights[i] > 0 and share < 1 / MAX_PERIOD:  # a share that underflows to 0 too
            what = f"weights[{i}] ({weights[i]!r})" if given else f"datasets[{i}] ({names[i]}, {sizes[i]} samples)"
            raise ValueError(
                f"{what} is a share of {share:.3g} of the mixture, below the smallest one served "
                f"(1/{MAX_PERIOD}); raise it or give it weight 0"
            )
    return shares


def period_for(shares: Sequence[float]) -> int:
    """The period in slots: exact when the shares are fractions of a small denominator, else fine enough.

    Shares that are fractions with a common denominator D <= MAX_PERIOD (0.9996 and 0.0004: D = 2500;
    sizes 23125 and 2: D = 23127) get a multiple of D near PERIOD, so every quota is exact. Others get
    the smallest multiple of PERIOD (up to MAX_PERIOD) in which the smallest share has 100 slots, so
    its rounding stays within 1% where the cap allows, and at least one slot always (check_weights).
    """
    positive = [s for s in shares if s > 0]
    common = 1
    for s in positive:
        common = math.lcm(common, Fraction(s).limit_denominator(MAX_PERIOD).denominator)
        if common > MAX_PERIOD:
            break
    else:
        return common * max(1, math.ceil(PERIOD / common))
    return min(MAX_PERIOD, PERIOD * max(1, math.ceil(100 / (min(positive) * PERIOD))))


def quotas(weights: Sequence[float], period: int = PERIOD, floor: bool = False) -> list[int]:
    """Integer slots per period for each weight (largest remainder), summing to `period`.

    `floor=True` gives every positive weight at least one slot, taken from the largest quota
    (only float rounding at the edge of `period_for` needs it).
    """
    exact = [w * period for w in weights]
    base = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: (base[i] - exact[i], i))[: period - sum(base)]:
        base[i] += 1
    for i, w in enumerate(weights):
        if floor and w > 0 and base[i] == 0:
            base[i] = 1
            base[max(range(len(base)), key=lambda j: base[j])] -= 1
    return base


def slot_table(quota: list[int], rotation: int, period: int = PERIOD) -> np.ndarray:
    """Source of each slot of a period: smooth weighted round robin, rotated by `rotation`."""
    slots = np.empty(period, dtype=np.int64)
    credit = [0] * len(quota)
    for k in range(period):
        for i, q in enumerate(quota):
            credit[i] += q
        pick = max(range(len(quota)), key=lambda i: (credit[i], -i))
        credit[pick] -= period
        slots[k] = pick
    return np.roll(slots, rotation % period)
