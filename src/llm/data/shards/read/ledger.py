"""The shard loader's side of the run ledger: rows as the workers read them, and audit's checks against the data.

A worker that reads a chunk for a loader with a ledger also returns each row's sample id and
the 32-bit checksum of its tokens (`chunk_identities`), computed from the very arrays it hands over; the
loader turns them into ledger rows as it hands each batch to the caller (`LoaderLedger`). The
audit side rebuilds each source from the ledger header (`ShardAuditor`): the first `count`
samples of an epoch's order, and the checksums of the samples as stored now.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np

from llm.data.ledger.format import PIECE, ROW, Chunks, Columns, RunIndex, Runs
from llm.data.ledger.writer import StageLedger
from llm.data.skip_documents import SKIPPED


class ChunkIds:
    """What a worker adds to a chunk for the ledger: the positions and sample ids it read, the rows' checksums and
    the chunk's batch sizes. One object, not arrays in the chunk's dict: torch's `default_convert` turns every array
    there into a tensor, which the loader would only turn back (the chunk's own `sizes` is one: turning it back cost
    ~17 us a chunk, most of the loader's per-chunk ledger work; bench/ledger.py). A plain class with slots: made
    once a chunk, in a reader thread, where a frozen dataclass's checks cost more than the rest."""

    __slots__ = ("positions", "samples", "crcs", "sizes")

    def __init__(self, positions: np.ndarray, samples: np.ndarray, crcs: np.ndarray, sizes: np.ndarray):
        self.positions, self.samples, self.crcs, self.sizes = positions, samples, crcs, sizes


def chunk_identities(chunk: dict[str, Any], positions: np.ndarray, samples: np.ndarray) -> dict[str, ChunkIds]:
    """The chunk's `ChunkIds` under "ledger": its checksums are those its read took on the rows as stored
    (`read_checksummed`: `ledger_crc`, popped here; a chunk of items has none: zeros)."""
    crcs = chunk.pop("ledger_crc", None)
    return {"ledger": ChunkIds(np.asarray(positions, np.int64), np.asarray(samples, np.int64),
                               np.zeros(len(samples), np.uint32) if crcs is None else np.asarray(crcs),
                               np.asarray(chunk["sizes"], np.int64))}


def run_id(fingerprint: str, seed: int, folder: str | os.PathLike) -> str:
    """A fresh run's id that every rank computes alike (a second fresh run in one folder is refused anyway)."""
    key = f"{fingerprint}:{seed}:{os.path.abspath(folder)}".encode()
    return hashlib.blake2b(key, digest_size=8).hexdigest()


class LoaderLedger(StageLedger):
    """Records the batches one rank's loader hands over; opened lazily so a `load_state_dict` comes first.

    Per chunk the loader adds the worker's arrays once (`add_chunk`); per batch handed over it only counts
    `step` (one attribute increment); the chunk's rows up to the last batch counted become ledger rows in one
    go when the checkpoint commits (bench/ledger.py measures what that costs).
    """

    def __init__(self, folder: str | os.PathLike, sources: list[dict[str, Any]], run: str):
        super().__init__(folder, sources, run)
        self.writer.compress = False  # random checksums and shuffled (or run-coded) ids: nothing zstd can shrink
        self.block = 0
        # [first step, rows per batch, ids, crcs, source, epoch]: a chunk's batches get steps first, first + 1, ...
        self._chunks: list[list[Any]] = []
        self._losses: dict[int, np.ndarray] = {}
        self._skipped: list[int] = []
        self._gone: dict[int, np.ndarray] = {}  # step -> (source, epoch, sample) rows of blocks skipped by id
        self._gone_carry: list[np.ndarray] = []  # skipped blocks of batches left with no row, for the next row

    def add_chunk(self, ids: np.ndarray, crcs: np.ndarray, source: np.ndarray, epoch: np.ndarray,
                  sizes: np.ndarray, block: int, gone: tuple[np.ndarray, ...] | None = None) -> None:
        """A chunk whose batches are about to be handed over, each counted by `step += 1` as it goes; `gone`:
        (source, epoch, sample, batch of the chunk) of the blocks skipped by id that its batches lack."""
        self._close_last()  # a chunk left before its end (a new iterator): only the batches counted stay
        if self._gone:  # its uncounted batches' skipped blocks too
            self._gone = {s: g for s, g in self._gone.items() if s <= self.step}
        self.block = block
        self._chunks.append([self.step + 1, np.asarray(sizes, np.int64), ids, crcs, source, epoch])
        if gone is not None:
            table = np.stack([np.asarray(a, np.int64) for a in gone[:3]], axis=1)
            for k in np.unique(gone[3]).tolist():
                self._gone[self.step + 1 + int(k)] = table[np.asarray(gone[3]) == k]

    def _close_last(self) -> None:
        if self._chunks:
            first, sizes, *arrays = self._chunks[-1]
            handed = max(0, min(len(sizes), self.step - first + 1))
            if handed < len(sizes):
                n = int(sizes[:handed].sum())
                self._chunks[-1] = [first, sizes[:handed], *(a[:n] for a in arrays)]

    def record(self, ids: np.ndarray, crcs: np.ndarray, source: np.ndarray, epoch: np.ndarray, block: int,
               gone: tuple[np.ndarray, ...] | None = None) -> None:
        """One batch handed to the caller, on its own (the loader adds whole chunks: `add_chunk`)."""
        self.add_chunk(ids, crcs, source, epoch, np.array([len(ids)]), block,
                       None if gone is None else (*gone, np.zeros(len(gone[0]), np.int64)))
        self.step += 1

    def set_loss(self, losses: np.ndarray) -> None:
        """Per-row losses of the batch handed over last (the one just trained)."""
        if self._chunks and self.step >= self._chunks[0][0]:
            self._losses[self.step] = np.asarray(losses, np.float32).reshape(-1)

    def skip(self) -> None:
        """The batch handed over last was read but not trained (data.skip_batches)."""
        if self._chunks and self.step >= self._chunks[0][0]:
            self._skipped.append(self.step)

    def _flush(self) -> None:
        """The batches handed over since the last commit as ledger rows, built at once; a chunk's batches
        not handed over yet stay for the next commit."""
        if not self._chunks:
            return
        last = self._chunks[-1]
        kept = [last[0] + len(last[1]), last[1][:0], *(a[:0] for a in last[2:])]
        handed = max(0, min(len(last[1]), self.step - last[0] + 1))
        if handed < len(last[1]):  # the chunk being handed over: its later batches wait for the next commit
            n = int(last[1][:handed].sum())
            kept = [last[0] + handed, last[1][handed:], *(a[n:] for a in last[2:])]
            self._chunks[-1] = [last[0], last[1][:handed], *(a[:n] for a in last[2:])]
        chunks, self._chunks = self._chunks, ([kept] if len(kept[1]) else [])
        sizes = np.concatenate([c[1] for c in chunks])
        counts = np.array([len(c[1]) for c in chunks])  # each chunk's batches: steps first, first + 1, ...
        steps = np.arange(len(sizes)) + np.repeat(np.array([c[0] for c in chunks]) - (np.cumsum(counts) - counts), counts)
        n = int(sizes.sum())
        if n:  # the ids and checksums stay one array per chunk: the segment stores them without joining them first
            self._write(steps, sizes, n, Chunks([c[2] for c in chunks]), Chunks([c[3] for c in chunks]),
                        *(_joined([c[k] for c in chunks]) for k in range(4, 6)))
        else:  # only batches left with no rows: their skipped blocks wait for the next row
            self._gone_carry += [self._gone.pop(s) for s in steps.tolist() if s in self._gone]
        self._losses, self._skipped = {}, []

    def _write(self, steps: np.ndarray, sizes: np.ndarray, n: int, ids: Chunks, crcs: Chunks, source: Any,
               epoch: Any) -> None:
        # as columns (format.Columns): a batch's step and each row's place in it as runs, the constant columns as
        # one value each; only the ids, checksums, sources and epochs are arrays (bench/ledger.py: the commit)
        runs = Runs(steps.astype(np.uint64), sizes)
        rows = Columns(ROW, n, {"step": runs, "row": RunIndex("step"), "crc": crcs, "loss": np.float32(np.nan)})
        if self._losses or self._skipped:  # a step's place among the rows: only for the steps that need it
            starts = np.cumsum(sizes) - sizes
            at = {step: (start, size) for step, start, size in zip(steps.tolist(), starts.tolist(), sizes.tolist())}
        if self._losses:  # only steps whose loss was set (checkpoint.ledger_loss)
            loss = np.full(n, np.nan, np.float32)
            for step, losses in self._losses.items():
                start, size = at.get(step, (0, len(losses) + 1))
                if len(losses) >= size:
                    loss[start:start + size] = losses[:size]
            rows["loss"] = loss
        pieces = Columns(PIECE, n, {"row_ref": range(0, n), "source": source, "epoch": epoch, "name": -1,
                                    "item": ids, "start": 0, "end": self.block})
        self.writer.record_many(rows, self._with_gone(steps, sizes, pieces), owned=True)
        for step in self._skipped:
            if at.get(step, (0, 0))[1]:  # a batch left with no rows (skip_documents) has no step in the segment
                self.writer.mark_skipped(step)

    def _with_gone(self, steps: np.ndarray, sizes: np.ndarray, pieces: Columns) -> Columns | np.ndarray:
        """The pieces plus one SKIPPED piece per block skipped by id, on its batch's first row (a batch left with no
        row: the next batch's, else the last row of this commit), so it is committed with the cursor past it."""
        if not self._gone and not self._gone_carry:  # no block skipped by id: the columns as they are
            return pieces
        extra, rows = [], int(sizes.sum())
        starts = np.cumsum(sizes) - sizes
        for step, at, size in zip(steps.tolist(), starts.tolist(), sizes.tolist()):
            if step in self._gone:
                self._gone_carry.append(self._gone.pop(step))
            if size and self._gone_carry:
                extra.append((at, np.concatenate(self._gone_carry)))
                self._gone_carry = []
        if self._gone_carry and rows:
            extra.append((rows - 1, np.concatenate(self._gone_carry)))
            self._gone_carry = []
        if not extra:
            return pieces
        more = np.zeros(sum(len(g) for _, g in extra), PIECE)
        more["row_ref"] = np.concatenate([np.full(len(g), at) for at, g in extra])
        gone = np.concatenate([g for _, g in extra])
        more["source"], more["epoch"], more["item"], more["name"] = gone[:, 0], gone[:, 1], gone[:, 2], -1
        more["start"] = more["end"] = SKIPPED
        return np.concatenate([pieces.materialize(), more])

    def commit(self) -> dict[str, Any]:
        if not self.opened:
            # before the first batch: the position a load brought, else none yet (None, not a run id of None,
            # which no resume could load: a fresh run starts when the state is loaded)
            return self.pending or (self.writer.state() if self.writer.run else None)
        self._flush()
        return self.writer.commit()


def _joined(parts: list[Any]) -> Any:
    """The chunks' parts of one column joined; one value when every part is a view of one value (ledger_rows)."""
    parts = [np.asarray(p) for p in parts]
    held = [p for p in parts if len(p)]
    if held and all(p.strides == (0,) for p in held) and len({p[0].item() for p in held}) == 1:
        return held[0][0]
    return np.concatenate(parts)


def add_chunk_rows(ledger: LoaderLedger | None, dataset: Any, chunk: dict[str, Any], epoch: int, pads_last: bool,
                   left_out: tuple[np.ndarray, ...] | None) -> LoaderLedger | None:
    """Give `ledger` a chunk's rows once (per batch handed over it then only counts a step), with the blocks
    skipped by id that each of its batches lacks (`left_out`: positions, sample ids, batch of the chunk).

    `pads_last`: the chunk's last batch is this rank's padding row (an epoch's short last global batch of fewer
    samples than ranks repeats an early sample to keep the ranks in step); its step is recorded without it, so it
    is not counted as a second training. Pops the chunk's `ledger` (`ChunkIds`) either way."""
    held = chunk.pop("ledger", None)
    if held is None or ledger is None:
        return None
    pos, ids, crcs, sizes = held.positions, held.samples, held.crcs, held.sizes
    if pads_last:
        keep = int(sizes[:-1].sum())
        pos, ids, crcs, sizes = pos[:keep], ids[:keep], crcs[:keep], np.r_[sizes[:-1], 0]
    source, source_epoch, item = dataset.ledger_rows(epoch, pos, ids)
    gone = None
    if left_out is not None and len(left_out[0]):
        gone = (*dataset.ledger_rows(epoch, left_out[0], left_out[1]), left_out[2])
    ledger.add_chunk(item, crcs, source, source_epoch, sizes, dataset.block_size or 0, gone)
    return ledger
