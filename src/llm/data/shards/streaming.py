"""StreamingDataset and StreamingDataLoader: optimized shards to batches, exactly resumable on any topology.

How a batch is made: the loader fixes the plan for this iteration (epoch, resume
position, rank, world size) on the dataset before its workers start. Each worker
computes, from that plan alone, the chunks of batches it serves, reads their
blocks with vectorised memory-mapped copies and sends a whole chunk at once (one
inter-process hand-off per chunk, not per sample). The loader splits chunks back
into batches, in order, and counts only the batches it hands to the caller: that
count is the whole resume state.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate

from llm.data.shards.format.loaders import ItemsLoader, TokensLoader
from llm.data.shards.format.manifest import Manifest
from llm.data.shards.format.reader import ItemReader, TokenReader
from llm.data.shards.plan import BatchSchedule, epoch_order
from llm.data.topology import current_topology

STATE_VERSION = 1
_CHUNK_TOKENS = 1 << 20  # tokens per worker hand-off: big enough to amortise IPC, small enough to start fast


def current_rank_world() -> tuple[int, int]:
    """(rank, world_size) of this process (see `llm.data.topology`)."""
    return current_topology()


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
class _Iteration:
    """What one pass over the data reads, fixed in the main process before workers start."""

    epoch: int
    schedule: BatchSchedule
    chunk_batches: int
    collate: Callable[[list], Any] | None = None
    batched: bool = True  # False: yield single samples (the dataset iterated without the loader)


class StreamingDataset(IterableDataset):
    """Samples of a dataset made by `optimize`: token blocks (TokensLoader) or items (ItemsLoader)."""

    def __init__(
        self,
        input_dir: str | Path,
        item_loader: TokensLoader | ItemsLoader | None = None,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 42,
        verify_checksums: bool = True,
        shuffle_algorithm: str = "feistel",
    ):
        self.input_dir = Path(input_dir)
        self.manifest = Manifest.load(self.input_dir)
        self.item_loader = item_loader or self._default_loader()
        if self.item_loader.kind != self.manifest.kind:
            raise ValueError(
                f"{self.input_dir} holds {self.manifest.kind}, but item_loader is {type(self.item_loader).__name__}; "
                f"use {'TokensLoader(block_size=...)' if self.manifest.kind == 'tokens' else 'ItemsLoader()'}"
            )
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self.shuffle_algorithm = shuffle_algorithm
        self.fingerprint = self.manifest.fingerprint()
        self.epoch = 0
        self._iteration: _Iteration | None = None
        if self.manifest.kind == "tokens":
            self._init_tokens(verify_checksums)
        else:
            self.reader = ItemReader(self.input_dir, self.manifest, verify_checksums)
            self.num_samples = self.reader.total

    def _default_loader(self) -> TokensLoader | ItemsLoader:
        if self.manifest.kind == "items":
            return ItemsLoader()
        raise ValueError(f"{self.input_dir} holds tokens: pass item_loader=TokensLoader(block_size=...)")

    def _init_tokens(self, verify: bool) -> None:
        block = self.item_loader.block_size
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"TokensLoader.block_size must be a positive integer to read {self.input_dir}, got {block!r}")
        self.block_size = block
        self.reader = TokenReader(self.input_dir, self.manifest, verify)
        total = self.reader.total
        self.num_samples = total // block if self.drop_last else math.ceil(total / block)
        pad = self.item_loader.pad_id
        self.pad_id = pad if pad is not None else (self.manifest.eos_id or 0)

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Epoch used when the dataset is iterated on its own (the loader tracks its own)."""
        self.epoch = epoch

    # ---- reading ---------------------------------------------------------------------------

    def read_blocks(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Token blocks for these sample ids as int64 arrays of shape (len(ids), block_size)."""
        n, block = len(sample_ids), self.block_size
        tokens = np.empty((n, block), dtype=np.int64)
        if self.item_loader.document_boundaries:
            positions = np.empty((n, block), dtype=np.int64)
            for row in range(n):
                self._read_block(int(sample_ids[row]), tokens[row], positions[row])
            return {"input_ids": tokens, "position_ids": positions}
        # Fast path: blocks inside one shard, gathered shard by shard; the rest one by one.
        starts = np.asarray(sample_ids, dtype=np.int64) * block
        for row in self.reader.gather_blocks(starts, block, tokens).tolist():
            self._read_block(int(sample_ids[row]), tokens[row], None)
        return {"input_ids": tokens}

    def _read_block(self, sample: int, out: np.ndarray, positions: np.ndarray | None) -> None:
        start = sample * self.block_size
        stop = min(start + self.block_size, self.reader.total)
        self.reader.read(start, stop, out, positions)
        out[stop - start :] = self.pad_id

    def _check_index(self, index: int) -> int:
        if index < 0:
            index += self.num_samples
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} out of range for {self.num_samples} samples in {self.input_dir}")
        return index

    def __getitem__(self, index: int) -> Any:
        index = self._check_index(int(index))
        if self.manifest.kind == "items":
            return self.reader.get(index)
        blocks = self.read_blocks(np.array([index]))
        if not self.item_loader.document_boundaries:
            return torch.from_numpy(blocks["input_ids"][0])
        return {k: torch.from_numpy(v[0]) for k, v in blocks.items()}

    def verify(self) -> None:
        """Check every shard's size and checksum against the manifest (raises ShardError)."""
        self.reader.verify()

    # ---- iteration -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        # Not a generator itself: the plan must be read now, while the loader has it set.
        it = self._iteration
        if it is None:  # iterated on its own: one sample at a time, this rank's share
            rank, world = current_rank_world()
            it = _Iteration(self.epoch, BatchSchedule(self.num_samples, 0, 1, rank, world), 256, batched=False)
        return self._iterate(it)

    def _iterate(self, it: _Iteration) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        bounds, order = self.chunk_plan(it, workers)
        for chunk in range(worker, len(bounds) - 1, workers):
            if it.batched:
                yield self.read_chunk(it, order, bounds[chunk], bounds[chunk + 1])
            else:
                for sample in order(self._positions(it, bounds[chunk], bounds[chunk + 1])).tolist():
                    yield self[sample]

    def chunk_plan(self, it: _Iteration, workers: int) -> tuple[list[int], Callable[[np.ndarray], np.ndarray]]:
        """The chunk boundaries (in batches) and the epoch's position -> sample map."""
        order = epoch_order(self.num_samples, self.seed, it.epoch, self.shuffle, self.shuffle_algorithm)
        return chunk_bounds(len(it.schedule), workers, it.chunk_batches), order

    @staticmethod
    def _positions(it: _Iteration, lo: int, hi: int) -> np.ndarray:
        return np.concatenate([it.schedule.positions(k) for k in range(lo, hi)])

    def read_chunk(self, it: _Iteration, order: Callable, lo: int, hi: int) -> dict[str, Any]:
        """Batches [lo, hi) of this rank's schedule, read at once (safe to call from threads)."""
        positions = [it.schedule.positions(k) for k in range(lo, hi)]
        sizes = np.array([len(p) for p in positions], dtype=np.int64)
        return self._chunk(order(np.concatenate(positions)), sizes, it.collate)

    def _chunk(self, samples: np.ndarray, sizes: np.ndarray, collate: Callable | None) -> dict[str, Any]:
        """Several consecutive batches at once: one hand-off from a worker instead of one per batch."""
        if self.manifest.kind == "tokens":
            return {"sizes": sizes, **self.read_blocks(samples)}
        collate = collate or default_collate
        items = [self.reader.get(int(s)) for s in samples]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        return {"sizes": sizes, "batches": [collate(items[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]}


def _split_chunk(chunk: dict[str, Any], document_boundaries: bool) -> Iterator[Any]:
    sizes = chunk["sizes"].tolist()
    if "batches" in chunk:
        yield from chunk["batches"]
        return
    row = 0
    for size in sizes:
        if document_boundaries:
            yield {"input_ids": chunk["input_ids"][row : row + size], "position_ids": chunk["position_ids"][row : row + size]}
        else:
            yield chunk["input_ids"][row : row + size]
        row += size


class StreamingDataLoader(DataLoader):
    """A DataLoader over a StreamingDataset with an exact, tiny, topology-free `state_dict()`.

    Iterating it again starts the next epoch (reshuffled by seed + epoch); iterating
    after a `break` or a `load_state_dict` continues where the consumed batches end.
    """

    def __init__(
        self,
        dataset: StreamingDataset,
        batch_size: int = 1,
        num_workers: int = 0,
        collate_fn: Callable[[list], Any] | None = None,
        drop_last: bool = False,
        worker_backend: str = "auto",
        **kwargs: Any,
    ):
        if not isinstance(dataset, StreamingDataset):
            raise TypeError(f"StreamingDataLoader needs a StreamingDataset, got {type(dataset).__name__}")
        for key in ("sampler", "batch_sampler", "shuffle"):
            if kwargs.get(key) not in (None, False):
                raise ValueError(f"StreamingDataLoader does not take {key}=; order is set by StreamingDataset(shuffle=, seed=)")
            kwargs.pop(key, None)
        if kwargs.get("persistent_workers"):
            raise ValueError("StreamingDataLoader does not support persistent_workers=True: each epoch's plan is sent to fresh workers")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if collate_fn is not None and dataset.manifest.kind == "tokens":
            raise ValueError("collate_fn is only used for item datasets; token batches are stacked arrays already")
        if worker_backend not in ("auto", "threads", "processes"):
            raise ValueError(f"worker_backend must be 'auto', 'threads' or 'processes', got {worker_backend!r}")
        if worker_backend == "auto":
            # Token blocks are memory copies that release the GIL: reader threads are faster than
            # worker processes and cost no extra memory. Item datasets run user code: processes.
            custom = kwargs.get("worker_init_fn") or kwargs.get("multiprocessing_context")
            worker_backend = "threads" if dataset.manifest.kind == "tokens" and not custom else "processes"
        self.worker_backend = worker_backend
        prefetch = kwargs.get("prefetch_factor")
        if worker_backend == "threads":
            kwargs.pop("prefetch_factor", None)  # DataLoader refuses it without worker processes
        super().__init__(
            dataset, batch_size=None, num_workers=0 if worker_backend == "threads" else num_workers, **kwargs
        )
        self.reader_threads = num_workers if worker_backend == "threads" else 0
        self.read_ahead = self.reader_threads * (prefetch or 2)
        # DataLoader forbids setting these after __init__; ours describe the batches we yield.
        object.__setattr__(self, "batch_size", batch_size)
        object.__setattr__(self, "drop_last", drop_last)
        self._collate = collate_fn
        self._chunk_batches = self._pick_chunk_batches(dataset, batch_size)
        self._epoch = 0
        self._start = 0
        self._schedule: BatchSchedule | None = None
        self._yielded = 0

    @staticmethod
    def _pick_chunk_batches(dataset: StreamingDataset, batch_size: int) -> int:
        if dataset.manifest.kind != "tokens":
            return 4
        return max(1, min(64, _CHUNK_TOKENS // (batch_size * dataset.block_size)))

    def _schedule_from(self, start: int) -> BatchSchedule:
        rank, world = current_rank_world()
        return BatchSchedule(self.dataset.num_samples, start, self.batch_size, rank, world, self.drop_last)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self._schedule_from(0))

    def _consumed(self) -> int:
        return self._schedule.consumed_after(self._yielded) if self._schedule else self._start

    def __iter__(self) -> Iterator[Any]:
        self._start = self._consumed()
        schedule = self._schedule_from(self._start)
        self._schedule, self._yielded = schedule, 0
        it = _Iteration(self._epoch, schedule, self._chunk_batches, self._collate)
        if self.reader_threads:
            chunks: Iterator[Any] = self._threaded_chunks(it)
        else:
            self.dataset._iteration = it
            try:
                chunks = super().__iter__()
            finally:
                self.dataset._iteration = None
        boundaries = getattr(self.dataset.item_loader, "document_boundaries", False)
        for chunk in chunks:
            for batch in _split_chunk(chunk, boundaries):
                self._yielded += 1  # counted before the caller sees it: a state saved now includes it
                yield batch
        if self._schedule is schedule and self._yielded == len(schedule):
            self._epoch, self._start, self._schedule, self._yielded = self._epoch + 1, 0, None, 0

    def _threaded_chunks(self, it: _Iteration) -> Iterator[Any]:
        """Chunks read ahead by `reader_threads` threads, yielded in plan order."""
        ds = self.dataset
        bounds, order = ds.chunk_plan(it, self.reader_threads)
        pool = ThreadPoolExecutor(self.reader_threads, thread_name_prefix="llm-reader")
        pending: deque = deque()
        try:
            for c in range(len(bounds) - 1):
                pending.append(pool.submit(ds.read_chunk, it, order, bounds[c], bounds[c + 1]))
                if len(pending) >= self.read_ahead:
                    yield self._to_tensors(pending.popleft().result())
            while pending:
                yield self._to_tensors(pending.popleft().result())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _to_tensors(self, chunk: dict[str, Any]) -> dict[str, Any]:
        out = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in chunk.items()}
        if self.pin_memory:
            out = {k: v.pin_memory() if isinstance(v, torch.Tensor) and k != "sizes" else v for k, v in out.items()}
        return out

    def state_dict(self) -> dict[str, Any]:
        """{version, fingerprint, seed, shuffle, epoch, samples_consumed, ...}: a few hundred bytes."""
        epoch, consumed = self._epoch, self._consumed()
        end = self._schedule.end if self._schedule else self._schedule_from(consumed).end
        if consumed >= end and consumed > 0:  # a finished epoch resumes at the next one
            epoch, consumed = epoch + 1, 0
        ds = self.dataset
        return {
            "version": STATE_VERSION,
            "fingerprint": ds.fingerprint,
            "seed": ds.seed,
            "shuffle": ds.shuffle,
            "num_samples": ds.num_samples,
            "epoch": epoch,
            "samples_consumed": consumed,
            "global_batch_size": self.batch_size * (self._schedule.world_size if self._schedule else current_rank_world()[1]),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the batches counted in `state`, on any num_workers or world size."""
        ds = self.dataset
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state has version {state.get('version') if isinstance(state, dict) else None!r}, expected {STATE_VERSION}")
        for key, mine in (("fingerprint", ds.fingerprint), ("seed", ds.seed), ("shuffle", ds.shuffle), ("num_samples", ds.num_samples)):
            if state.get(key) != mine:
                raise ValueError(
                    f"loader state does not match {ds.input_dir}: {key} is {state.get(key)!r} in the state "
                    f"but {mine!r} here; resume with the same dataset and settings"
                )
        self._epoch, self._start = int(state["epoch"]), int(state["samples_consumed"])
        self._schedule, self._yielded = None, 0
