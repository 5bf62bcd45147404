"""Items by index: one seek through the shard's offsets table, only that record decoded.

Plain shards are read with one `pread` per record into the buffer the decoder takes, so the
process keeps none of the dataset's pages and a shard truncated under a reader is a named
error, not a SIGBUS (a mapped read with the pages handed back is faster for small items,
docs/benchmarks-more.md "Items", but a truncated file would kill the process); compressed
and cached remote shards are read through their maps, whose pages are handed back every 32 MB.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from llm.data.shards.arrays import group_rows
from llm.data.shards.format.manifest import Manifest
from llm.data.shards.format.pread import ShardChanged, ShardError
from llm.data.shards.format.reader import PageReleaser, _ShardBytes
from llm.data.shards.format.records import ItemCodec

_FAULT_AROUND_BYTES = 64 << 10  # a read through a map maps ~64 KB around it
_RELEASE_EVERY_BYTES = 32 << 20


class ItemReader:
    """Reads item i with one seek: the offsets table says where its record is; only it is decoded.

    v2 records follow the manifest's item layout (format/records.py); v1 records are pickles.
    """

    def __init__(self, folder: Path, manifest: Manifest, verify: bool = True, files: _ShardBytes | None = None):
        self.files = files if files is not None else _ShardBytes(folder, manifest, verify)
        self.folder = folder
        counts = manifest.column("items")
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.total = int(self.starts[-1])
        self.codec = ItemCodec(manifest.item_layout) if manifest.item_layout is not None else None
        self._views: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._pages = PageReleaser(_RELEASE_EVERY_BYTES)  # records read through maps (compressed, cached)

    def _shard(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(bytes, offsets) of shard i as plain arrays: slicing a np.memmap costs microseconds per call."""
        views = self._views.get(i)
        if views is None:
            info = self.files.shards[i]
            raw = self.files.raw(i).view(np.ndarray)
            views = (raw, raw[len(raw) - 8 * (info.items + 1) :].view("<u8").astype(np.int64))
            if self.files.plain(info) and self.files.keep_views:
                self._views[i] = views
                self.files.release_pages({i})  # the offsets are a copy: the table's pages need not stay
        return views

    def get(self, index: int) -> object:
        return self.get_many(np.array([index], dtype=np.int64))[0]

    def get_many(self, indices: np.ndarray) -> list:
        """The items at these indices, in order (the offsets of a whole batch looked up at once)."""
        indices = np.asarray(indices, dtype=np.int64)
        shard_of = np.searchsorted(self.starts, indices, side="right") - 1
        out: list = [None] * len(indices)
        mapped, touched = 0, set()
        pinned = self.files.pinned_descriptors  # None where shards are not read by path
        for i, rows in group_rows(np.arange(len(indices)), shard_of):
            raw, offsets = self._shard(i)
            local = indices[rows] - self.starts[i]
            starts, ends = offsets[local], offsets[local + 1]
            spans = zip(rows.tolist(), local.tolist(), starts.tolist(), ends.tolist())
            if pinned is not None and self.files.plain(self.files.shards[i]):
                with pinned([i]) as (fd,):  # plain shard: each record with one pread, no page kept
                    for row, k, a, b in spans:
                        out[row] = self._decode(i, k, self._pread(fd, i, a, b))
                continue
            for row, k, a, b in spans:
                out[row] = self._decode(i, k, raw[a:b])  # decoding copies: nothing keeps the mapped bytes
            mapped += int((ends - starts).sum()) + _FAULT_AROUND_BYTES * len(rows)
            touched.add(i)
        if mapped:
            self._release_after(mapped, touched)
        return out

    def _pread(self, fd: int, shard: int, a: int, b: int) -> bytearray:
        record = bytearray(b - a)
        if b > a and os.preadv(fd, [record], a) != b - a:
            path = self.files.path_of(shard)
            raise ShardChanged(f"shard {path} ended before byte {b} while reading an item: the file was truncated")
        return record

    def _release_after(self, mapped: int, touched: set[int]) -> None:
        due = self._pages.add(mapped, touched)
        if due:
            self.files.release_pages(due)

    def _decode(self, shard: int, local: int, record: np.ndarray | bytearray) -> object:
        if self.codec is None:
            return pickle.loads(record)
        try:
            return self.codec.decode(record if isinstance(record, bytearray) else bytearray(record))
        except Exception as e:  # a manifest whose layout does not describe these records
            raise ShardError(
                f"shard {os.path.join(self.folder, self.files.shards[shard].file)}: item {local} does not decode with "
                f"the manifest's item_layout ({type(e).__name__}: {e})"
            ) from None

    def verify(self) -> None:
        self.files.verify_all()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_views"] = {}  # memory maps do not cross process boundaries
        state["_pages"] = PageReleaser(_RELEASE_EVERY_BYTES)
        return state
