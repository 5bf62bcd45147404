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

from llm.data.ledger.format import PIECE, ROW, row_checksums
from llm.data.ledger.writer import StageLedger


def chunk_identities(chunk: dict[str, Any], positions: np.ndarray, samples: np.ndarray) -> dict[str, np.ndarray]:
    """What a worker adds to a chunk for the ledger: the positions and sample ids it read, the rows' checksums."""
    tokens = chunk.get("input_ids")
    crcs = row_checksums(tokens) if tokens is not None else np.zeros(len(samples), np.uint32)  # items: no checksum
    return {"ledger_pos": np.asarray(positions, np.int64), "ledger_ids": np.asarray(samples, np.int64),
            "ledger_crc": crcs}


def run_id(fingerprint: str, seed: int, folder: str | os.PathLike) -> str:
    """A fresh run's id that every rank computes alike (a second fresh run in one folder is refused anyway)."""
    key = f"{fingerprint}:{seed}:{os.path.abspath(folder)}".encode()
    return hashlib.blake2b(key, digest_size=8).hexdigest()


class LoaderLedger(StageLedger):
    """Records the batches one rank's loader hands over; opened lazily so a `load_state_dict` comes first.

    A batch handed over costs one list append: its ids, checksums, sources and epochs are kept as the
    worker's arrays and turned into ledger rows in one go when the checkpoint commits (bench/ledger.py).
    """

    def __init__(self, folder: str | os.PathLike, sources: list[dict[str, Any]], run: str):
        super().__init__(folder, sources, run)
        self.block = 0
        self._batches: list[list[Any]] = []  # [step, ids, crcs, source, epoch, losses or None, skipped]

    def record(self, ids: np.ndarray, crcs: np.ndarray, source: np.ndarray, epoch: np.ndarray, block: int) -> None:
        """One batch handed to the caller: its rows, each one sample (one piece)."""
        self.step += 1
        self.block = block
        self._batches.append([self.step, ids, crcs, source, epoch, None, False])

    def set_loss(self, losses: np.ndarray) -> None:
        """Per-row losses of the batch handed over last (the one just trained)."""
        if self._batches and self._batches[-1][0] == self.step:
            self._batches[-1][5] = np.asarray(losses, np.float32).reshape(-1)

    def skip(self) -> None:
        """The batch handed over last was read but not trained (data.skip_batches)."""
        if self._batches and self._batches[-1][0] == self.step:
            self._batches[-1][6] = True

    def _flush(self) -> None:
        """The batches since the last commit as ledger rows, built at once."""
        batches, self._batches = self._batches, []
        if not batches:
            return
        sizes = np.array([len(b[1]) for b in batches], np.int64)
        n = int(sizes.sum())
        starts = np.cumsum(sizes) - sizes
        rows = np.zeros(n, ROW)
        rows["step"] = np.repeat(np.array([b[0] for b in batches], np.uint64), sizes)
        rows["row"] = np.arange(n) - np.repeat(starts, sizes)
        rows["crc"] = np.concatenate([b[2] for b in batches])
        rows["loss"] = np.concatenate([b[5][: len(b[1])] if b[5] is not None and len(b[5]) >= len(b[1])
                                       else np.full(len(b[1]), np.nan, np.float32) for b in batches])
        pieces = np.zeros(n, PIECE)
        pieces["row_ref"] = np.arange(n)
        pieces["source"] = np.concatenate([b[3] for b in batches])
        pieces["epoch"] = np.concatenate([b[4] for b in batches])
        pieces["name"], pieces["end"] = -1, self.block
        pieces["item"] = np.concatenate([b[1] for b in batches])
        self.writer.record_many(rows, pieces)
        for b in batches:
            if b[6]:
                self.writer.mark_skipped(int(b[0]))

    def commit(self) -> dict[str, Any]:
        if not self.opened:
            # before the first batch: the position a load brought, else none yet (None, not a run id of None,
            # which no resume could load: a fresh run starts when the state is loaded)
            return self.pending or (self.writer.state() if self.writer.run else None)
        self._flush()
        return self.writer.commit()
