"""The global order as pure functions: (fingerprint, seed, epoch) -> which sample each rank reads when.

Position p of an epoch is sample `permutation(derive_seed(seed, "shuffle", epoch))(p)`: global, or windowed
over shards (`shuffle/windowed.py`) so that a remote reader's working set fits its
cache. Global batch k after a resume point `start` covers positions
[start + k*G, start + (k+1)*G) with G = batch_size * world_size; rank r reads its
`batch_size` slice of it, and DataLoader worker w serves the chunks of batches c with
c % num_workers == w.
Nothing here depends on what was read before, so a resume is O(1) and exact on
any topology.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llm.data.seeds import derive_seed
from llm.data.shards.plan.shuffle import make_permutation, make_windowed


def epoch_order(
    num_samples: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    algorithm: str = "feistel",
    window: int | None = None,
    sample_starts: np.ndarray | None = None,
    component: str = "shuffle",
    legacy: bool = False,
    straddles: np.ndarray | None = None,
) -> Callable[[np.ndarray], np.ndarray]:
    """position -> sample id for one epoch, shuffled by `derive_seed(seed, component, epoch)`.

    `legacy=True` keys the shuffle by `seed + epoch` as loader states of version 1 did (so
    (42, epoch 1) was (43, epoch 0)); it exists only to resume such a state exactly.

    `window=None`: a global shuffle over all samples. `window=W`: shards in a seeded order,
    samples shuffled within each window of W shards of it; `sample_starts` (first sample of
    each shard, then num_samples) says which samples each shard owns (shuffle/windowed.py).
    `straddles` (per storage boundary, `straddling_blocks`): a windowed order of version 2, which reads
    each two-shard block in the later of its shards' windows; None: version 1, in the earlier shard's.
    """
    stream = seed + epoch if legacy else derive_seed(seed, component, epoch)
    if shuffle and window is not None:
        if sample_starts is None or int(sample_starts[-1]) != num_samples:
            raise ValueError("a windowed shuffle needs sample_starts ending at num_samples")
        return make_windowed(sample_starts, window, stream, algorithm, straddles)
    if not shuffle:
        return make_permutation("none", num_samples, stream)
    return SegmentedOrder(make_permutation(algorithm, num_samples, stream), num_samples)


class SegmentedOrder:
    """A permutation whose values are computed for aligned segments of positions and kept (a few).

    A chunk asks for a few hundred consecutive positions, where the keyed permutation's
    fixed cost per call (rounds of small vectorised operations, cycle walking) dominates;
    one call over a segment of 8,192 positions serves 16 or more chunks. The values are
    the permutation's own: a cache, not another order. Scattered positions bypass it.
    """

    SEGMENT = 1 << 13
    KEEP = 8  # segments held: 512 KB

    def __init__(self, permutation: Callable[[np.ndarray], np.ndarray], n: int):
        self.permutation, self.n = permutation, n
        self._segments: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # reader threads share one order

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        p = np.asarray(positions, dtype=np.int64)
        if p.size == 0:
            return self.permutation(p)
        lo, hi = int(p.min()), int(p.max())
        first, last = lo // self.SEGMENT, hi // self.SEGMENT
        if lo < 0 or hi >= self.n or last - first >= 4:
            return self.permutation(p)  # out of range (its own error) or scattered
        parts = [self._segment(k) for k in range(first, last + 1)]
        table = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return table[p - first * self.SEGMENT]

    def _segment(self, k: int) -> np.ndarray:
        with self._lock:
            segment = self._segments.get(k)
            if segment is not None:
                self._segments.move_to_end(k)
                return segment
        segment = self.permutation(np.arange(k * self.SEGMENT, min((k + 1) * self.SEGMENT, self.n), dtype=np.int64))
        with self._lock:
            self._segments[k] = segment
            while len(self._segments) > self.KEEP:
                self._segments.popitem(last=False)
        return segment


@dataclass(frozen=True)
class BatchSchedule:
    """Which epoch positions rank `rank` reads in each of its batches, from `start` to the epoch end."""

    total: int  # samples in the epoch
    start: int  # positions already consumed (global)
    batch_size: int  # per rank
    rank: int = 0
    world_size: int = 1
    drop_short_batch: bool = False

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    @property
    def end(self) -> int:
        """Last position (exclusive) this epoch delivers; drop_short_batch drops a short final global batch."""
        if not self.drop_short_batch:
            return self.total
        return self.start + (self.total - self.start) // self.global_batch * self.global_batch

    def __len__(self) -> int:
        return max(0, math.ceil((self.end - self.start) / self.global_batch))

    def consumed_after(self, batches: int) -> int:
        """Global positions consumed once every rank has taken `batches` batches."""
        return min(self.start + batches * self.global_batch, self.end)

    def pads(self, k: int) -> bool:
        """Whether this rank's batch k only repeats an early sample (`positions`: a short final global batch
        of fewer samples than ranks): a row read to keep the ranks in step, not one of the epoch's samples."""
        lo = self.start + k * self.global_batch
        return min(lo + self.global_batch, self.end) - lo < self.world_size and \
            self.rank >= min(lo + self.global_batch, self.end) - lo

    def positions(self, k: int) -> np.ndarray:
        """Epoch positions of this rank's batch k.

        A short final global batch of R samples is split as evenly as possible; if
        R < world_size, ranks left without a sample repeat one of the epoch's first
        samples so that every rank steps the same number of times.
        """
        lo = self.start + k * self.global_batch
        hi = min(lo + self.global_batch, self.end)
        if hi - lo == self.global_batch:
            first = lo + self.rank * self.batch_size
            return np.arange(first, first + self.batch_size, dtype=np.int64)
        size = hi - lo
        base, extra = divmod(size, self.world_size)
        first = lo + self.rank * base + min(self.rank, extra)
        count = base + (self.rank < extra)
        if count == 0:
            return np.array([(self.rank - size) % self.total], dtype=np.int64)
        return np.arange(first, first + count, dtype=np.int64)
