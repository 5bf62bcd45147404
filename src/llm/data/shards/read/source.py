"""`SampleSource`: what a loader reads, one optimized dataset or a mixture of them, and its resume contract.

How a batch is made: the loader fixes the read plan of this pass (epoch, resume
position, rank, world size) on the source before its workers start. Each worker
computes, from that plan alone, the chunks of batches it serves, reads their samples
with vectorised copies and sends a whole chunk at once (one inter-process hand-off per
chunk, not per sample). The loader splits chunks back into batches, in order, and
counts only the batches it hands to the caller: that count is the whole resume state.

`StreamingDataset` (one folder of shards) and `CombinedStreamingDataset` (a mixture that
holds its sources) both derive from `SampleSource`; the loader uses nothing else. The
source's part of a loader state is its identity (fingerprint, seed, settings, size),
the epoch and position, and, for a mixture, its per-source counts (`extra_state`).
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from llm.data.ingest_stats import remote_diff
from llm.data.ledger.format import RULES
from llm.data.shards.plan.schedule import BatchSchedule
from llm.data.shards.read.abilities import LedgerRows, MixtureHooks, RemoteReads
from llm.data.shards.read.access import SampleAccess
from llm.data.shards.read.ledger import chunk_identities
from llm.data.shards.read.profiling import recording
from llm.data.shards.read.skips import drop_rows
from llm.data.shards.read.state import (
    MAX_EPOCH,
    STATE_KEYS,
    STATE_VERSION,
    check_header,
    check_identity,
    check_int,
)
from llm.data.stage import Stage
from llm.data.topology import current_topology

Order = Callable[[np.ndarray], np.ndarray]


def renamed(value: bool, alias: bool | None, name: str, old: str) -> bool:
    """A flag passed by its name or by its older, ambiguous one (`drop_last`), never both differently."""
    if alias is None or alias == value:
        return bool(alias if alias is not None else value)
    if value:
        raise ValueError(f"{name}={value!r} and {old}={alias!r} disagree; pass {name} only ({old} is its older name)")
    return bool(alias)


def chunk_bounds(n_batches: int, workers: int, max_batches: int) -> list[int]:
    """Batch boundaries of the chunks workers hand over: 1, 1, 2, 2, 4, 4, ... up to max_batches.

    Chunk c goes to worker c % workers; small first chunks make the first batch (also
    after a resume) quick, large later ones amortise the hand-off. Deterministic, so
    DataLoader's round-robin merge still yields batches in plan order.
    """
    bounds, size, c = [0], 1, 0
    while bounds[-1] < n_batches:
        bounds.append(min(bounds[-1] + size, n_batches))
        c += 1
        if c % max(workers, 1) == 0:
            size = min(size * 2, max_batches)
    return bounds


@dataclass(frozen=True)
class ReadPlan:
    """What one pass over the data reads, fixed in the main process before workers start."""

    epoch: int
    schedule: BatchSchedule
    chunk_batches: int
    collate: Callable[[list], Any] | None = None
    batched: bool = True  # False: yield single samples (the dataset iterated without the loader)
    profile: int = 0  # chunks holding one of the first `profile` batches record spans (profiling.py)
    t0: int = 0  # the profile's time origin (perf_counter_ns)
    ledger: str = ""  # a checksum rule: chunks carry each row's sample id and token checksum (read/ledger.py)


@dataclass(frozen=True)
class Resume:
    """Where a checked state resumes, computed without changing anything (see `SampleSource.resolve`)."""

    epoch: int
    consumed: int
    legacy_seeds: bool  # a version-1 state: orders keyed by seed + epoch (read/state.py)
    legacy_window: bool = False  # a version-1 or -2 state: straddling blocks in the earlier window
    anchor: np.ndarray | None = None  # a mixture re-anchored at these per-source counts
    restart: bool = False  # a mixture whose plan starts over at position 0 (other weights or sources)
    history: Any = None  # a mixture's past to rebuild its plan from (shards/mix/resume.py)


class SampleSource(SampleAccess, RemoteReads, MixtureHooks, LedgerRows, IterableDataset, Stage):
    """Samples in a planned order: the one interface `StreamingDataLoader` reads through.

    The core contract is here; the optional abilities (remote reads, mixture hooks, ledger rows) are
    declared with their defaults in abilities.py."""

    num_samples: int
    seed: int
    shuffle: bool
    fingerprint: str
    shuffle_window: Any
    subsample: Any
    split: Any
    input_dir: Any
    block_size: int | None = None  # token blocks' length (None: items)
    epoch: int = 0
    legacy_seeds: bool = False  # set by restoring a version-1 state
    legacy_window: bool = False  # set by restoring a state older than version 3
    _plan: ReadPlan | None = None
    skip_blocks: dict = {}  # noqa: RUF012  source -> stored blocks dropped by id (read/skips.py); set by the loader

    # ---- what each kind of source says about itself -------------------------------------------

    @abstractmethod
    def order(self, epoch: int) -> Order:
        """Epoch position -> sample id of this source."""

    @abstractmethod
    def read_blocks(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Token blocks of these sample ids, shape (len(ids), block_size)."""

    def identity(self) -> dict[str, Any]:
        """The state keys a resume must match."""
        return {"fingerprint": self.fingerprint, "seed": self.seed, "shuffle": self.shuffle,
                "shuffle_window": self.shuffle_window, "subsample": self.subsample, "split": self.split,
                "num_samples": self.num_samples}

    @abstractmethod
    def verify(self) -> None:
        """Check every shard's size and checksum against its manifest (raises ShardError)."""

    # ---- the stage contract ------------------------------------------------------------------

    def state_at(self, epoch: int, consumed: int) -> dict[str, Any]:
        """This source's state at a position of an epoch (the loader's state adds its batch size)."""
        version = 1 if self.legacy_seeds else 2 if self.legacy_window else STATE_VERSION
        return {"version": version, **self.identity(), "epoch": epoch,
                "samples_consumed": consumed, **self.extra_state(epoch, consumed)}

    def state(self) -> dict[str, Any]:
        return self.state_at(self.epoch, 0)

    def resolve(self, state: Any, keys: tuple[str, ...] = STATE_KEYS[:-1]) -> Resume:
        """Where `state` resumes on this source, or a StateError; nothing is changed."""
        state = check_header(state, keys)
        anchor, restart = self.resume_anchor(state)
        expected = self.resume_identity(state)
        if restart:  # another mixture: its size and position no longer apply
            expected.pop("num_samples")
            state = {**state, "epoch": 0, "samples_consumed": 0}
        # a token dataset (not a mixture) names block_size on a num_samples mismatch; read whole, also
        # the block_size its token total implies
        reader = getattr(self, "reader", None)
        block = self.block_size if reader is not None else None
        tokens = reader.total if block and getattr(self, "view", None) is None else None
        check_identity(state, self.input_dir, expected, block, tokens)
        epoch = check_int(state, "epoch", 0, MAX_EPOCH, "epochs finished")
        consumed = check_int(state, "samples_consumed", 0, self.num_samples, "samples of the epoch already handed out")
        return Resume(epoch, consumed, state["version"] == 1, anchor=anchor, legacy_window=state["version"] < 3,
                      restart=restart)

    def check(self, state: Any) -> None:
        self.resolve(state)

    def apply(self, resume: Resume) -> None:
        """Take the order derivation (and a mixture's anchor) of a resolved state."""
        self.legacy_seeds, self.legacy_window = resume.legacy_seeds, resume.legacy_window

    def restore(self, state: dict[str, Any]) -> None:
        resume = self.resolve(state)
        self.apply(resume)
        self.epoch = resume.epoch

    # ---- iteration ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Epoch used when the dataset is iterated on its own (the loader tracks its own)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        # Not a generator itself: the plan must be read now, while the loader has it set.
        plan = self._plan
        if plan is None:  # iterated on its own: one sample at a time, this rank's share
            rank, world = current_topology()
            plan = ReadPlan(self.epoch, BatchSchedule(self.num_samples, 0, 1, rank, world), 256, batched=False)
        return self._iterate(plan)

    def _iterate(self, plan: ReadPlan) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        bounds, order = self.chunk_plan(plan, workers)
        # A worker process's remote counts reach the loader as deltas inside its chunks, and in one
        # last chunk without batches once its prefetches are done (ingest_stats.py).
        ship = info is not None and plan.batched and self.reads_remote()
        counted = self.remote_counters() if ship else None
        try:
            for chunk in range(worker, len(bounds) - 1, workers):
                if plan.batched:
                    out = self.read_chunk(plan, order, bounds[chunk], bounds[chunk + 1])
                    if counted is not None:
                        now = self.remote_counters()
                        out["ingest"], counted = remote_diff(now, counted), now
                    yield out
                else:
                    self._hint(plan, order, bounds[chunk], bounds[chunk + 1])
                    yield from self._samples(order(self._positions(plan, bounds[chunk], bounds[chunk + 1])))
            if counted is not None:
                yield {"sizes": np.zeros(0, dtype=np.int64), "ingest": remote_diff(self.remote_counters(wait=True), counted)}
        finally:
            self.release()

    def chunk_plan(self, plan: ReadPlan, workers: int) -> tuple[list[int], Order]:
        """The chunk boundaries (in batches) and the epoch's position -> sample map."""
        return chunk_bounds(len(plan.schedule), workers, plan.chunk_batches), self.order(plan.epoch)

    @staticmethod
    def _positions(plan: ReadPlan, lo: int, hi: int) -> np.ndarray:
        return np.concatenate([plan.schedule.positions(k) for k in range(lo, hi)])

    def read_chunk(self, plan: ReadPlan, order: Order, lo: int, hi: int) -> dict[str, Any]:
        """Batches [lo, hi) of this rank's schedule, read at once (safe to call from threads)."""
        self._hint(plan, order, lo, hi)
        positions = [plan.schedule.positions(k) for k in range(lo, hi)]
        sizes = np.array([len(p) for p in positions], dtype=np.int64)
        samples = order(np.concatenate(positions))
        positions = np.concatenate(positions)
        left_out: dict[str, np.ndarray] = {}
        if self.skip_blocks:  # documents skipped by id: their blocks leave the batch, the order stays (read/skips.py)
            positions, samples, sizes, left_out = drop_rows(self, positions, samples, sizes)
        checksum = RULES[plan.ledger] if plan.ledger else None  # the ledger's: rows checksummed as they are read
        try:
            if lo >= plan.profile:
                chunk = self._chunk(samples, sizes, plan.collate, checksum)
            else:
                info = get_worker_info()
                thread = f"DataLoader worker {info.id}" if info else threading.current_thread().name
                with recording(plan.t0, thread) as rec:
                    chunk = self._chunk(samples, sizes, plan.collate, checksum)
                chunk = {**chunk, "trace": rec.events}
            if not plan.ledger:
                return chunk
            # the ledger's identities come from what this worker read, not from the loader's cursor; taken first:
            # they pop the chunk's `ledger_crc`, which would otherwise travel on as a tensor nobody reads
            ids = chunk_identities(chunk, positions, samples)
            return {**chunk, **ids, **left_out}
        finally:
            self.release()  # this thread's pin: an idle reader must not hold cache room

    def _hint(self, plan: ReadPlan, order: Order, lo: int, hi: int) -> None:
        """Remote data: tell the caches which samples batches [lo, hi + a few chunks) read, in order."""
        if not self.reads_remote():
            return
        ahead = min(len(plan.schedule), hi + 4 * max(hi - lo, 1))
        if ahead > lo:
            self.hint_samples(order(self._positions(plan, lo, ahead)))
