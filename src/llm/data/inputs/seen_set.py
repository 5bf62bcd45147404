"""The in-memory seen-set of deduplication: 16-byte digests in a numpy open-addressing table.

Memory per seen record is a fixed 16-byte digest (about 32 bytes a record at the
maximum load factor of 1/2), so tens of millions of records fit in a few hundred
MB. Records are probed a chunk at a time (vectorised), not one Python lookup each.
"""

from __future__ import annotations

import numpy as np

from llm.data.inputs.seen_file import DIGEST_BYTES


def _pairs(digests: bytes | np.ndarray, width: int = DIGEST_BYTES) -> np.ndarray:
    """Digests (concatenated `width`-byte digests or an (n, 2) array) as an (n, 2) uint64 array of their first 16 bytes."""
    if isinstance(digests, np.ndarray):
        return digests.reshape(-1, 2).astype(np.uint64, copy=False)
    if width != DIGEST_BYTES:
        rows = np.frombuffer(digests, dtype=np.uint8).reshape(-1, width)[:, :DIGEST_BYTES]
        return np.ascontiguousarray(rows).view("<u8").reshape(-1, 2)
    return np.frombuffer(digests, dtype="<u8").reshape(-1, 2)


class SeenSet:
    """A set of 16-byte digests in two numpy uint64 arrays (open addressing, linear probing)."""

    def __init__(self, capacity: int = 1 << 12):
        size = 1 << max(4, (2 * capacity - 1).bit_length())
        self._hi = np.zeros(size, dtype=np.uint64)
        self._lo = np.zeros(size, dtype=np.uint64)
        self._zero_hi: set[int] = set()  # hi == 0 marks an empty slot: such digests live aside
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __contains__(self, digest: bytes) -> bool:
        return bool(self.contains_many(_pairs(digest))[0])

    def add(self, digest: bytes) -> bool:
        """Add one digest; True when it was new."""
        pairs = _pairs(digest)
        if self.contains_many(pairs)[0]:
            return False
        self.insert_new(pairs)  # one digest, just found absent: update() would check both again
        return True

    def contains_many(self, pairs: np.ndarray) -> np.ndarray:
        """Membership of every row of an (n, 2) uint64 array, probing all of them at once."""
        found = np.zeros(len(pairs), dtype=bool)
        zero = pairs[:, 0] == 0
        if zero.any():
            found[zero] = [int(lo) in self._zero_hi for lo in pairs[zero, 1]]
        pending = np.flatnonzero(~zero)
        if not self._n or not len(pending):
            return found
        mask = np.uint64(len(self._hi) - 1)
        hi, lo = pairs[:, 0], pairs[:, 1]
        pos = lo[pending] & mask
        while len(pending):
            slot_hi = self._hi[pos]
            match = (slot_hi == hi[pending]) & (self._lo[pos] == lo[pending])
            found[pending[match]] = True
            go_on = (slot_hi != 0) & ~match
            pending, pos = pending[go_on], (pos[go_on] + np.uint64(1)) & mask
        return found

    def update(self, digests: bytes | np.ndarray) -> None:
        """Add many digests at once (vectorised)."""
        pairs = _pairs(digests)
        pairs = pairs[first_occurrences(pairs)]
        self.insert_new(pairs[~self.contains_many(pairs)])

    def insert_new(self, pairs: np.ndarray) -> None:
        """Add digests known to be absent and distinct (no membership check)."""
        zero = pairs[:, 0] == 0
        for lo in pairs[zero, 1].tolist():
            self._zero_hi.add(lo)
            self._n += 1
        pairs = pairs[~zero]
        if not len(pairs):
            return
        while 2 * (self._n + len(pairs)) > len(self._hi):
            self._resize(2 * len(self._hi))
        self._bulk_insert(pairs[:, 0], pairs[:, 1])

    def _bulk_insert(self, hi: np.ndarray, lo: np.ndarray) -> None:
        """Linear probing for many distinct keys at once: each round fills free slots, the rest move on."""
        mask = np.uint64(len(self._hi) - 1)
        pos = lo & mask
        pending = np.arange(len(hi))
        while len(pending):
            p = pos[pending]
            free = self._hi[p] == 0
            # several keys may claim one free slot: the last write wins, the others probe on
            self._hi[p[free]] = hi[pending[free]]
            self._lo[p[free]] = lo[pending[free]]
            placed = free & (self._hi[p] == hi[pending]) & (self._lo[p] == lo[pending])
            self._n += int(placed.sum())
            pending = pending[~placed]
            pos[pending] = (pos[pending] + np.uint64(1)) & mask

    def _resize(self, size: int) -> None:
        used = self._hi != 0
        hi, lo = self._hi[used], self._lo[used]
        self._hi = np.zeros(size, dtype=np.uint64)
        self._lo = np.zeros(size, dtype=np.uint64)
        self._n = len(self._zero_hi)
        self._bulk_insert(hi, lo)

    def nbytes(self) -> int:
        return self._hi.nbytes + self._lo.nbytes


def first_occurrences(pairs: np.ndarray) -> np.ndarray:
    """A mask of the rows of an (n, 2) array that are the first of their value (a stable sort)."""
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    ordered = pairs[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = np.any(ordered[1:] != ordered[:-1], axis=1)
    first = np.zeros(len(order), dtype=bool)
    first[order[starts]] = True
    return first
