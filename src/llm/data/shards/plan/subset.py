"""Subsets of a dataset's samples (`subsample`, `train_test_split`) as pure functions: view id -> sample id.

A subset is chosen shard by shard, so it keeps the dataset's shard locality (a windowed
shuffle and a remote cache work on it as on the whole dataset) and costs O(shards)
memory, never O(samples):

* each shard's samples are put in a seeded order: a keyed Feistel bijection per shard
  (the same construction as `shuffle/feistel.py`, vectorised over shards of any size);
* a part (the subsample, or one split) takes a contiguous range of ranks of that order
  in every shard: `allocate` spreads the part's total over the shards in proportion to
  their sizes, each part taking its share of what the parts before it left, so parts
  are disjoint and, when the fractions sum to 1, complete;
* view shard v of a subset is (parent shard, first rank, count); view id j lies in the
  view shard whose range holds it, and maps to `parent_starts[shard] + perm(rank)`.

Totals are exact: a fraction f of n samples is floor(f * n) samples, with f read as the
decimal it was written as (0.29 is 29/100, not the float just below it). Splits use
largest-remainder rounding (below). Upsampling (f > 1) repeats every shard floor(f)
times in storage order, then adds the fractional part as above.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from llm.data.shards.plan.shuffle.feistel import _mix

_ROUNDS = 6
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SUM_TOLERANCE = 1e-9  # splits summing to 1 within this are taken as summing to exactly 1


def as_fraction(value: float) -> Fraction:
    """The decimal a user wrote (0.1 -> 1/10): counts do not depend on binary rounding."""
    return Fraction(repr(float(value)))


def check_subsample(value: object) -> float:
    """`subsample` as a float > 0 (a fraction of the samples, or > 1 to repeat them), else one ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"subsample must be a number > 0 (a fraction of the samples, e.g. 0.1, or > 1 to repeat them, "
            f"e.g. 2.5), got {value!r}"
        )
    return float(value)


def part_totals(n: int, fractions: Sequence[float]) -> list[int]:
    """Samples per part: floor(f * n) each, then the remainder (floor(sum * n) minus those floors,
    fewer than the number of parts) one each to the parts with the largest fractional parts (ties:
    the earlier part). Fractions summing to 1 (within SUM_TOLERANCE) cover all n samples."""
    fracs = [as_fraction(f) for f in fractions]
    total_fraction = sum(fracs, Fraction(0))
    if abs(total_fraction - 1) <= SUM_TOLERANCE:
        fracs = [f / total_fraction for f in fracs] if total_fraction else fracs
        total = n
    else:
        total = math.floor(total_fraction * n)
    exact = [f * n for f in fracs]
    base = [math.floor(e) for e in exact]
    order = sorted(range(len(exact)), key=lambda i: (base[i] - exact[i], i))
    for i in order[: total - sum(base)]:
        base[i] += 1
    return base


def allocate(sizes: Sequence[int] | np.ndarray, totals: Sequence[int]) -> np.ndarray:
    """(shards, parts) counts: part j takes totals[j] samples, spread over the shards in proportion
    to what the parts before it left in each (cumulative floors), so a shard never gives more than
    it holds and every part's total is exact."""
    left = np.array([int(s) for s in sizes], dtype=object)  # Python ints: products never overflow
    out = np.zeros((len(left), len(totals)), dtype=np.int64)
    remaining = int(sum(left))
    if sum(totals) > remaining:
        raise ValueError(f"parts of {list(totals)} samples do not fit in {remaining}")
    for j, total in enumerate(totals):
        if total == 0:
            continue
        cumulative = np.concatenate([np.array([0], dtype=object), np.cumsum(left)])
        take = np.diff(cumulative * int(total) // remaining)
        out[:, j] = take.astype(np.int64)
        left = left - take
        remaining -= int(total)
    return out


class SampleView:
    """view id -> parent id: view shard v holds ranks [lo[v], lo[v] + count[v]) of parent shard
    shard[v], in that shard's seeded order (`permuted[v]`) or in storage order."""

    def __init__(self, parent_starts: np.ndarray, shard: np.ndarray, lo: np.ndarray, count: np.ndarray,
                 permuted: np.ndarray, key: str):
        self.parent_starts = np.asarray(parent_starts, dtype=np.int64)
        self.sizes = np.diff(self.parent_starts)
        self.shard = np.asarray(shard, dtype=np.int64)
        self.lo = np.asarray(lo, dtype=np.int64)
        self.permuted = np.asarray(permuted, dtype=bool)
        self.starts = np.concatenate([[0], np.cumsum(np.asarray(count, dtype=np.int64))]).astype(np.int64)
        self.num_samples = int(self.starts[-1])
        # One keyed Feistel network per parent shard: balanced halves wide enough for its size.
        bits = np.array([max(2, max(int(s) - 1, 1).bit_length()) for s in self.sizes], dtype=np.uint64)
        bits += bits % np.uint64(2)
        self.half = bits // np.uint64(2)
        self.mask = (np.uint64(1) << self.half) - np.uint64(1)
        shards = np.arange(len(self.sizes), dtype=np.uint64)
        digest = hashlib.sha256(f"subset:{key}".encode()).digest()
        with np.errstate(over="ignore"):
            self.keys = np.stack([
                _mix(np.uint64(int.from_bytes(digest[4 * r : 4 * r + 8], "little")) ^ (shards * _GOLDEN))
                for r in range(_ROUNDS)
            ]) if len(shards) else np.zeros((_ROUNDS, 0), dtype=np.uint64)

    def _encrypt(self, x: np.ndarray, shard: np.ndarray) -> np.ndarray:
        half, mask = self.half[shard], self.mask[shard]
        left, right = x >> half, x & mask
        with np.errstate(over="ignore"):
            for r in range(_ROUNDS):
                left, right = right, left ^ (_mix(right ^ self.keys[r][shard]) & mask)
        return (left << half) | right

    def permute(self, shard: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Rank -> position inside the shard: a bijection of [0, size) per shard (cycle walking)."""
        y = self._encrypt(rank.astype(np.uint64), shard)
        n = self.sizes[shard].astype(np.uint64)
        outside = np.flatnonzero(y >= n)
        while outside.size:
            y[outside] = self._encrypt(y[outside], shard[outside])
            outside = outside[y[outside] >= n[outside]]
        return y.astype(np.int64)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.num_samples):
            raise IndexError(f"sample ids outside [0, {self.num_samples})")
        v = np.searchsorted(self.starts, ids, side="right") - 1
        rank = self.lo[v] + (ids - self.starts[v])
        shard = self.shard[v]
        mixed = self.permuted[v]
        if mixed.any():
            rank[mixed] = self.permute(shard[mixed], rank[mixed])
        return self.parent_starts[shard] + rank


class ComposedView:
    """A view of a view: `outer` ids -> `inner` ids -> the dataset's own sample ids."""

    def __init__(self, outer: SampleView, inner: Callable[[np.ndarray], np.ndarray]):
        self.outer, self.inner = outer, inner
        self.starts, self.num_samples = outer.starts, outer.num_samples

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        return self.inner(self.outer(ids))


def subsample_view(parent_starts: np.ndarray, fraction: float, key: str) -> SampleView | None:
    """floor(fraction * n) samples: every shard floor(fraction) times, then a seeded share of each."""
    f = as_fraction(fraction)
    if f == 1:
        return None
    sizes = np.diff(np.asarray(parent_starts, dtype=np.int64))
    copies = math.floor(f)
    extra = math.floor((f - copies) * int(sizes.sum()))
    counts = allocate(sizes, [extra])[:, 0]
    shards = np.arange(len(sizes), dtype=np.int64)
    return SampleView(
        parent_starts, np.tile(shards, copies + 1), np.zeros(len(sizes) * (copies + 1), dtype=np.int64),
        np.concatenate([np.tile(sizes, copies), counts]),
        np.concatenate([np.zeros(len(sizes) * copies, dtype=bool), np.ones(len(sizes), dtype=bool)]), key,
    )


def split_views(parent_starts: np.ndarray, fractions: Sequence[float], key: str) -> list[SampleView]:
    """Disjoint views of part_totals(n, fractions) samples; together all n when the fractions sum to 1."""
    sizes = np.diff(np.asarray(parent_starts, dtype=np.int64))
    counts = allocate(sizes, part_totals(int(sizes.sum()), fractions))
    firsts = np.cumsum(counts, axis=1) - counts  # each part starts where the parts before it end
    shards = np.arange(len(sizes), dtype=np.int64)
    permuted = np.ones(len(sizes), dtype=bool)
    return [SampleView(parent_starts, shards, firsts[:, j], counts[:, j], permuted, key) for j in range(counts.shape[1])]
