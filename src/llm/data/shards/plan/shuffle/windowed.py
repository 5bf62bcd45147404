"""A windowed shuffle: shards in a seeded order, samples shuffled only within windows of W shards of it.

Trade-off: a global shuffle (feistel.py) lets consecutive positions land in any
shard, so a reader whose shards come from object storage through a cache smaller
than the dataset keeps fetching (and evicting) shards all epoch long. Here the
shards are put in a seeded order, cut into windows of W consecutive shards of that
order, and the samples of one window are shuffled among themselves: the positions
of a window's span read only that window's shards, so the working set is W shards
and each shard is fetched about once per epoch. The price is mixing: two samples
from different windows are never interleaved, so W should be as large as the
cache allows. Like the global shuffle it is a pure function of (sample layout,
seed, window): position -> sample is a few vectorised operations, with O(shards)
state per epoch (the shard order and its prefix sums), never O(samples).

Which shard a sample belongs to: the shard holding its first item (for token
blocks, the block's first token), so shard k owns samples
[`sample_starts[k]`, `sample_starts[k+1]`). A token block may straddle into the
following shards in storage order (`spill`); those are the only shards outside
the window that a window's span reads.

Straddling blocks (order version 2, `straddles` given): a block whose tokens lie in
two shards k and k+1 is read in the window of whichever of the two comes *later*
in the epoch's shard order. Read in the earlier window (version 1), it made the
cache fetch the other shard whole for one block, long before that shard's own
window, which then fetched it again: about two GETs per shard per epoch. Read in
the later window, one shard is the window's own and the other was read in an
earlier window, whose edge bytes the reader kept (read/edges.py): one GET per
shard. Ownership stays contiguous (a shard gives away at most its last block and
gains at most its predecessor's), so the order is still O(shards) per epoch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from llm.data.shards.arrays import distinct

_Factory = Callable[[str, int, int], Callable[[np.ndarray], np.ndarray]]


def _derive(seed: int, label: str) -> int:
    """A 63-bit seed for one part of the order (the shard order, window w), from the epoch's seed."""
    return int.from_bytes(hashlib.sha256(f"windowed:{seed}:{label}".encode()).digest()[:8], "little") >> 1


def shard_sample_starts(item_starts: np.ndarray, block_size: int | None, num_samples: int) -> np.ndarray:
    """First sample of each shard (length shards + 1, ending at num_samples).

    `item_starts` are the shards' first token (token datasets, `block_size` given) or first
    item (item datasets) in the concatenation of all shards. Block i starts at token
    i * block_size, so shard k owns the blocks that start inside it: ceil(start_k / B) onwards.
    """
    starts = np.asarray(item_starts, dtype=np.int64)
    if block_size is not None:
        starts = -(-starts // int(block_size))
    return np.minimum(starts, num_samples)


def straddling_blocks(item_starts: np.ndarray, block_size: int, num_samples: int) -> np.ndarray:
    """Per storage boundary k | k+1 (length shards - 1): whether shard k's last block lies in shards k and k+1
    only (it starts in k, ends in k+1, and is a sample). Those are the blocks an order of version 2 may move."""
    tok = np.asarray(item_starts, dtype=np.int64)
    if len(tok) < 3:
        return np.zeros(max(len(tok) - 2, 0), dtype=bool)
    b, inner = int(block_size), tok[1:-1]
    head = -(-inner // b)  # first block starting in shard k+1; block head - 1 is shard k's last
    end = np.minimum(head * b, int(tok[-1]))
    return (head <= num_samples) & (inner % b != 0) & ((head - 1) * b >= tok[:-2]) & (end > inner) & (end <= tok[2:])


class WindowedPermutation:
    """position -> sample id: a bijection of [0, n) fixed by (sample_starts, window, seed, straddles)."""

    def __init__(self, sample_starts: np.ndarray, window: int, seed: int, make: _Factory, algorithm: str = "feistel",
                 straddles: np.ndarray | None = None):
        self.sample_starts = np.asarray(sample_starts, dtype=np.int64)
        self.n = int(self.sample_starts[-1])
        shards = len(self.sample_starts) - 1
        self.window, self.seed, self.algorithm, self._make = int(window), seed, algorithm, make
        # The shard order of this epoch, and where each shard's samples start in it.
        self.shard_order = make(algorithm, shards, _derive(seed, "shards"))(np.arange(shards, dtype=np.int64))
        self.owned = self.sample_starts  # shard k reads samples [owned[k], owned[k+1]) in its window
        if straddles is not None and shards > 1:
            rank = np.empty(shards, dtype=np.int64)
            rank[self.shard_order] = np.arange(shards, dtype=np.int64)
            later = np.asarray(straddles, dtype=bool) & (rank[1:] > rank[:-1])  # shard k+1's window comes later
            self.owned = self.sample_starts.copy()
            self.owned[1:-1] -= later  # shard k's last block moves to shard k+1
        sizes = np.diff(self.owned)[self.shard_order]
        self.order_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        bounds = np.minimum(np.arange(-(-shards // self.window) + 1) * self.window, shards)
        self.window_starts = self.order_starts[bounds]  # window w: positions [window_starts[w], window_starts[w+1])
        self._perms: dict[int, Callable[[np.ndarray], np.ndarray]] = {}

    @property
    def num_windows(self) -> int:
        return len(self.window_starts) - 1

    def window_shards(self, w: int) -> np.ndarray:
        """The shards (storage indices) of window w."""
        return self.shard_order[w * self.window : (w + 1) * self.window]

    def _within(self, w: int) -> Callable[[np.ndarray], np.ndarray]:
        perm = self._perms.get(w)
        if perm is None:
            size = int(self.window_starts[w + 1] - self.window_starts[w])
            perm = self._perms[w] = self._make(self.algorithm, size, _derive(self.seed, f"window-{w}"))
        return perm

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        p = np.asarray(positions, dtype=np.int64)
        if p.size and (int(p.min()) < 0 or int(p.max()) >= self.n):
            raise IndexError(f"positions outside [0, {self.n})")
        window = np.searchsorted(self.window_starts, p, side="right") - 1
        mixed = np.empty_like(p)
        for w in distinct(window):
            at = np.flatnonzero(window == w)
            lo = self.window_starts[w]
            mixed[at] = lo + self._within(w)(p[at] - lo)
        # `mixed` is a position of the shard order again (within the same window): to its shard.
        slot = np.searchsorted(self.order_starts, mixed, side="right") - 1
        shard = self.shard_order[slot]
        return self.owned[shard] + (mixed - self.order_starts[slot])
