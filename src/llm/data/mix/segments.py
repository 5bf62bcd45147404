"""A mixture's plan as segments: from each change point of its weights on, which source each position reads.

A segment starts at an absolute position with each source's count so far (its anchor)
and holds one set of weights; a schedule (`mix_schedule.py`) has one segment per change
point, fixed weights have one. Inside a segment a picker says which source serves each
position, as a pure function of the position:

* `PeriodicPicker` (weights are shares of samples): the periodic slot table of weights.py,
  counts in closed form, O(1) for any position.
* `TokenPicker` (weights are shares of tokens, for items of variable length): each source's
  samples are queued at the virtual time `tokens it gave in this segment before them /
  weight`, and positions take them in time order (weighted fair queueing), so each source's
  tokens stay within one sample of its share. Its table is computed in doubling blocks from
  the segment's start, the same in every process, so any position is still computable alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from llm.data.mix.weights import PERIOD, period_for, quotas, slot_table
from llm.data.seeds import derive_seed

# (source, first count, how many) -> token lengths of that source's samples at those counts
Lengths = Callable[[int, int, int], np.ndarray]


class PeriodicPicker:
    """Sources by a periodic, low-discrepancy slot table; one slot is `per_slot` samples (per_batch)."""

    def __init__(self, weights: Sequence[float], seed: int, legacy: bool, per_slot: int):
        if legacy:  # a version-1 state: its period and rotation, zero quotas included
            self.period, rotation = PERIOD, seed
            self.quota = np.array(quotas(weights), dtype=np.int64)
        else:
            self.period, rotation = period_for(weights), derive_seed(seed, "mixture")
            self.quota = np.array(quotas(weights, self.period, floor=True), dtype=np.int64)
        self.per_slot = per_slot
        self.slots = slot_table(self.quota.tolist(), rotation, self.period)
        # prefix[s, k]: slots of source s in [0, k)
        self.prefix = np.zeros((len(weights), self.period + 1), dtype=np.int64)
        for s in range(len(weights)):
            self.prefix[s, 1:] = np.cumsum(self.slots == s)

    def sources(self, rel: np.ndarray) -> np.ndarray:
        return self.slots[(rel // self.per_slot) % self.period]

    def counts(self, rel: np.ndarray) -> np.ndarray:
        """Samples each source gave in this segment before each position: shape (sources, len(rel))."""
        slot, within = np.divmod(rel, self.per_slot)
        full, rest = np.divmod(slot, self.period)
        before = full[None, :] * self.quota[:, None] + self.prefix[:, rest]
        current = self.slots[rest][None, :] == np.arange(len(self.quota))[:, None]
        return before * self.per_slot + current * within[None, :]

    def epoch_end(self, need: np.ndarray, every: bool) -> int:
        """Positions until the first (or every) weighted source has given `need[s]` samples."""
        ends = []
        for s in np.flatnonzero(self.quota):
            slots = -(-int(need[s]) // self.per_slot)
            periods = max(0, (slots - 1) // int(self.quota[s]))
            within = int(np.searchsorted(self.prefix[s], slots - periods * self.quota[s]))
            ends.append(periods * self.period + within)
        return int(max(ends) if every else min(ends)) * self.per_slot


class TokenPicker:
    """Sources in order of their tokens over their weights (weighted fair queueing), from counts `anchor`."""

    def __init__(self, weights: Sequence[float], anchor: np.ndarray, lengths: Lengths):
        self.weights, self.anchor, self.lengths = list(weights), np.asarray(anchor, dtype=np.int64), lengths
        self.seq = np.zeros(0, dtype=np.int64)
        self.cum = np.zeros((len(self.weights), 1), dtype=np.int64)  # cum[s, k]: samples of s in [0, k)
        self.lens = [np.zeros(0, dtype=np.int64) for _ in self.weights]  # each source's lengths read so far
        self.horizon = 0.0  # the table holds every sample whose start time (tokens before it / weight) is below

    def _extend(self, upto: int) -> None:
        """Grow the table to at least `upto` positions: every sample due before a doubling time horizon.

        A sample's key is (its start time, its source); taking every sample that starts before
        the horizon gives exactly the first positions of the full order, and each source is
        read only as far as the horizon reaches (a long-document source is not read 20x ahead).
        """
        if len(self.seq) >= upto:
            return
        while len(self.seq) < upto:
            self.horizon = max(2 * self.horizon, 1024.0)
            times, srcs = [], []
            for s, w in enumerate(self.weights):
                if w <= 0:
                    continue
                while int(self.lens[s].sum()) < self.horizon * w:  # read on until past the horizon
                    more = self.lengths(s, int(self.anchor[s]) + len(self.lens[s]), max(1024, len(self.lens[s])))
                    self.lens[s] = np.concatenate([self.lens[s], np.asarray(more, dtype=np.int64)])
                start = np.concatenate([[0], np.cumsum(self.lens[s])[:-1]]) / w
                due = start[start < self.horizon]
                times.append(due)
                srcs.append(np.full(len(due), s, dtype=np.int64))
            t, src = np.concatenate(times), np.concatenate(srcs)
            self.seq = src[np.lexsort((src, t))]  # by time, ties to the lower source, stable inside one
        self.cum = np.zeros((len(self.weights), len(self.seq) + 1), dtype=np.int64)
        for s in range(len(self.weights)):
            self.cum[s, 1:] = np.cumsum(self.seq == s)

    def sources(self, rel: np.ndarray) -> np.ndarray:
        self._extend(int(rel.max(initial=-1)) + 1)
        return self.seq[rel]

    def counts(self, rel: np.ndarray) -> np.ndarray:
        self._extend(int(rel.max(initial=-1)) + 1)
        return self.cum[:, rel]

    def epoch_end(self, need: np.ndarray, every: bool) -> int:
        ends = []
        for s in (s for s, w in enumerate(self.weights) if w > 0):
            while self.cum[s, -1] < need[s]:
                self._extend(len(self.seq) + 1)
            ends.append(int(np.searchsorted(self.cum[s], need[s])))
        return max(ends) if every else min(ends)


class MixPlan:
    """The segments of a mixture from `starts[k]` (absolute positions) with `weights[k]`, built as reached.

    `per_slot[k]`: samples per slot in segment k (1, or a per_batch mixture's global batch from there).
    """

    def __init__(self, starts: list[int], weights: list[list[float]], anchor: np.ndarray,
                 picker: Callable[[list[float], np.ndarray, int], PeriodicPicker | TokenPicker],
                 per_slot: list[int] | None = None):
        self.starts, self.weights, self.picker = starts, weights, picker
        self.per_slot = per_slot or [1] * len(starts)  # samples per slot of each segment (per_batch: its global batch)
        self.anchors = [np.asarray(anchor, dtype=np.int64)]
        self.pickers = [picker(weights[0], self.anchors[0], self.per_slot[0])]
        self._lock = threading.Lock()  # token datasets read chunks from several threads

    def __getstate__(self) -> dict:  # sent to worker processes (spawn, forkserver): a lock does not pickle
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _reach(self, position: int) -> None:
        """Build the segments that start at or before `position` (each anchored where the last ends)."""
        with self._lock:
            while len(self.pickers) < len(self.starts) and self.starts[len(self.pickers)] <= position:
                k = len(self.pickers)
                span = np.array([self.starts[k] - self.starts[k - 1]], dtype=np.int64)
                self.anchors.append(self.anchors[-1] + self.pickers[-1].counts(span)[:, 0])
                self.pickers.append(self.picker(self.weights[k], self.anchors[-1], self.per_slot[k]))

    def _split(self, absolute: np.ndarray) -> np.ndarray:
        self._reach(int(absolute.max(initial=0)))
        return np.searchsorted(np.array(self.starts[: len(self.pickers)]), absolute, side="right") - 1

    def sources(self, absolute: np.ndarray) -> np.ndarray:
        seg, out = self._split(absolute), np.empty(len(absolute), dtype=np.int64)
        for k in np.unique(seg).tolist():
            at = seg == k
            out[at] = self.pickers[k].sources(absolute[at] - self.starts[k])
        return out

    def counts(self, absolute: np.ndarray) -> np.ndarray:
        """Samples each source gave before each absolute position: shape (sources, len(absolute))."""
        seg = self._split(absolute)
        out = np.empty((len(self.anchors[0]), len(absolute)), dtype=np.int64)
        for k in np.unique(seg).tolist():
            at = seg == k
            out[:, at] = self.anchors[k][:, None] + self.pickers[k].counts(absolute[at] - self.starts[k])
        return out

    def first(self) -> PeriodicPicker | TokenPicker:
        return self.pickers[0]
