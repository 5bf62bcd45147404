"""StreamingDataset: optimized shards to samples, read by a plan; `loader.py` turns them into batches.

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
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from llm.data.shards.format.items_reader import ItemReader
from llm.data.shards.format.loaders import ItemsLoader, TokensLoader
from llm.data.shards.format.manifest import Manifest
from llm.data.shards.format.reader import TokenReader
from llm.data.shards.interop import open_foreign
from llm.data.shards.plan.schedule import BatchSchedule, epoch_order
from llm.data.shards.plan.shuffle.windowed import shard_sample_starts
from llm.data.shards.plan.subset import ComposedView, SampleView, check_subsample, subsample_view
from llm.data.shards.read.access import SampleAccess, as_transform
from llm.data.shards.read.profiling import recording
from llm.data.storage.paths import parse_location
from llm.data.topology import current_topology


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
    profile: int = 0  # chunks holding one of the first `profile` batches record spans (profiling.py)
    t0: int = 0  # the profile's time origin (perf_counter_ns)


class StreamingDataset(SampleAccess, IterableDataset):
    """Samples of a dataset made by `optimize`: token blocks (TokensLoader) or items (ItemsLoader)."""

    def __init__(
        self,
        input_dir: str | Path,
        item_loader: TokensLoader | ItemsLoader | None = None,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 42,
        verify_checksums: bool | str = True,
        shuffle_algorithm: str = "feistel",
        cache_dir: str | Path | None = None,
        max_cache_size: int | str | None = "50GB",
        storage_options: dict | None = None,
        shuffle_window: int | str | None = None,
        subsample: float = 1.0,
        transform: Callable[[Any], Any] | list[Callable[[Any], Any]] | None = None,
    ):
        """`input_dir`: a folder, `local:/network/folder` or `s3://bucket/prefix`. Remote shards are
        downloaded ahead of use into `cache_dir/<fingerprint>` (default: the user cache dir), verified,
        and evicted to keep that folder under `max_cache_size`; see docs/storage.md.

        `shuffle_window`: shuffle samples within windows of this many shards (in a seeded shard
        order) instead of globally, so the working set is that many shards. None / "auto": a
        remote dataset with a bounded cache gets the window that fits half of `max_cache_size`,
        anything else a global shuffle; "global" forces the global one.
        `verify_checksums`: True checks each shard's checksum on first use unless this machine
        already verified that very file (format/verified.py); "always" hashes regardless.
        `subsample`: a seeded subset of floor(subsample * n) samples (> 1 repeats them; subset.py).
        `transform`: a callable (or a list, applied in order) on each sample as `ds[i]` gives it, also in
        workers; it moves the loader to the per-sample path (access.py)."""
        if verify_checksums not in (True, False, "always"):
            raise ValueError(f"verify_checksums must be True, False or 'always', got {verify_checksums!r}")
        self.subsample, self.transform, self.split = check_subsample(subsample), as_transform(transform), None
        location = parse_location(input_dir)
        self.cache = None
        self.foreign = None  # a LitData / MDS folder read in place (shards/interop/)
        if location.is_remote:
            from llm.data.shards.format.remote import load_manifest, open_cache

            self.input_dir: Path | str = location.url()
            self.manifest, objects = load_manifest(location, storage_options)
            self.cache = open_cache(location, self.manifest, objects, cache_dir, max_cache_size)
        else:
            self.input_dir = location.local_path()
            self.foreign = open_foreign(self.input_dir)
            self.manifest = self.foreign.manifest if self.foreign else Manifest.load(self.input_dir)
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
            self.reader = (self.foreign.item_reader(verify_checksums) if self.foreign else
                           ItemReader(self.input_dir, self.manifest, verify_checksums, self._remote_files(verify_checksums)))
            self.num_samples = self.reader.total
        block = self.block_size if self.manifest.kind == "tokens" else None
        self.sample_starts = shard_sample_starts(self.reader.starts, block, self.num_samples)
        self.view: SampleView | ComposedView | None = None
        view = subsample_view(self.sample_starts, self.subsample, f"subsample:{seed}")
        if view is not None:
            self.set_view(view)
        self.shuffle_window = self._resolve_window(shuffle_window)

    def set_view(self, view: SampleView) -> None:
        """Serve only the samples of `view` (ids of this dataset's current samples): a subsample or split."""
        self.view = view if self.view is None else ComposedView(view, self.view)
        self.sample_starts, self.num_samples = view.starts, view.num_samples
        self._order = None

    def _resolve_window(self, value: int | str | None) -> int | None:
        """The window in shards that the order uses; None for a global shuffle (or none at all)."""
        shards = len(self.sample_starts) - 1  # of the subsample, when it repeats shards
        if value is None or (isinstance(value, str) and value in ("auto", "global")):
            if value == "global" or not self.shuffle or self.cache is None or self.cache.max_bytes is None:
                return None
            largest = max((s.bytes for s in self.manifest.shards), default=1)
            value = max(1, (self.cache.max_bytes // 2) // max(largest, 1))  # leaves half for prefetch and spill
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"shuffle_window must be a number of shards >= 1, 'auto', 'global' or None, got {value!r}")
        elif not self.shuffle:
            raise ValueError(f"shuffle_window={value} needs shuffle=True; drop shuffle_window or pass shuffle=True")
        return None if value >= shards else int(value)  # a window of every shard is the global shuffle

    def _remote_files(self, verify: bool) -> Any:
        if self.cache is None:
            return None
        from llm.data.shards.format.remote import RemoteShardBytes

        return RemoteShardBytes(self.cache, self.manifest, verify)

    def _default_loader(self) -> TokensLoader | ItemsLoader:
        if self.manifest.kind == "items":
            return ItemsLoader()
        raise ValueError(f"{self.input_dir} holds tokens: pass item_loader=TokensLoader(block_size=...)")

    def _init_tokens(self, verify: bool) -> None:
        block = self.item_loader.block_size
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"TokensLoader.block_size must be a positive integer to read {self.input_dir}, got {block!r}")
        self.block_size = block
        self.reader = (self.foreign.token_reader(block, verify) if self.foreign else
                       TokenReader(self.input_dir, self.manifest, verify, self._remote_files(verify)))
        total = self.reader.total
        self.num_samples = total // block if self.drop_last else math.ceil(total / block)
        pad = self.item_loader.pad_id
        self.pad_id = pad if pad is not None else (self.manifest.eos_id or 0)
        self.token_dtype = self._token_dtype()

    def _token_dtype(self) -> np.dtype:
        """The batches' token dtype: TokensLoader.dtype, or the widest stored one; ids must fit it."""
        stored = max((np.dtype(s.dtype or self.manifest.dtype) for s in self.manifest.shards),
                     key=lambda d: d.itemsize, default=np.dtype(self.manifest.dtype))
        wanted = np.dtype(self.item_loader.dtype) if self.item_loader.dtype else stored
        vocab = (self.manifest.tokenizer or {}).get("vocab_size")
        largest = max(int(vocab) - 1 if isinstance(vocab, int) else np.iinfo(stored).max, self.pad_id)
        if largest > np.iinfo(wanted).max:
            raise ValueError(
                f"TokensLoader.dtype {wanted} cannot hold the token ids of {self.input_dir} (up to {largest}, stored as "
                f"{stored}); use torch.int64"
            )
        return wanted

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Epoch used when the dataset is iterated on its own (the loader tracks its own)."""
        self.epoch = epoch

    # ---- reading ---------------------------------------------------------------------------

    def read_blocks(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Token blocks for these sample ids (as `ds[i]`) as arrays of shape (len(ids), block_size)."""
        n, block = len(sample_ids), self.block_size
        out = {"input_ids": np.empty((n, block), dtype=self.token_dtype)}
        if self.item_loader.document_boundaries:
            out["position_ids"] = np.empty((n, block), dtype=np.int64)
        self.fill_blocks(sample_ids, out, np.arange(n))
        return out

    def fill_blocks(self, sample_ids: np.ndarray, out: dict[str, np.ndarray], dest: np.ndarray) -> None:
        """Write the blocks of these sample ids into rows `dest` of the arrays in `out`."""
        # Blocks inside one shard are gathered shard by shard (tokens, and positions when asked);
        # only the few that cross a shard boundary or hit the end are read one by one.
        tokens, positions = out["input_ids"], out.get("position_ids")
        sample_ids = self.to_base(sample_ids)  # a subsample's or split's ids -> stored blocks
        starts = np.asarray(sample_ids, dtype=np.int64) * self.block_size
        rest = self.reader.gather_blocks(starts, self.block_size, tokens, dest)
        if positions is not None:
            self.reader.gather_positions(starts, self.block_size, positions, rest, dest)
        for k in rest.tolist():
            row = int(dest[k])
            self._read_block(int(sample_ids[k]), tokens[row], None if positions is None else positions[row])

    def _read_block(self, sample: int, out: np.ndarray, positions: np.ndarray | None) -> None:
        start = sample * self.block_size
        stop = min(start + self.block_size, self.reader.total)
        self.reader.read(start, stop, out, positions)
        out[stop - start :] = self.pad_id

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
        try:
            for chunk in range(worker, len(bounds) - 1, workers):
                if it.batched:
                    yield self.read_chunk(it, order, bounds[chunk], bounds[chunk + 1])
                else:
                    self._hint(it, order, bounds[chunk], bounds[chunk + 1])
                    yield from self._samples(order(self._positions(it, bounds[chunk], bounds[chunk + 1])))
        finally:
            if self.cache is not None:
                self.reader.files.release()

    def chunk_plan(self, it: _Iteration, workers: int) -> tuple[list[int], Callable[[np.ndarray], np.ndarray]]:
        """The chunk boundaries (in batches) and the epoch's position -> sample map."""
        return chunk_bounds(len(it.schedule), workers, it.chunk_batches), self.epoch_permutation(it.epoch)

    def epoch_permutation(self, epoch: int) -> Callable[[np.ndarray], np.ndarray]:
        """Epoch position -> sample id: global or windowed shuffle (or storage order), by seed + epoch."""
        key = (epoch, self.seed, self.shuffle, self.shuffle_algorithm, self.shuffle_window)
        cached = getattr(self, "_order", None)  # a windowed order costs O(shards) to set up: keep the last
        if cached is None or cached[0] != key:
            cached = self._order = (key, epoch_order(self.num_samples, self.seed, epoch, self.shuffle,
                                                     self.shuffle_algorithm, self.shuffle_window, self.sample_starts))
        return cached[1]

    @staticmethod
    def _positions(it: _Iteration, lo: int, hi: int) -> np.ndarray:
        return np.concatenate([it.schedule.positions(k) for k in range(lo, hi)])

    def read_chunk(self, it: _Iteration, order: Callable, lo: int, hi: int) -> dict[str, Any]:
        """Batches [lo, hi) of this rank's schedule, read at once (safe to call from threads)."""
        self._hint(it, order, lo, hi)
        positions = [it.schedule.positions(k) for k in range(lo, hi)]
        sizes = np.array([len(p) for p in positions], dtype=np.int64)
        try:
            if lo >= it.profile:
                return self._chunk(order(np.concatenate(positions)), sizes, it.collate)
            info = get_worker_info()
            with recording(it.t0, f"DataLoader worker {info.id}" if info else threading.current_thread().name) as rec:
                chunk = self._chunk(order(np.concatenate(positions)), sizes, it.collate)
            return {**chunk, "trace": rec.events}
        finally:
            if self.cache is not None:  # this thread's pin: an idle reader must not hold cache room
                self.reader.files.release()

    def _hint(self, it: _Iteration, order: Callable, lo: int, hi: int) -> None:
        """Remote data: tell the cache which shards batches [lo, hi + a few chunks) read, in order."""
        if self.cache is None:
            return
        ahead = min(len(it.schedule), hi + 4 * max(hi - lo, 1))
        if ahead <= lo:
            return
        samples = self.to_base(order(self._positions(it, lo, ahead)))
        starts = self.reader.starts
        if self.manifest.kind == "tokens":
            first = samples * self.block_size
            last = np.minimum(first + self.block_size, self.reader.total) - 1
            ids = np.stack([first, last], axis=1).reshape(-1)
        else:
            ids = samples
        shards = np.searchsorted(starts, ids, side="right") - 1
        first_seen = np.ones(len(shards), dtype=bool)  # each shard once, in order of first use
        first_seen[1:] = shards[1:] != shards[:-1]
        self.cache.hint(list(dict.fromkeys(shards[first_seen].tolist())))
