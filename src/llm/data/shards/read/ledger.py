"""The shard loader's side of the run ledger: rows as the workers read them, and audit's checks against the data.

A worker that reads a chunk for a loader with a ledger also returns each row's sample id and
the crc32 of its tokens (`chunk_identities`), computed from the very arrays it hands over; the
loader turns them into ledger rows as it hands each batch to the caller (`LoaderLedger`). The
audit side rebuilds each source from the ledger header (`ShardAuditor`): the first `count`
samples of an epoch's order, and the checksums of the samples as stored now.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from typing import Any

import numpy as np

from llm.data.ledger.format import PIECE, ROW
from llm.data.ledger.writer import LedgerWriter


def row_crcs(tokens: np.ndarray) -> np.ndarray:
    """crc32 of each row's token ids as little-endian int64 (the same whatever dtype the shard stores)."""
    rows = np.ascontiguousarray(np.asarray(tokens), dtype="<i8").reshape(len(tokens), -1)
    return np.fromiter((zlib.crc32(r) for r in rows), dtype=np.uint32, count=len(rows))


def chunk_identities(chunk: dict[str, Any], positions: np.ndarray, samples: np.ndarray) -> dict[str, np.ndarray]:
    """What a worker adds to a chunk for the ledger: the positions and sample ids it read, the rows' checksums."""
    tokens = chunk.get("input_ids")
    crcs = row_crcs(tokens) if tokens is not None else np.zeros(len(samples), np.uint32)  # items: no checksum
    return {"ledger_pos": np.asarray(positions, np.int64), "ledger_ids": np.asarray(samples, np.int64),
            "ledger_crc": crcs}


def run_id(fingerprint: str, seed: int, folder: str | os.PathLike) -> str:
    """A fresh run's id that every rank computes alike (a second fresh run in one folder is refused anyway)."""
    key = f"{fingerprint}:{seed}:{os.path.abspath(folder)}".encode()
    return hashlib.blake2b(key, digest_size=8).hexdigest()


class LoaderLedger:
    """Records the batches one rank's loader hands over; opened lazily so a `load_state_dict` comes first."""

    def __init__(self, folder: str | os.PathLike, sources: list[dict[str, Any]], run: str):
        self.writer = LedgerWriter(folder, 0, sources)
        self.run = run
        self.pending: dict[str, Any] | None = None  # the ledger state a load_state_dict brought
        self.opened = False
        self.step = 0

    def resume_from(self, state: dict[str, Any] | None) -> None:
        self.pending, self.opened = state, False

    def open(self, rank: int, topology: dict[str, Any]) -> None:
        """Start recording as `rank` (read when iteration starts, like the loader's own rank)."""
        if not self.opened:
            self.writer.rank = rank
            self.writer.open(self.pending, topology, run=self.run if self.pending is None else None)
            self.step, self.opened = self.writer.committed_step, True

    def record(self, ids: np.ndarray, crcs: np.ndarray, source: np.ndarray, epoch: np.ndarray, block: int) -> None:
        """One batch handed to the caller: its rows, each one sample (one piece)."""
        n = len(ids)
        rows = np.zeros(n, ROW)
        rows["row"], rows["crc"], rows["loss"] = np.arange(n), crcs, np.nan
        pieces = np.zeros(n, PIECE)
        pieces["row_ref"], pieces["source"], pieces["epoch"] = np.arange(n), source, epoch
        pieces["name"], pieces["item"], pieces["end"] = -1, ids, block
        self.step += 1
        self.writer.record(self.step, rows, pieces)

    def set_loss(self, losses: np.ndarray) -> None:
        """Per-row losses of the batch handed over last (the one just trained)."""
        if self.opened and self.step > self.writer.committed_step:
            self.writer.set_loss(self.step, losses)

    def skip(self) -> None:
        """The batch handed over last was read but not trained (data.skip_batches)."""
        if self.opened and self.step > self.writer.committed_step:
            self.writer.mark_skipped(self.step)

    def commit(self) -> dict[str, Any]:
        return self.writer.commit() if self.opened else (self.pending or self.writer.state())

