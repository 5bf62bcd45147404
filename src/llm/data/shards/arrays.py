"""Small NumPy helpers for the read path, where a batch's fixed costs matter."""

from __future__ import annotations

import numpy as np


def distinct(values: np.ndarray) -> list[int]:
    """The sorted distinct values, as Python ints: what `np.unique(values).tolist()` gives.

    Kept over `np.unique` because its first call in a process imports `numpy.ma`, which landed
    on the first batch after every start or resume. A sort and a comparison give the same for
    the few dozen values of a batch.
    """
    values = np.asarray(values)
    if values.size == 0:
        return []
    ordered = np.sort(values.ravel())
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep].tolist()


def group_rows(ks: np.ndarray, shard: np.ndarray, order: np.ndarray | None = None) -> list[tuple[int, np.ndarray]]:
    """(shard, the k of `ks` in it) for each shard that `shard[ks]` names, in shard order:
    one sort, not a scan of every row per shard (a chunk may touch hundreds of shards).
    `order` (ascending with the shard, e.g. the rows' start offsets) also orders rows within a shard."""
    if not len(ks):
        return []
    ks = ks[np.argsort((shard if order is None else order)[ks], kind="stable")]
    in_shard = shard[ks]
    bounds = [0, *(np.flatnonzero(in_shard[1:] != in_shard[:-1]) + 1).tolist(), len(ks)]
    return [(int(in_shard[a]), ks[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def add_document_starts(resets: list[int], doc_ends: np.ndarray, a: int, b: int, pos: int) -> None:
    """Where documents start among tokens [a, b) of a shard copied to out[pos:]: at the shard's own start,
    and after each document end inside (a, b). `doc_ends` are the shard's exclusive document ends."""
    if a == 0:
        resets.append(pos)  # every shard starts with a new document
    lo = int(np.searchsorted(doc_ends, a, side="right"))
    hi = int(np.searchsorted(doc_ends, b, side="left"))
    resets.extend((doc_ends[lo:hi].astype(np.int64) - a + pos).tolist())


def positions_from_starts(resets: list[int], filled: int, positions: np.ndarray) -> None:
    """Fill `positions` with block-relative positions that restart at 0 at each document start in `resets`
    (and where padding begins, after `filled` tokens)."""
    n = positions.shape[0]
    if filled < n:
        resets.append(filled)  # padding starts a segment of its own
    idx = np.array(resets, dtype=np.int64)
    marks = np.zeros(n, dtype=np.int64)
    marks[idx[idx < n]] = idx[idx < n]
    np.maximum.accumulate(marks, out=marks)
    np.subtract(np.arange(n, dtype=np.int64), marks, out=positions)
