"""Ingest figures a user can see: data-wait percentiles, batches and tokens per second, remote I/O counts.

Two pieces, shared by `StreamingDataLoader.stats()` and `llm-train`'s metrics:

* `WaitHistogram`: how long the consumer waited for each batch, in log-spaced bins
  (20 per decade, so a percentile is within 6% of the exact one). Memory stays fixed
  however long the run, and histograms of several ranks add up. A loader only appends
  each wait to a small array, which `IngestWindow.flush` bins with NumPy every few
  thousand batches: a clock read and an append per batch.
* `RemoteCounters`: what the shard cache fetched (`REMOTE_KEYS`). Each cache counts into
  its own counters and into `PROCESS_REMOTE`, this process's total. Counts made in a
  DataLoader worker process travel to the training process as deltas inside the chunks
  the worker hands over (the same way profile spans do), so no shared memory or file is
  needed; the loader adds them to its own figures and to `PROCESS_REMOTE`. Counters
  restart at zero in a forked child, so a worker never reports its parent's counts.
"""

from __future__ import annotations

import math
import os
import threading
import time
from array import array
from collections.abc import Iterable, Mapping

import numpy as np

REMOTE_KEYS = ("remote_bytes", "remote_requests", "cache_hits", "cache_misses", "cache_evictions")
PERCENTILES = (50, 95, 99)

_BINS_PER_DECADE = 20
_BINS = 12 * _BINS_PER_DECADE  # 1 ns to 1000 s; a longer wait lands in the last bin


class WaitHistogram:
    """Wait times in log-spaced bins; percentiles by nearest rank, at the bin's geometric middle."""

    def __init__(self) -> None:
        self.counts = [0] * _BINS
        self.n = 0
        self.total_ns = 0

    def add(self, ns: int) -> None:
        b = int(math.log10(ns) * _BINS_PER_DECADE) if ns > 1 else 0
        self.counts[b if b < _BINS else _BINS - 1] += 1
        self.n += 1
        self.total_ns += ns

    def add_many(self, ns: np.ndarray) -> None:
        bins = (np.log10(np.maximum(ns, 1)) * _BINS_PER_DECADE).astype(np.int64)
        counts = np.bincount(np.minimum(bins, _BINS - 1), minlength=_BINS).tolist()
        self.counts = [a + b for a, b in zip(self.counts, counts)]
        self.n += len(ns)
        self.total_ns += int(ns.sum())

    def merge(self, other: WaitHistogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.n += other.n
        self.total_ns += other.total_ns

    def percentile_ms(self, q: float) -> float | None:
        """The q-th percentile (0-100) in milliseconds; None when nothing was recorded."""
        if not self.n:
            return None
        rank = max(1, math.ceil(q / 100 * self.n))
        b = int(np.searchsorted(np.cumsum(self.counts), rank))  # the first bin whose running count reaches it
        return 10 ** ((b + 0.5) / _BINS_PER_DECADE) / 1e6 if b < _BINS else None

    def to_dict(self) -> dict:
        return {"counts": list(self.counts), "n": self.n, "total_ns": self.total_ns}

    @classmethod
    def from_dict(cls, data: Mapping) -> WaitHistogram:
        h = cls()
        h.counts, h.n, h.total_ns = list(data["counts"]), int(data["n"]), int(data["total_ns"])
        return h


def zero_remote() -> dict[str, int]:
    return dict.fromkeys(REMOTE_KEYS, 0)


def remote_sum(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    parts = list(parts)
    return {key: sum(int(part.get(key, 0)) for part in parts) for key in REMOTE_KEYS}


def remote_diff(now: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    return {key: int(now.get(key, 0)) - int(before.get(key, 0)) for key in REMOTE_KEYS}


class RemoteCounters:
    """Thread-safe counts of remote reads (`REMOTE_KEYS`); `parent` receives every count too."""

    def __init__(self, parent: RemoteCounters | None = None):
        self.parent = parent
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._counts = zero_remote()

    def _this_process(self) -> None:
        if self._pid != os.getpid():  # a forked child starts from zero, not from its parent's counts
            self._lock, self._pid, self._counts = threading.Lock(), os.getpid(), zero_remote()

    def add(self, key: str, n: int = 1) -> None:
        self._this_process()
        with self._lock:
            self._counts[key] += n
        if self.parent is not None:
            self.parent.add(key, n)

    def merge(self, counts: Mapping[str, int]) -> None:
        """Add counts made elsewhere (a worker process's delta)."""
        for key in REMOTE_KEYS:
            if counts.get(key):
                self.add(key, int(counts[key]))

    def snapshot(self) -> dict[str, int]:
        self._this_process()
        with self._lock:
            return dict(self._counts)


PROCESS_REMOTE = RemoteCounters()  # every remote count of this process, worker processes' deltas included


FLUSH_EVERY = 4096  # batches recorded before the pending arrays are binned


class IngestWindow:
    """Batches handed to a consumer since the window started: waits, counts, rates and remote I/O.

    The hot path appends each wait (ns) to `pending_waits`; a caller may bind its `append` once,
    since the array is emptied in place, never replaced. A loader's tokens are counted per chunk:
    `open_chunk(sizes, ...)` before its batches go out, `close_chunk()` after; meanwhile the
    chunk's batches handed so far are the waits recorded since it opened.
    """

    def __init__(self) -> None:
        self.pending_waits: array = array("q")
        # a metrics scrape (metrics_export.py) reads the window from its own thread: binning, a chunk's close and a
        # summary take turns, so a scrape never sees a batch or a token twice, or not at all, for a moment
        self._lock = threading.Lock()
        self._chunk: tuple[list[int], int, int] | None = None  # no chunk open yet: reset keeps none
        self.reset(zero_remote())

    def reset(self, remote_now: Mapping[str, int]) -> None:
        with self._lock:
            chunk = self._chunk
            if chunk is not None:  # the open chunk's rest belongs to the next window
                sizes, mark, per_sample = chunk
                chunk = (sizes[self.batches - mark :], 0, per_sample)
            self._chunk = chunk
            del self.pending_waits[:]
            self.waits = WaitHistogram()
            self.tokens = 0
            self.started = time.perf_counter()
            self._remote_base = dict(remote_now)

    @property
    def batches(self) -> int:
        return self.waits.n + len(self.pending_waits)

    def resume_clock(self) -> None:
        """An iteration starts: an empty window's clock starts now, not when the loader was made."""
        if not self.batches:
            self.started = time.perf_counter()

    def open_chunk(self, sizes: list[int], tokens_per_sample: int) -> None:
        """A chunk of batches of `sizes` samples starts going out."""
        with self._lock:  # `batches` is read whole: a scrape's flush moves waits from pending to binned
            self._chunk = (sizes, self.batches, tokens_per_sample)

    def close_chunk(self) -> None:
        """The chunk is done (or left): its batches handed out count their tokens."""
        with self._lock:
            self.tokens += self._open_tokens()
            self._chunk = None

    def _open_tokens(self, batches: int | None = None) -> int:
        if self._chunk is None:
            return 0
        sizes, mark, per_sample = self._chunk
        return sum(sizes[: (self.batches if batches is None else batches) - mark]) * per_sample

    def record(self, wait_ns: int, tokens: int) -> None:
        """One batch handed over after the consumer waited `wait_ns` for it."""
        self.pending_waits.append(wait_ns)
        self.tokens += tokens
        if len(self.pending_waits) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Bin the pending waits; only what was appended before this call (a reader may still append)."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        n = len(self.pending_waits)
        if n:
            # a copy taken in one step: a NumPy view of the live array would make the loop's next append
            # raise BufferError while a scrape's flush (another thread) holds it
            taken = self.pending_waits[:n]
            del self.pending_waits[:n]
            self.waits.add_many(np.frombuffer(taken, dtype=np.int64))

    def summary(self, remote_now: Mapping[str, int]) -> dict:
        """This window as plain numbers (what ranks exchange under DDP), see `figures`."""
        with self._lock:
            self._flush()
            batches = self.batches  # once: the loop may hand out another batch meanwhile
            waits, tokens = self.waits.to_dict(), self.tokens + self._open_tokens(batches)
        return {"waits": waits, "batches": batches, "tokens": tokens,
                "seconds": time.perf_counter() - self.started, "remote": remote_diff(remote_now, self._remote_base)}


def figures(summaries: list[dict], count_tokens: bool = True) -> dict[str, float | int | None]:
    """Merge window summaries (one per rank) into the documented figures.

    Waits of all summaries form one histogram; batches, tokens and remote counts add up;
    rates are over the longest window's seconds.
    """
    waits = WaitHistogram()
    for s in summaries:
        waits.merge(WaitHistogram.from_dict(s["waits"]))
    seconds = max((s["seconds"] for s in summaries), default=0.0)
    batches = sum(s["batches"] for s in summaries)
    tokens = sum(s["tokens"] for s in summaries)
    span = max(seconds, 1e-9)
    out: dict[str, float | int | None] = {
        "batches": batches,
        "tokens": tokens if count_tokens else None,
        "seconds": seconds,
        "batches_per_s": batches / span,
        "tokens_per_s": tokens / span if count_tokens else None,
        "wait_s": waits.total_ns / 1e9,
    }
    for q in PERCENTILES:
        out[f"wait_p{q}_ms"] = waits.percentile_ms(q)
    out.update(remote_sum(s["remote"] for s in summaries))
    return out
