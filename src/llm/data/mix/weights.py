"""Mixture weights: checked once, turned into integer quotas per period and a smooth, rotated slot table.

Each block of `period` schedule slots holds exactly `quota[s]` slots of source s
(largest-remainder rounding of its share). The period is about PERIOD, longer where a
small share needs it (up to MAX_PERIOD, see `period_for`), so a small but positive
weight is served in proportion instead of rounding to nothing; a share below
1 / MAX_PERIOD is refused with its value.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

PERIOD = 1000
MAX_PERIOD = 100_000  # the smallest share served is 1 / MAX_PERIOD; the slot table is O(period)


def _number(w: object) -> bool:
    """A finite number >= 0 (numpy numbers too; bools are not weights)."""
    if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real):
        return False
    return math.isfinite(float(w)) and float(w) >= 0


def check_weights(weights: object, n: int, key: str = "weights", *, sum_to_one: bool = False,
                  sizes: Sequence[int] | None = None, names: Sequence[str] | None = None) -> list[float]:
    """The one weights check of every mixture (shards, text, SFT, schedule points): shares summing to 1.

    `key` names the weights in every sentence (`weights`, `streaming_mixing_weights`,
    `schedule[2].weights`), an entry as `key[i]` with its dataset. `sum_to_one`: the given weights
    must already sum to 1 (within 1e-6). `sizes` (samples per dataset, a shard mixture): None weights
    are proportional to them, a positive weight needs samples, and a share below 1 / MAX_PERIOD is
    refused (the slot table could not serve it). One ValueError naming the key, index and value.
    """
    given = weights is not None
    if weights is None and sizes is not None:
        weights = [int(s) for s in sizes]
    if isinstance(weights, np.ndarray) and weights.ndim == 1:
        weights = weights.tolist()
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ValueError(f"{key} is {weights!r}; give a list of {n} numbers >= 0, one per dataset")
    if len(weights) != n:
        raise ValueError(f"{key} has {len(weights)} weight{'' if len(weights) == 1 else 's'} but there are {n} datasets; "
                         "give one weight per dataset")

    def dataset(i: int) -> str:
        return f"datasets[{i}], {names[i]}" if names else f"datasets[{i}]"

    for i, w in enumerate(weights):
        if not _number(w):
            raise ValueError(f"{key}[{i}] ({dataset(i)}) is {w!r}; expected a finite number >= 0 "
                             "(0 leaves that dataset out)")
        if sizes is not None and w > 0 and int(sizes[i]) == 0:
            raise ValueError(f"{key}[{i}] ({dataset(i)}) is {w!r} but that dataset has no samples; "
                             "give it weight 0 or leave it out")
    values = [float(w) for w in weights]
    top = max(values)
    if top <= 0:
        raise ValueError(f"{key} are all zero ({list(weights)}); give at least one dataset a positive weight")
    if sum_to_one and abs(math.fsum(values) - 1.0) > 1e-6:
        raise ValueError(f"{key} sum to {math.fsum(values):.9g} ({list(weights)}); weights must sum to 1 (within 1e-6)")
    scaled = [w / top for w in values]  # first to <= 1: 1e308 + 1e308 must not overflow
    shares = [w / sum(scaled) for w in scaled]
    if sizes is None:
        return shares
    for i, share in enumerate(shares):
        if values[i] > 0 and share < 1 / MAX_PERIOD:  # a share that underflows to 0 too
            what = f"{key}[{i}] ({dataset(i)}) is {weights[i]!r}, a share" if given else \
                f"datasets[{i}] ({names[i] if names else i}, {sizes[i]} samples) is a share"
            raise ValueError(
                f"{what} of {share:.3g} of the mixture, below the smallest one served "
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
