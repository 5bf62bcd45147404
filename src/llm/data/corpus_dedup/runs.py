"""Sorted runs on disk and their k-way merge, a block per run in memory at a time.

A run is a file of fixed-width rows (a numpy structured dtype) sorted by all its
fields in order. `merge_runs` yields the rows of many runs in that order as
numpy arrays, reading `block_rows` rows of each run at a time, so memory is
(runs x block_rows) rows plus one group of equal keys, never the whole input.
A group of rows with equal keys is never split between two yielded arrays.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np


def sort_rows(rows: np.ndarray) -> np.ndarray:
    """Rows of a structured array sorted by every field, first field most significant."""
    names = rows.dtype.names
    assert names
    return rows[np.lexsort([rows[name] for name in reversed(names)])]


RunSlice = tuple[Path, int, int]  # a run: (file, first row, rows) -- one file may hold several runs


class _Reader:
    """One run read `block_rows` rows at a time (buffer: rows read and not yet merged)."""

    def __init__(self, run: RunSlice, dtype: np.dtype, block_rows: int):
        path, start, count = run
        if count:
            self.rows = np.memmap(path, dtype=dtype, mode="r", offset=start * dtype.itemsize, shape=(count,))
        else:
            self.rows = np.zeros(0, dtype)
        self.next, self.block = 0, block_rows
        self.buffer = np.zeros(0, dtype)

    @property
    def exhausted(self) -> bool:
        return self.next >= len(self.rows)

    def refill(self) -> None:
        block = np.array(self.rows[self.next : self.next + self.block])
        self.next += len(block)
        self.buffer = np.concatenate((self.buffer, block)) if len(self.buffer) else block


def _key(rows: np.ndarray, i: int, key_fields: tuple[str, ...]) -> tuple:
    return tuple(rows[name][i].item() for name in key_fields)


def _below(rows: np.ndarray, bound: tuple, key_fields: tuple[str, ...]) -> int:
    """How many leading rows (sorted) have a key < bound (lexicographic over key_fields)."""
    # the first field narrows it vectorised; ties on it are few, checked row by row
    first = rows[key_fields[0]]
    lo = int(np.searchsorted(first, bound[0], side="left"))
    hi = int(np.searchsorted(first, bound[0], side="right"))
    while lo < hi and _key(rows, lo, key_fields) < bound:
        lo += 1
    return lo


def merge_runs(
    runs: list[RunSlice], dtype: np.dtype, key_fields: tuple[str, ...], block_rows: int = 1 << 16
) -> Iterator[np.ndarray]:
    """The rows of sorted runs, merged in order, as arrays that never split a group of equal keys."""
    readers = [_Reader(run, dtype, block_rows) for run in runs]
    readers = [r for r in readers if len(r.rows)]
    for r in readers:
        r.refill()
    while readers:
        live = [r for r in readers if not r.exhausted]
        if live:
            # rows with a key below the smallest last-buffered key of a run with more to read are final:
            # every row not yet read is at least that key
            bound = min(_key(r.buffer, len(r.buffer) - 1, key_fields) for r in live)
            parts = []
            for r in readers:
                cut = _below(r.buffer, bound, key_fields)
                if cut:
                    parts.append(r.buffer[:cut])
                    r.buffer = r.buffer[cut:]
            for r in live:
                if not len(r.buffer) or _key(r.buffer, len(r.buffer) - 1, key_fields) == bound:
                    r.refill()
        else:
            parts = [r.buffer for r in readers if len(r.buffer)]
            for r in readers:
                r.buffer = r.buffer[:0]
        readers = [r for r in readers if len(r.buffer) or not r.exhausted]
        if parts:
            yield sort_rows(np.concatenate(parts))


def unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct pairs (a[i], b[i]), sorted by a then b: what `np.unique(np.stack((a, b), axis=1), axis=0)`
    gives, ~6x faster (that sorts rows as opaque records: ~30 ms for 42,000 pairs)."""
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    starts = group_starts([a, b])
    return a[starts], b[starts]


def group_starts(keys: list[np.ndarray]) -> np.ndarray:
    """Indices where a new group of equal keys begins in sorted rows (keys: one array per key field)."""
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)
