"""On-the-fly text streams for `stream_lm`: records -> tokens -> blocks, with an exact per-partition cursor.

Topology: the source's partitions are fixed; consumer `rank * W + worker` (W =
DataLoader workers, at least 1) owns partitions `i % (world * W) == consumer`.
Every batch a worker yields carries the cursors of the partitions it touched;
the main-process loader applies them only when it hands the batch over, so
`state_dict()` is exact whatever the prefetching. Workers never end before the
loader stops them (a finished worker sends "done" markers), so the DataLoader
serves them strictly in turn and the next worker to serve is part of the state.
"""

from __future__ import annotations

import os
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from llm.data.text.packing import PartitionPacker, new_cursor, to_example
from llm.data.text.readers import InputError
from llm.data.text.sources import (
    SOURCE_REGISTRY,
    STRIPES,
    Partition,
    Record,
    TextSource,
    assign_partitions,
    stripe_partitions,
)
from llm.data.topology import current_topology

STATE_VERSION = 1
FINGERPRINT_MISMATCH = "stream source fingerprint mismatch"


def _encode(tokenizer: Any, texts: list[str]) -> list[np.ndarray]:
    if getattr(tokenizer, "spec", None) == "simple":  # bytes are the ids: skip the Python lists
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
    return [np.asarray(ids, dtype=np.int32) for ids in tokenizer.encode_batch(texts)]


def _chunks(records: Iterator[Record], max_records: int, max_chars: int) -> Iterator[list[Record]]:
    """Groups of records for one batched tokenizer call, bounded in count and characters."""
    chunk: list[Record] = []
    chars = 0
    for record in records:
        chunk.append(record)
        chars += len(record[0])
        if len(chunk) >= max_records or chars >= max_chars:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def owned_partitions(
    parts: list[Partition], rank: int, world_size: int, num_workers: int
) -> list[Partition]:
    """Every partition that one of this rank's workers owns."""
    w = max(1, num_workers)
    owned = {p.key for k in range(w) for p in assign_partitions(parts, rank * w + k, world_size * w)}
    return [p for p in parts if p.key in owned]


class StreamingTextDataset(IterableDataset):
    """Batches `{"input_ids", "labels", "_state"}` from the partitions this rank/worker owns.

    `labels` are shifted (`labels[i]` is the token after `input_ids[i]`); padding
    in the last block of a partition has label -100. `_state` carries the
    cursors and is consumed by `StreamingTextDataModule`'s loader. With
    `packed=True` both arrays travel as one int32 byte string `_packed`
    (B, 2, max_seq_len): 3x faster through DataLoader workers than two tensors.
    """

    def __init__(
        self,
        source: TextSource,
        tokenizer: Any,
        max_seq_len: int,
        batch_size: int = 1,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        cursors: dict[str, dict] | None = None,
        worker_rotation: int = 0,
        chunk_records: int = 64,
        chunk_chars: int = 1 << 20,
        packed: bool = False,
    ):
        self.source = source
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.cursors = dict(cursors or {})
        self.worker_rotation = worker_rotation
        self.chunk_records, self.chunk_chars = chunk_records, chunk_chars
        self.packed = packed

    def __iter__(self) -> Iterator[dict]:
        rank, world = current_topology(self.rank, self.world_size)
        info = get_worker_info()
        n_workers = info.num_workers if info else 1
        worker = ((info.id if info else 0) + self.worker_rotation) % n_workers
        begin = getattr(self.source, "begin", None)
        if begin is not None:
            begin()
        parts = assign_partitions(
            stripe_partitions(self.source.partitions()), rank * n_workers + worker, world * n_workers
        )
        try:
            yield from self._batches(parts, worker)
        except InputError as e:
            if info is None:
                raise
            # the DataLoader would wrap it in a worker traceback: send the one-sentence message
            yield {"_state": {"worker": worker, "done": True, "cursors": {}, "digests": b"", "error": str(e)}}
        while info is not None:  # keep the DataLoader's round robin intact until it stops us
            yield {"_state": {"worker": worker, "done": True, "cursors": {}, "digests": b""}}

    def _batches(self, parts: list[Partition], worker: int) -> Iterator[dict]:
        L, eos = self.max_seq_len, self.tokenizer.eos_id
        rows: list[np.ndarray] = []
        touched: dict[str, tuple[PartitionPacker, deque]] = {}

        def state(done: bool) -> dict:
            cursors, digests = {}, []
            for key, (packer, queue) in touched.items():
                cursor = packer.cursor()
                cursors[key] = cursor
                while queue and queue[0][0] <= cursor["records"]:
                    digests.append(queue.popleft()[1])
            return {"worker": worker, "done": done, "cursors": cursors, "digests": b"".join(digests)}

        def batch() -> dict:
            pairs = [to_example(w, L, eos) for w in rows]
            rows.clear()
            input_ids, labels = np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])
            out: dict[str, Any] = {"_state": state(False)}
            if self.packed:  # int32 bytes: pickled through the worker pipe, cheaper than tensors in shm
                out["_packed"] = np.stack([input_ids, labels], axis=1).astype(np.int32).tobytes()
            else:
                out["input_ids"], out["labels"] = torch.from_numpy(input_ids), torch.from_numpy(labels)
            for key in [k for k, (p, _) in touched.items() if p.done]:
                del touched[key]
            return out

        for group in _groups(parts):
            live: list[tuple[Partition, PartitionPacker, deque]] = []
            for part in group:
                cursor = self.cursors.get(part.key)
                if cursor is not None and cursor.get("done"):
                    continue
                live.append((part, PartitionPacker(L, eos, cursor), deque()))
                touched[part.key] = live[-1][1:]  # type: ignore[assignment]
            if not live:
                continue
            # stripes of one base are read together: one pass over the base serves them all
            route = _router(live)
            start = min(packer.offset for _, packer, _ in live)
            base = live[0][0]
            if base.base is not None:
                base = replace(base, key=base.base, stripe=None, stripes=1, base=None)
            records = self.source.iter_partition(base, start, lambda row, r=route: r(row) is not None)
            mine = (r for r in records if route(r[1]) is not None)  # sources may ignore `want`
            for chunk in _chunks(mine, self.chunk_records, self.chunk_chars):
                for (_, after, digest), ids in zip(chunk, _encode(self.tokenizer, [r[0] for r in chunk])):
                    packer, queue = route(after)  # type: ignore[misc]
                    if digest is not None:
                        queue.append((packer.records + 1, digest))
                    for window in packer.feed(ids, after):
                        rows.append(window)
                        if len(rows) == self.batch_size:
                            yield batch()
            for _, packer, _ in live:
                for window in packer.finish():
                    rows.append(window)
                    if len(rows) == self.batch_size:
                        yield batch()
        if rows:
            yield batch()
        yield {"_state": state(True)}


def _groups(parts: list[Partition]) -> list[list[Partition]]:
    """Owned partitions grouped by base (stripes of one file / shard together), in order."""
    groups: dict[str, list[Partition]] = {}
    for p in parts:
        groups.setdefault(p.group, []).append(p)
    return list(groups.values())


def _router(live: list[tuple[Partition, PartitionPacker, deque]]):
    """row -> (packer, digest queue) of the live partition that owns that row, or None."""
    if live[0][0].stripe is None:
        only = live[0][1:]
        return lambda row: only
    stripes = live[0][0].stripes
    # a stripe resumes after its own cursor: rows up to it were consumed already
    table = {p.stripe: (packer.offset, (packer, queue)) for p, packer, queue in live}

    def route(row: int):
        hit = table.get((row - 1) % stripes)
        return hit[1] if hit is not None and row > hit[0] else None

    return route


def merge_stream_states(states: Iterable[dict]) -> dict:
    """One state from the states of several ranks (each holds the cursors of its own partitions)."""
    states = list(states)
    merged = {**states[0], "partitions": {}, "line_index": {}, "next_worker": {}}
    for s in states:
        merged["partitions"].update(s["partitions"])
        merged["line_index"].update(s["line_index"])
        merged["next_worker"].update(s["next_worker"])
    return merged


class StreamingTextLoader:
    """What `train_dataloader()` returns: one epoch of batches; the module holds the exact state."""

    def __init__(self, module: StreamingTextDataModule):
        self.module = module

    def __len__(self) -> int:
        return self.module.steps_per_epoch or 0

    def __iter__(self) -> Iterator[dict]:
        return self.module._iterate()


class _ValLoader:
    """Re-iterable validation batches (the whole validation set, every rank alike)."""

    def __init__(self, ds: StreamingTextDataset):
        self.ds = ds

    def __iter__(self) -> Iterator[dict]:
        for item in self.ds:
            if "input_ids" in item:
                yield {"input_ids": item["input_ids"], "labels": item["labels"]}


class StreamingTextDataModule:
    """Config -> source, tokenizer, dataset and loader, with `state_dict()` / `load_state_dict()`.

    `train_dataloader()` yields `steps_per_epoch` batches per epoch, continuing the
    stream where the previous epoch stopped; when this rank's partitions are all
    read it starts a new pass over them (`loop=False`: stop instead).
    """

    def __init__(
        self,
        config: Any,
        batch_size: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        steps_per_epoch: int | None = None,
        loop: bool = True,
        source: TextSource | None = None,
        tokenizer: Any = None,
    ):
        from llm.data.tokenizers import load_tokenizer

        self.config = config
        self.batch_size = batch_size
        self.steps_per_epoch = steps_per_epoch or config.steps_per_epoch
        if self.steps_per_epoch is None and loop:
            raise ValueError(
                "steps_per_epoch is required for streaming data; set data.steps_per_epoch "
                "(or --steps-per-epoch) to the number of batches in one epoch"
            )
        self.loop = loop
        self.rank, self.world_size = rank, world_size
        self.num_workers = int(getattr(config, "num_workers", 0) or 0)
        self.source = source if source is not None else SOURCE_REGISTRY.build(config)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer_spec())
        self.max_seq_len = int(config.max_seq_len)
        self._cursors: dict[str, dict] = {}
        self._next_worker: dict[str, int] = {}
        self._last_key: str | None = None
        self._uncommitted: list[bytes] = []
        self._parts: list[Partition] | None = None

    merge_states = staticmethod(merge_stream_states)

    # -- identity -------------------------------------------------------------------------
    def source_fingerprint(self) -> dict:
        """The source's fingerprint plus the tokenizer and block length: all that shapes the stream."""
        return {
            **self.source.source_fingerprint(),
            "tokenizer": self.tokenizer.fingerprint(),
            "max_seq_len": self.max_seq_len,
            "stripes": STRIPES,
        }

    def partitions(self) -> list[Partition]:
        """The stream's fixed partitions: byte ranges whole, row-offset partitions in stripes."""
        if self._parts is None:
            self._parts = stripe_partitions(self.source.partitions())
        return self._parts

    def _own(self) -> list[Partition]:
        rank, world = current_topology(self.rank, self.world_size)
        return owned_partitions(self.partitions(), rank, world, self.num_workers)

    # -- iteration ------------------------------------------------------------------------
    def train_dataloader(self) -> StreamingTextLoader:
        """An iterable over `{"input_ids", "labels"}` int64 batches of shape (batch, max_seq_len)."""
        return StreamingTextLoader(self)

    def val_dataloader(self) -> Iterable[dict] | None:
        """One pass over `val_dataset_path` (local files, same tokenizer and blocks); None when unset."""
        path = getattr(self.config, "val_dataset_path", None)
        if not path:
            return None
        from llm.data.text.sources import LocalLineTextSource

        ds = StreamingTextDataset(
            LocalLineTextSource(path, self.config.text_column), self.tokenizer, self.max_seq_len,
            self.batch_size, rank=0, world_size=1,
        )
        return _ValLoader(ds)

    def _iterate(self) -> Iterator[dict]:
        rank, world = current_topology(self.rank, self.world_size)
        own = self._own()
        if not own:
            raise ValueError(
                f"rank {rank} of {world} owns none of the {len(self.partitions())} partitions of the "
                f"data source; use more input files / shards or fewer ranks"
            )
        limit = self.steps_per_epoch
        steps, passes_without_data = 0, 0
        while limit is None or steps < limit:
            if all(self._cursors.get(p.key, {}).get("done") for p in own):
                if not self.loop or passes_without_data:
                    return
                for p in own:  # a new pass over this rank's partitions
                    self._cursors[p.key] = new_cursor() | {"pass": self._cursors[p.key].get("pass", 0) + 1}
            before = steps
            for item in self._one_pass(rank, world):
                steps += 1
                yield item
                if limit is not None and steps >= limit:
                    return
            passes_without_data = int(steps == before)
            if not self.loop:
                return

    def _one_pass(self, rank: int, world: int) -> Iterator[dict]:
        workers = max(1, self.num_workers)
        key = str(rank)
        ds = StreamingTextDataset(
            self.source, self.tokenizer, self.max_seq_len, self.batch_size,
            rank=rank, world_size=world, cursors=self._cursors,
            worker_rotation=self._next_worker.get(key, 0), packed=self.num_workers > 0,
        )
        if self.num_workers:
            # each worker tokenizes on its own core; the Rust thread pool would only oversubscribe
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        loader = DataLoader(ds, batch_size=None, num_workers=self.num_workers)
        done: set[int] = set()
        for item in loader:
            st = item.pop("_state")
            if st.get("error"):
                raise InputError(st["error"])
            self._apply(st)
            self._next_worker[key] = (st["worker"] + 1) % workers
            if st["done"]:
                done.add(st["worker"])
                if len(done) == workers:
                    return
                continue
            if "_packed" in item:
                both = torch.from_numpy(np.frombuffer(item.pop("_packed"), dtype=np.int32).copy())
                both = both.view(-1, 2, self.max_seq_len).long()
                item["input_ids"], item["labels"] = both[:, 0].contiguous(), both[:, 1].contiguous()
            yield item

    def _apply(self, st: dict) -> None:
        for k, cursor in st["cursors"].items():
            prev = self._cursors.get(k, {})
            self._cursors[k] = cursor | {"pass": prev.get("pass", 0)}
            self._last_key = k
        if st["digests"]:
            self.source.mark_consumed(st["digests"])  # type: ignore[attr-defined]
            self._uncommitted.append(st["digests"])

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's state: the cursors of its partitions. A pure getter (no I/O, no collective).

        With a dedup source, `seen_hashes.count` is what the seen-hashes file holds and
        `pending` how many consumed records are not committed to it yet: call
        `checkpoint_state()` when a checkpoint is written, so they are.
        """
        rank, world = current_topology(self.rank, self.world_size)
        own = {p.key for p in self._own()}
        partitions = {k: c for k, c in self._cursors.items() if k in own}
        records = sum(c["records"] for c in partitions.values())
        last = self._cursors.get(self._last_key or "", {})
        state = {
            "version": STATE_VERSION,
            "fingerprint": self.source_fingerprint(),
            "world_size": world,
            "num_workers": self.num_workers,
            "partitions": partitions,
            "next_worker": {str(rank): self._next_worker.get(str(rank), 0)},
            # the guide's view, informational: records consumed per rank (a record count, not a
            # line number) and the buffer of the partition read last; `partitions` is what resumes
            "line_index": {str(rank): records},
            "token_buffer": list(last.get("token_buffer", [])),
        }
        if hasattr(self.source, "commit"):
            writes = self.source.seen_hashes_path and self.source.write_seen_hashes  # type: ignore[attr-defined]
            pending = sum(len(d) for d in self._uncommitted) // 16 if writes else 0
            state["seen_hashes"] = {
                "path": str(self.source.seen_hashes_path or ""),  # type: ignore[attr-defined]
                "count": self.source.committed_count,  # type: ignore[attr-defined]
                "pending": pending,
            }
        return state

    def checkpoint_state(self) -> dict:
        """The state to store in a checkpoint: every rank's cursors, the dedup seen-set committed.

        Collective under torch.distributed (every rank calls it, each gets the whole job's
        state). Appends the digests of the records consumed since the last call to the
        seen-hashes file (rank 0 writes), so the state and the file agree.
        """
        rank, world = current_topology(self.rank, self.world_size)
        state = self.state_dict()
        digests = b"".join(self._uncommitted)
        self._uncommitted = []
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        collective = distributed and self.rank is None
        if collective:
            gathered: list[Any] = [None] * world
            torch.distributed.all_gather_object(gathered, (state, digests))
            state = merge_stream_states([s for s, _ in gathered])
            state["token_buffer"] = gathered[0][0]["token_buffer"]
            others = b"".join(d for r, (_, d) in enumerate(gathered) if r != rank)
            if others:
                self.source.mark_consumed(others)  # type: ignore[attr-defined]
            digests = b"".join(d for _, d in gathered)
        if hasattr(self.source, "commit"):
            count = self.source.commit(digests) if rank == 0 else 0  # type: ignore[attr-defined]
            if collective:
                box = [count]
                torch.distributed.broadcast_object_list(box, src=0)
                count = box[0]
            state["seen_hashes"] = {**state["seen_hashes"], "count": count, "pending": 0}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state`: exactly on the same topology, by reassigning partitions on another."""
        expected, actual = self.source_fingerprint(), state.get("fingerprint")
        if expected != actual:
            raise ValueError(
                f"{FINGERPRINT_MISMATCH}: expected {expected} (this run's data settings), "
                f"actual {actual} (the state being loaded); resume with the data settings it was saved with"
            )
        if "partitions" not in state:
            raise ValueError("data state has no 'partitions' cursors; it was not saved by StreamingTextDataModule")
        self._cursors = {k: dict(c) for k, c in state["partitions"].items()}
        _, world = current_topology(self.rank, self.world_size)
        same = state.get("world_size") == world and state.get("num_workers") == self.num_workers
        self._next_worker = dict(state.get("next_worker", {})) if same else {}
        self._uncommitted = []
        seen = state.get("seen_hashes")
        if seen and seen.get("pending"):
            warnings.warn(
                f"the data state was taken with state_dict(), not checkpoint_state(): {seen['pending']} "
                "consumed records were never committed to the seen-hashes file, so later copies of "
                "them are not dropped; save states for checkpoints with checkpoint_state()",
                stacklevel=2,
            )
        if seen and hasattr(self.source, "load_committed"):
            # a state saved without a seen-hashes file says nothing about this run's file: keep it whole
            self.source.load_committed(seen["count"] if seen.get("path") else None)  # type: ignore[attr-defined]
